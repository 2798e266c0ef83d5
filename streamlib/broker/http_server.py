"""A small HTTP/1.1 server on asyncio streams, for the broker's Pulsar admin REST port
(pulsar_admin.py): one request per connection, answered and closed.

Hostile and broken clients are bounded, never served a traceback nor left hanging:
the request head must arrive within Limits.head_timeout_s and stay within
MAX_HEADER_BYTES / MAX_HEADERS (else 408 / 431), a body within body_timeout_s and
MAX_BODY_BYTES (else 408 / 413; Content-Length or chunked), a handler gets
handler_timeout_s, and at most max_connections connections are served at once (one
more is answered 503 and closed).
Junk that is not HTTP gets 400. TLS (an SSLContext) makes it HTTPS; the peer's
verified certificate is on the request for AccessControl, as gRPC's auth context is.

Like the bookie's metrics port (bookie/http.py) this keeps the project off a web
framework: the REST subset Pulsar tools use is small.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from bookie.auth import certificate_context
from bookie.tls import common_name

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 32 << 10  # the request line and the headers, together
MAX_HEADERS = 100
MAX_BODY_BYTES = 1 << 20
WRITE_TIMEOUT_S = 30.0
# After answering, what the client still sends is read and dropped for a while before the
# close: closing with unread input makes the kernel reset the connection, and the client
# could lose the answer (an early 413, a refused connection, a head cut short).
LINGER_S = 2.0
LINGER_BYTES = 8 << 20
TLS_HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    handler_timeout_s: float = 60.0


@dataclass
class Request:
    method: str
    target: str  # as sent: the path (percent-encoded) and the query
    headers: list[tuple[str, str]]  # names in lower case
    body: bytes = b""
    peer_cert: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.target).query))

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)

    # What AccessControl reads from a gRPC call's context, from this request: the
    # Authorization header, and the common name of the client certificate TLS verified.
    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.headers

    def auth_context(self) -> dict[str, list[bytes]]:
        return certificate_context(common_name(self.peer_cert))


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


def json_response(status: int, value: Any) -> Response:
    return Response(status, json.dumps(value).encode())


class HttpError(Exception):
    """An answer other than success: its status and {"reason": ...} (Pulsar's shape)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason

    def response(self) -> Response:
        return json_response(self.status, {"reason": self.reason})


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    def __init__(
        self,
        handler: Handler,
        ssl: ssl_module.SSLContext | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.handler = handler
        self.ssl = ssl
        self.limits = limits or Limits()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    async def bind(self, host: str, port: int) -> int:
        """Listen (not serving yet: serve()); the port bound."""
        tls: dict[str, Any] = {}
        if self.ssl is not None:
            tls = {"ssl": self.ssl, "ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT_S}
        self._server = await asyncio.start_server(
            self._connection, host, port, limit=MAX_HEADER_BYTES, start_serving=False, **tls
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def serve(self) -> None:
        assert self._server is not None, "bind first"
        await self._server.start_serving()

    async def close(self) -> None:
        """Stop listening, and end the connections being served."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            if len(self._connections) >= self.limits.max_connections:
                response = HttpError(
                    503, f"this server serves {self.limits.max_connections} connections at once: "
                    "try again later"
                ).response()  # fmt: skip
            else:
                self._connections.add(task)
                response = await self._respond(reader, writer)
            await _send(writer, response)
            await _linger(reader, writer)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await writer.wait_closed()

    async def _respond(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Response:
        try:
            async with asyncio.timeout(self.limits.head_timeout_s):
                method, target, headers = await _read_head(reader)
            request = Request(method, target, headers, peer_cert=writer.get_extra_info("peercert"))
            async with asyncio.timeout(self.limits.body_timeout_s):
                request.body = await _read_body(request, reader, writer)
        except TimeoutError:
            return HttpError(408, "the request did not arrive in time").response()
        except HttpError as error:
            return error.response()
        except (OSError, EOFError, ValueError):  # (cut short, or a line past the limit)
            return HttpError(400, "the request was cut short or malformed").response()
        deadline = asyncio.timeout(self.limits.handler_timeout_s)
        try:
            async with deadline:
                return await self.handler(request)
        except HttpError as error:
            return error.response()
        except TimeoutError as error:
            if not deadline.expired():
                raise
            return HttpError(
                500,
                f"TimeoutError: not answered within {self.limits.handler_timeout_s:g} s: {error}",
            ).response()
        except Exception as error:  # a bug: logged with its traceback, answered without
            log.error("%s %s failed", request.method, request.path, exc_info=error)
            return HttpError(500, f"{type(error).__name__}: {error}").response()


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, list[tuple[str, str]]]:
    """The request line and headers; HttpError 400 for what is not HTTP/1.x, 431 past
    the bounds."""
    size = 0

    async def line() -> bytes:
        nonlocal size
        try:
            raw = await reader.readline()
        except ValueError:  # (a line longer than the reader's limit)
            raise HttpError(431, f"request head over {MAX_HEADER_BYTES} bytes") from None
        size += len(raw)
        if size > MAX_HEADER_BYTES:
            raise HttpError(431, f"request head over {MAX_HEADER_BYTES} bytes")
        if raw and not raw.endswith(b"\n"):
            raise asyncio.IncompleteReadError(raw, None)
        return raw

    first = await line()
    parts = first.decode("latin-1").split()
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "not an HTTP/1.x request line")
    method, target, _ = parts
    if not target.startswith("/"):
        raise HttpError(400, "the request target is a path")
    headers: list[tuple[str, str]] = []
    while (raw := await line()) not in (b"\r\n", b"\n"):
        if not raw:
            raise asyncio.IncompleteReadError(raw, None)
        if len(headers) >= MAX_HEADERS:
            raise HttpError(431, f"more than {MAX_HEADERS} headers")
        name, colon, value = raw.decode("latin-1").partition(":")
        if not colon or not name.strip() or name != name.strip():
            raise HttpError(400, "a malformed header line")
        headers.append((name.lower(), value.strip()))
    return method.upper(), target, headers


async def _read_body(
    request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bytes:
    chunked = "chunked" in (request.header("transfer-encoding") or "").lower()
    length_text = request.header("content-length")
    if not chunked and length_text is None:
        return b""
    length = 0
    if not chunked:
        if not length_text or not length_text.isdigit():
            raise HttpError(400, f"a bad Content-Length: {length_text!r:.40}")
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            raise HttpError(413, f"a request body is at most {MAX_BODY_BYTES} bytes")
    if (request.header("expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if not chunked:
        return await reader.readexactly(length)
    body = bytearray()
    while True:
        size_line = (await reader.readline()).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise HttpError(400, "a malformed chunk size") from None
        if size < 0 or len(body) + size > MAX_BODY_BYTES:
            raise HttpError(413, f"a request body is at most {MAX_BODY_BYTES} bytes")
        if size == 0:
            break
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise HttpError(400, "a chunk without its CRLF")
    while (raw := await reader.readline()) not in (b"\r\n", b"\n"):  # trailers: ignored
        if not raw:
            raise asyncio.IncompleteReadError(raw, None)
    return bytes(body)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        dropped = 0
        async with asyncio.timeout(LINGER_S):
            while dropped < LINGER_BYTES and (chunk := await reader.read(1 << 16)):
                dropped += len(chunk)


async def _send(writer: asyncio.StreamWriter, response: Response) -> None:
    try:
        phrase = http.HTTPStatus(response.status).phrase
    except ValueError:
        phrase = "Unknown"
    head = [f"HTTP/1.1 {response.status} {phrase}", "Connection: close"]
    if response.status != 204:
        head += [f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}"]
    head += [f"{name}: {value}" for name, value in response.headers]
    payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
    if response.status != 204:
        payload += response.body
    with contextlib.suppress(ConnectionError, TimeoutError):
        writer.write(payload)
        async with asyncio.timeout(WRITE_TIMEOUT_S):  # (a client that does not read)
            await writer.drain()
