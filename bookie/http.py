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

Bound to the same loopback host as the gRPC port. A tiny HTTP/1.0 server on asyncio
streams is enough here and keeps us off another dependency.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, str]], Awaitable[dict[str, object]]]


class AdminHttpServer:
    def __init__(self, registry: CollectorRegistry, routes: dict[tuple[str, str], Handler]) -> None:
        self.registry = registry
        self.routes = routes
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass  # headers: nothing here needs them
            status, ctype, body = await self._route(line)
        except (TimeoutError, ConnectionError, ValueError) as e:
            status, ctype, body = 400, "text/plain", f"bad request: {e}\n".encode()
        head = (
            f"HTTP/1.0 {status} {'OK' if status == 200 else 'ERROR'}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode() + body)
            await writer.drain()
            writer.close()
        except ConnectionError:
            pass

    async def _route(self, line: bytes) -> tuple[int, str, bytes]:
        parts = line.decode("latin-1").split()
        if len(parts) < 2:
            return 400, "text/plain", b"bad request line\n"
        method, target = parts[0], urlsplit(parts[1])
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
