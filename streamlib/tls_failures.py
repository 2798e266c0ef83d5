"""Why a connection to a server failed, in TLS words: for the clients of bookies and of
brokers, which both meet their servers over gRPC.

gRPC reports every failed connection as UNAVAILABLE with a text; only from a TLS
client's side does that text tell a TLS mismatch apart (grpcio 1.85, by experiment):

    the client, the server                  the text holds
    TLS, plaintext                          Tls handshake failed ... WRONG_VERSION_NUMBER
    TLS trusting another CA, TLS            ... CERTIFICATE_VERIFY_FAILED: unable to get
                                            local issuer certificate
    TLS, an expired certificate             ... CERTIFICATE_VERIFY_FAILED: certificate has
                                            expired
    TLS without a certificate, mutual TLS   Secure read failed (Socket closed)
    plaintext, TLS                          Socket closed   (as any server that hangs up)

A TLS server answers a plaintext client's first bytes by closing the connection, with no
alert to recognise. So in that last case, on that failure path only, a probe dials the
address once more and attempts a TLS handshake that verifies nothing (it only asks which
protocol the server speaks), bounded by PROBE_TIMEOUT_S: if it completes, the server
speaks TLS and the client does not.
"""

from __future__ import annotations

import asyncio
import re
import ssl

PROBE_TIMEOUT_S = 1.0

# "... OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired: OK"
_HANDSHAKE = re.compile(r"Tls handshake failed.*?:([A-Z][A-Z0-9_]+)(?:: (.*?))?(?:: OK)?$", re.S)


async def tls_mismatch(
    server: str, address: str, details: str, *, tls_ca: str | None, tls_cert: str | None
) -> str | None:
    """What is wrong, in a sentence naming `server` ("bookie b1", "the broker") at
    address, when details -- gRPC's text for a failed connection to it -- come of a TLS
    mismatch; None when they do not. tls_ca / tls_cert: this client's settings."""
    where = f"{server} at {address}"
    if tls_ca is None:
        if "Socket closed" not in details:
            return None
        issuer = await tls_issuer(address)
        if issuer is None:
            return None
        signed_by = f" (issuer {issuer!r})" if issuer else ""
        return (
            f"{where} speaks TLS and this client does not: connect with tls_ca=PEM, the "
            f"certificate of the CA that signed the server's{signed_by}"
        )
    handshake = _HANDSHAKE.search(details)
    if handshake is not None:
        code, reason = handshake.group(1), (handshake.group(2) or "").strip()
        if code == "WRONG_VERSION_NUMBER":
            return (
                f"{where} does not speak TLS (it answered in plaintext): connect without "
                f"tls_ca, or serve TLS there"
            )
        if code != "CERTIFICATE_VERIFY_FAILED":
            why = f"{code}: {reason}" if reason else code
        elif "expired" in reason:
            why = "its certificate has expired"
        elif "not yet valid" in reason:
            why = "its certificate is not valid yet"
        else:
            why = f"its certificate is not trusted by tls_ca={tls_ca} ({reason or code})"
        return f"TLS handshake with {where} failed: {why}"
    if "Secure read failed" in details:  # the server hung up right after the handshake
        if tls_cert is None:
            return (
                f"{where} closed the connection after the TLS handshake: it requires a "
                f"client certificate (tls_cert / tls_key) signed by a CA it trusts"
            )
        return (
            f"{where} closed the connection after the TLS handshake: it does not accept "
            f"this client's certificate (tls_cert={tls_cert})"
        )
    return None


async def tls_issuer(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Whether the server at address (HOST:PORT) speaks TLS: the common name of the
    issuer of the certificate it shows ("" when that names none), or None when no TLS
    handshake completes within timeout_s. Nothing is verified, nor sent after it."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=context)
    except ssl.SSLError as e:  # an alert is TLS too (a server that wants another version)
        return "" if "ALERT" in (e.reason or "") else None
    except (OSError, ValueError):  # (TimeoutError is an OSError)
        return None
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.transport.abort()  # no goodbye: this connection was only a question
    if not der:
        return ""
    names = x509.load_der_x509_certificate(der).issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""
