"""TLS for the bookie's ports, from PEM files: gRPC credentials, and the SSLContexts of
the HTTP port and the framed add port.

The gRPC port re-reads its certificates without a restart: gRPC asks for its certificate
configuration at every new handshake (``dynamic_ssl_server_credentials``) and gets a
fresh one when a file's modification time changed (connections already open keep theirs).
The framed add port does the same through its handshake's
server-name callback (``reloading_ssl_context``). The HTTP port loads its context at start.

A server (a bookie, a broker) refuses to start with a certificate outside its validity:
every client would refuse it, each with a handshake error far from the cause. A
certificate that a reload brings in is only warned about (clients then refuse it).
"""

from __future__ import annotations

import datetime
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

CERT_OPTION = "certificate (--tls-cert)"


def read_pem(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read the TLS {what} {path}: {e.strerror}") from e


def _utc(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def check_certificate_dates(
    path: Path, what: str = CERT_OPTION, now: datetime.datetime | None = None
) -> None:
    """ValueError, naming the file and the dates (UTC), unless every certificate in the
    PEM file at path (a server's, and the intermediates after it) is valid now."""
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(read_pem(path, what))
    except ValueError as e:
        raise ValueError(f"the TLS {what} {path} holds no PEM certificate: {e}") from None
    now = now or datetime.datetime.now(datetime.UTC)
    for cert in certificates:
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        which = f"the TLS {what} {path}"
        if len(certificates) > 1:
            which += f" ({cert.subject.rfc4514_string()})"
        span = f"valid from {_utc(start)} to {_utc(end)}; now is {_utc(now)}"
        if now > end:
            raise ValueError(
                f"{which} expired at {_utc(end)} ({span}): clients refuse it; renew it"
            )
        if now < start:
            raise ValueError(
                f"{which} is not valid yet ({span}): clients refuse it; check this host's "
                f"clock, or use a certificate valid now"
            )


@dataclass
class TlsFiles:
    cert: Path
    key: Path
    ca: Path | None = None
    client_auth: bool = False

    def _stamp(self) -> tuple[float, ...]:
        paths = [self.cert, self.key] + ([self.ca] if self.ca is not None else [])
        try:
            return tuple(p.stat().st_mtime for p in paths)
        except OSError:
            return ()  # a file is being replaced: keep what we have

    def _grpc_config(self) -> grpc.ServerCertificateConfiguration:
        ca = read_pem(self.ca, "CA certificate (--tls-ca)") if self.ca is not None else None
        return grpc.ssl_server_certificate_configuration(
            [
                (
                    read_pem(self.key, "key (--tls-key)"),
                    read_pem(self.cert, CERT_OPTION),
                )
            ],
            root_certificates=ca,
        )

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Credentials that pick up new certificate files at the next handshake.
        ValueError when the certificate is not valid now (a server must not start)."""
        check_certificate_dates(self.cert)
        stamp = [self._stamp()]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            now = self._stamp()
            if not now or now == stamp[0]:
                return None  # unchanged: gRPC keeps the current configuration
            try:
                config = self._grpc_config()
            except ValueError as e:  # half-written files: try again at the next handshake
                log.warning("TLS files changed but cannot be read yet: %s", e)
                return None
            stamp[0] = now
            log.info("TLS certificate files changed: new handshakes use them")
            try:
                check_certificate_dates(self.cert)
            except ValueError as e:  # (served anyway: it is what the operator put there)
                log.warning("%s", e)
            return config

        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(),
            fetch,  # type: ignore[arg-type]  # None means "unchanged" (grpc's docs); the stubs lack it
            require_client_authentication=self.client_auth,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The HTTP port's server context (client certificates verified against ca and,
        with client_auth, required)."""
        read_pem(self.cert, CERT_OPTION)  # a clear error for a missing file
        read_pem(self.key, "key (--tls-key)")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
            if self.ca is not None:
                ctx.load_verify_locations(cafile=self.ca)
                ctx.verify_mode = ssl.CERT_REQUIRED if self.client_auth else ssl.CERT_OPTIONAL
        except ssl.SSLError as e:
            raise ValueError(f"the TLS files {self.cert}, {self.key} do not load: {e}") from e
        return ctx

    def reloading_ssl_context(self) -> ssl.SSLContext:
        """The framed add port's server context: as the gRPC port's credentials, it
        picks up new certificate files at the next handshake (the handshake's
        server-name callback swaps in a context loaded from them)."""
        check_certificate_dates(self.cert)
        first = self.ssl_context()
        stamp = [self._stamp()]
        current = [first]

        def pick(sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
            now = self._stamp()
            if now and now != stamp[0]:
                try:
                    current[0] = self.ssl_context()
                except ValueError as e:  # half-written files: try again next handshake
                    log.warning("TLS files changed but cannot be loaded yet: %s", e)
                else:
                    stamp[0] = now
                    log.info("TLS certificate files changed: new framed handshakes use them")
            if current[0] is not first:
                sslobj.context = current[0]

        first.sni_callback = pick  # type: ignore[assignment]
        return first


def peer_common_name(writer: Any) -> str | None:
    """The common name of the client certificate the TLS handshake verified, if any."""
    sslobj = writer.get_extra_info("ssl_object")
    return common_name(sslobj.getpeercert() if sslobj is not None else None)


def common_name(cert: Any) -> str | None:
    """The subject's common name of a certificate as ssl's getpeercert() gives it."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
