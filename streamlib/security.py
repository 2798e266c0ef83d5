"""The client's side of security: TLS files and tokens from arguments or the environment,
tokens made and checked, and a throwaway CA for the secure sandbox and tests.

Credentials come from arguments (programs), files or the environment -- never from a
command line, where every local user reads them in the process list:

    STREAMLIB_TLS_CA / STREAMLIB_TLS_CERT / STREAMLIB_TLS_KEY   PEM file paths
    STREAMLIB_TOKEN        a JWT           STREAMLIB_TOKEN_FILE    a file holding one

Tokens are JWTs as Pulsar's AuthenticationToken uses them: ``sub`` names the principal,
``exp`` (optional) ends them; HS256 with a shared secret key or RS256 with a key pair.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import jwt

from streamlib.errors import BadRequestError, UnauthenticatedError
from streamlib.ledger.bookie_client import BookieClientConfig

log = logging.getLogger(__name__)


def read_secret_file(path: str | Path, what: str) -> str:
    try:
        text = Path(path).read_text().strip()
    except OSError as e:
        raise BadRequestError(f"cannot read the {what} {path}: {e.strerror}") from None
    if not text:
        raise BadRequestError(f"the {what} {path} is empty")
    return text


def token_from_environment() -> str | None:
    token = os.environ.get("STREAMLIB_TOKEN") or None
    if token is None and os.environ.get("STREAMLIB_TOKEN_FILE"):
        token = read_secret_file(os.environ["STREAMLIB_TOKEN_FILE"], "token file")
    return token


def check_token(token: str, now: float | None = None) -> str:
    """The principal a token names, checked as far as a client can without the key: it
    is a JWT, names a principal and has not expired (bookies check the signature)."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError as e:
        raise UnauthenticatedError(f"the token is malformed: {e}") from None
    sub, exp = claims.get("sub"), claims.get("exp")
    if not isinstance(sub, str) or not sub:
        raise UnauthenticatedError("the token has no 'sub' claim naming its principal")
    if isinstance(exp, int | float) and (time.time() if now is None else now) >= exp:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))
        raise UnauthenticatedError(f"the token of {sub!r} expired at {when}: get a new token")
    return sub


def client_config(
    config: BookieClientConfig | None,
    *,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    token: str | None = None,
) -> BookieClientConfig:
    """config with TLS files and token: the arguments, else config's own, else the
    environment. The files are read once here, so an unreadable one fails at connect."""
    config = config or BookieClientConfig()
    files = (tls_ca, tls_cert, tls_key)
    if files == (None, None, None) and config.tls_ca is None:
        env = {k: os.environ.get(f"STREAMLIB_TLS_{k}") or None for k in ("CA", "CERT", "KEY")}
        files = (env["CA"], env["CERT"], env["KEY"])
    if files != (None, None, None):
        ca, cert, key = files
        config = dataclasses.replace(config, tls_ca=ca, tls_cert=cert, tls_key=key)
    token = token or config.token or token_from_environment()
    if token is not None:
        check_token(token)
        if config.tls_ca is None:
            log.warning(
                "a token is sent to bookies without TLS: anyone on the network path can "
                "read and replay it (pass tls_ca)"
            )
        config = dataclasses.replace(config, token=token)
    config.channel_credentials()
    return config


# -- making credentials (the secure sandbox, tests, `streamlib token`) ----------------------


def new_secret_key() -> bytes:
    """A fresh HS256 secret (base64url text, 256 bits)."""
    return secrets.token_urlsafe(32).encode()


def make_token(
    key: bytes | str, subject: str, *, expires_in_s: float | None = None, algorithm: str = "HS256"
) -> str:
    """A token for subject signed with key (the secret for HS256, the private key PEM
    for RS256)."""
    claims: dict[str, object] = {"sub": subject}
    if expires_in_s is not None:
        claims["exp"] = int(time.time() + expires_in_s)
    return jwt.encode(claims, key, algorithm=algorithm)


def write_private(path: Path, data: bytes) -> Path:
    """Write a file only its owner may read (0600), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # (an existing file keeps its mode through O_CREAT: before writing)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


@dataclass(frozen=True)
class CertFiles:
    ca: Path  # the CA certificate: what a peer trusts
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certs(
    directory: Path,
    *,
    ca_name: str = "streamlib CA",
    server_name: str = "bookie",
    client_name: str = "streamlib client",
    server_hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    valid_days: float = 1.0,
    not_before: datetime.datetime | None = None,
) -> CertFiles:
    """A fresh CA and a server and a client certificate it signs, as PEM files (keys
    0600) in directory. The server certificate names server_hosts (IP addresses or DNS
    names: the addresses clients dial); each certificate's common name is its name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=valid_days)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name(ca_name))
        .issuer_name(name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str, usage: list[x509.ObjectIdentifier], hosts: tuple[str, ...]
    ) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    # The server certificate is a client's too: a bookie's auto-recovery node dials the
    # other bookies with it (mutual TLS).
    server_cert, server_key = leaf(
        server_name,
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        server_hosts,
    )
    client_cert, client_key = leaf(client_name, [ExtendedKeyUsageOID.CLIENT_AUTH], ())
    pem = serialization.Encoding.PEM
    return CertFiles(
        ca=write_private(directory / "ca.pem", ca_cert.public_bytes(pem)),
        server_cert=write_private(directory / "server.pem", server_cert),
        server_key=write_private(directory / "server.key", server_key),
        client_cert=write_private(directory / "client.pem", client_cert),
        client_key=write_private(directory / "client.key", client_key),
    )
