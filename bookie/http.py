"""The bookie's HTTP port: Prometheus metrics plus a small admin API.

    GET  /metrics                 Prometheus text format
    GET  /admin/state             JSON: bookie id, read-only, disk usage, thresholds
    POST /admin/disk-thresholds?threshold=0.95&lwm=0.90
                                  change the read-only thresholds at runtime and run
                                  the disk check at once (how tests flip read-only
                                  mode for real, without mocks); answers /admin/state
    POST /admin/gc[?force=true]   run one garbage-collection + compaction round now;
                                  answers {"deleted": [ledger ids], "trimmed": {...},
                                  "compacted": [...], "refused": null or why the round
                                  deleted nothing}; force=true skips the safety checks
                                  (server.gc_round) for a deletion known to be real

Bound to the same host as the gRPC port unless --metrics-host says otherwise. With TLS
on the bookie (--tls-cert) this port speaks HTTPS with the same certificate (and with
--tls-client-auth wants a client certificate). With authentication on, every call names
a principal as gRPC calls do (``Authorization: Bearer <token>`` or the client
certificate's common name): /admin/* needs the admin role, /metrics any role; anonymous
calls get 401, others 403. Without authentication, changes (POST) are taken only from
the bookie's own host (a loopback peer): a metrics port reachable from the network
(``--host 0.0.0.0``) must not let anyone turn the bookie read-only. A tiny HTTP/1.0
server on asyncio streams is enough here and keeps us off another dependency.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bookie.auth import AccessControl, certificate_context
from bookie.errors import RequestError, UnauthenticatedError
from bookie.ledger_rules import Access
from bookie.tls import common_name

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, str]], Awaitable[dict[str, object]]]


_MAX_HEADERS = 100


class _Caller:
    """What AccessControl reads from a call, for an HTTP request (the gRPC context's
    two methods)."""

    def __init__(
        self,
        headers: list[tuple[str, str]],
        peer_cert: dict[str, object] | None,
        peer: object = None,
    ):
        self.headers = headers
        self.peer_cert = peer_cert
        self.loopback = _is_loopback(peer)

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.headers

    def auth_context(self) -> dict[str, list[bytes]]:
        return certificate_context(common_name(self.peer_cert))


def _is_loopback(peer: object) -> bool:
    try:
        return ipaddress.ip_address(peer[0]).is_loopback  # type: ignore[index]
    except (TypeError, ValueError, IndexError):
        return False


class AdminHttpServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        routes: dict[tuple[str, str], Handler],
        *,
        access: AccessControl | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self.registry = registry
        self.routes = routes
        self.access = access
        self.ssl = ssl
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        tls: dict[str, object] = {}
        if self.ssl is not None:
            tls = {"ssl": self.ssl, "ssl_handshake_timeout": 10}
        self._server = await asyncio.start_server(self._serve, host, port, **tls)  # type: ignore[arg-type]
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            headers: list[tuple[str, str]] = []
            # One deadline for the whole request head: a client trickling header lines
            # cannot hold a connection for longer.
            async with asyncio.timeout(10):
                line = await reader.readline()
                while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    if len(headers) >= _MAX_HEADERS:
                        raise ValueError("too many headers")
                    name, _, value = raw.decode("latin-1").partition(":")
                    headers.append((name.strip().lower(), value.strip()))
            caller = _Caller(
                headers, writer.get_extra_info("peercert"), writer.get_extra_info("peername")
            )
            status, ctype, body = await self._route(line, caller)
        except (TimeoutError, ConnectionError, ValueError) as e:
            status, ctype, body = 400, "text/plain", f"bad request: {e}\n".encode()
        reason = {200: "OK", 401: "Unauthorized", 403: "Forbidden"}.get(status, "ERROR")
        head = (
            f"HTTP/1.0 {status} {reason}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode() + body)
            await writer.drain()
            writer.close()
        except ConnectionError:
            pass

    async def _route(self, line: bytes, caller: _Caller) -> tuple[int, str, bytes]:
        parts = line.decode("latin-1").split()
        if len(parts) < 2:
            return 400, "text/plain", b"bad request line\n"
        method, target = parts[0], urlsplit(parts[1])
        if (self.access is None or not self.access.enabled) and method != "GET":
            if not caller.loopback:
                return (
                    403,
                    "application/json",
                    json.dumps(
                        {
                            "error": "admin changes come only from this host while the bookie "
                            "authenticates nobody: turn on authentication (--tls-client-auth or "
                            "--auth-token-*) to call it from elsewhere"
                        }
                    ).encode(),
                )
        elif self.access is not None:
            access = Access.INFO if target.path == "/metrics" else Access.ADMIN
            try:
                self.access.authorize(caller, access)
            except RequestError as e:
                code = 401 if isinstance(e, UnauthenticatedError) else 403
                return code, "application/json", json.dumps({"error": str(e)}).encode()
        if (method, target.path) == ("GET", "/metrics"):
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        handler = self.routes.get((method, target.path))
        if handler is None:
            return 404, "text/plain", b"not found\n"
        params = {k: v[-1] for k, v in parse_qs(target.query).items()}
        try:
            result = await handler(params)
        except ValueError as e:
            return 400, "application/json", json.dumps({"error": str(e)}).encode()
        except Exception as e:  # reported to the caller; the server keeps serving
            log.error("admin %s %s failed: %s", method, target.path, e)
            return 500, "application/json", json.dumps({"error": str(e)}).encode()
        return 200, "application/json", json.dumps(result).encode()
