"""The framed add stream: the gRPC AddStream's service over a plain (or TLS) TCP port.

Why: a gRPC bidi stream costs ~190 us of CPU per message on each side; the same
message over an asyncio socket costs ~90 us (measured, scripts/floor_research). Adds
are the hot path, so they get a port of their own, as BookKeeper keeps its v2 binary
protocol for them. Everything else stays on gRPC.

The wire (bookie.proto, FramedHello; frames in bookie/wire/framing.py): the client's
first frame is a FramedHello (version, token); the bookie authenticates it as it would
the gRPC call's metadata and answers a FramedHelloResponse, closing unless it is OK.
Then the connection IS one add stream, served by ``BookieService.AddStream`` itself
through two adapters (the requests as an async iterator, a context with ``write`` and
the caller's credentials), so back-pressure, answer merging, the fence and term
checks, the per-batch role check and the metrics are the gRPC stream's own code.

Bounds, each ending only the connection that broke it: a first frame over
MAX_HELLO_BYTES or not a FramedHello of this version (an HTTP request, junk); no hello
within ``hello_timeout_s`` (nor a TLS handshake); a frame over the gRPC port's message
limit; past ``max_connections`` open at once a new one is refused TOO_MANY_REQUESTS.
TCP keepalive finds a client that vanished without closing (gRPC pings do it there).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.message import DecodeError

from bookie.auth import AccessControl, Credentials
from bookie.errors import BadRequestError, RequestError, TooLargeError, TooManyRequestsError
from bookie.metrics import BookieMetrics
from bookie.service import BookieService, Malformed, _bad_add, _safe_parse
from bookie.tls import peer_common_name
from bookie.wire import bookie_pb2 as pb
from bookie.wire.framing import (
    FRAMED_VERSION,
    MAX_HELLO_BYTES,
    STREAM_LIMIT_BYTES,
    FrameError,
    frame,
    read_frame,
    set_keepalive,
    write_frame,
)

log = logging.getLogger(__name__)

DEFAULT_HELLO_TIMEOUT_S = 5.0


class FramedContext(Credentials):
    """What AddStream uses of a gRPC call's context, for one framed connection: write
    an answer, and the caller's credentials where AccessControl looks for them (the
    hello's token as the bearer header; the verified client certificate's name)."""

    __slots__ = ("_writer",)

    def __init__(self, writer: asyncio.StreamWriter, token: str, common_name: str | None) -> None:
        super().__init__(token, common_name)
        self._writer = writer

    async def write(self, data: bytes) -> None:
        """Send one serialized AddResponse; waits while the client does not read (the
        stream's back-pressure then stops reading its requests, as on gRPC)."""
        write_frame(self._writer, data)
        await self._writer.drain()


async def framed_requests(
    reader: asyncio.StreamReader, max_bytes: int
) -> AsyncIterator[pb.AddRequest | Malformed]:
    """The connection's AddRequests as the gRPC handler gets them: a frame that does
    not parse is a Malformed (answered BAD_REQUEST, the stream goes on); a frame over
    max_bytes raises FrameError (the connection ends)."""
    parse = _safe_parse(pb.AddRequest)
    while (data := await read_frame(reader, max_bytes)) is not None:
        yield parse(data)


class FramedAddServer:
    """The framed port: bound early (``bind``, so its port is known before the bookie
    registers), serving once the service exists (``serve``)."""

    def __init__(
        self,
        access: AccessControl,
        metrics: BookieMetrics,
        *,
        max_message_bytes: int,
        max_connections: int,
        hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S,
        keepalive_time_s: float = 30.0,
        keepalive_timeout_s: float = 10.0,
    ) -> None:
        self.access = access
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self.max_connections = max_connections
        self.hello_timeout_s = hello_timeout_s
        self.keepalive = (keepalive_time_s, keepalive_timeout_s)
        self.service: BookieService | None = None
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.Task[Any]] = set()

    async def bind(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        self._server = await asyncio.start_server(
            self._connection,
            host,
            port,
            ssl=ssl_context,
            ssl_handshake_timeout=self.hello_timeout_s if ssl_context is not None else None,
            start_serving=False,
            reuse_address=True,
            limit=STREAM_LIMIT_BYTES,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def serve(self, service: BookieService) -> None:
        assert self._server is not None, "bind first"
        self.service = service
        await self._server.start_serving()

    async def close(self) -> None:
        """Stop accepting, end every connection (its client sees the stream break, as
        when the gRPC server stops)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._open):
            task.cancel()
        for task in list(self._open):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self.service is not None
        self._open.add(task)
        self.metrics.framed_open.inc()
        try:
            set_keepalive(writer, *self.keepalive)
            if len(self._open) > self.max_connections:
                raise TooManyRequestsError(
                    f"this bookie has {self.max_connections} framed connections open "
                    f"(its --max-concurrent-rpcs): try later"
                )
            context = await self._hello(reader, writer)
            self._answer_hello(writer, pb.FramedHelloResponse(status=pb.OK))
            self.metrics.framed_connections.labels("ok").inc()
            requests = framed_requests(reader, self.max_message_bytes)
            await self.service.AddStream(requests, context)
        except RequestError as err:  # refused at the hello: say why, then close
            self.metrics.framed_connections.labels(_outcome(err)).inc()
            self._answer_hello(writer, pb.FramedHelloResponse(status=err.status, message=str(err)))
        except FrameError as err:  # past the hello: the stream cannot go on
            self.metrics.framed_connections.labels("bad_frame").inc()
            refusal = pb.AddResponse(results=[_bad_add(-1, -1, TooLargeError(str(err)))])
            writer.write(frame(refusal.SerializeToString()))
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass  # no hello in time, or the client went away: nobody to answer
        finally:
            self.metrics.framed_open.dec()
            self._open.discard(task)
            await _close(writer)

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Any:
        """Read and check the hello; the context of the add stream it opens."""
        try:
            async with asyncio.timeout(self.hello_timeout_s):
                data = await read_frame(reader, MAX_HELLO_BYTES)
        except FrameError as e:
            raise BadRequestError(f"not a framed add stream: {e}") from None
        except TimeoutError:
            self.metrics.framed_connections.labels("no_hello").inc()
            raise
        if data is None:
            raise OSError("closed before its hello")
        try:
            hello = pb.FramedHello.FromString(data)
        except DecodeError:
            raise BadRequestError("the first frame is not a FramedHello") from None
        if hello.version != FRAMED_VERSION:
            raise BadRequestError(
                f"framed protocol version {hello.version} is not this bookie's "
                f"({FRAMED_VERSION}): use the gRPC add stream"
            )
        context = FramedContext(writer, hello.token, peer_common_name(writer))
        # Authenticated here once, so a caller without credentials is told at once; the
        # roles (and a token's expiry) are checked again for every batch, as on gRPC.
        self.access.principal(context)
        return context

    @staticmethod
    def _answer_hello(writer: asyncio.StreamWriter, answer: pb.FramedHelloResponse) -> None:
        answer.version = FRAMED_VERSION
        writer.write(frame(answer.SerializeToString()))


def _outcome(err: RequestError) -> str:
    return {
        pb.UNAUTHENTICATED: "unauthenticated",
        pb.TOO_MANY_REQUESTS: "too_many",
    }.get(err.status, "bad_hello")


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close after what is written went out (bounded: a client that does not read
    cannot hold the connection open)."""
    try:
        async with asyncio.timeout(1.0):
            await writer.drain()
    except (TimeoutError, OSError):
        pass
    writer.close()
    try:
        async with asyncio.timeout(1.0):
            await writer.wait_closed()
    except (TimeoutError, OSError):
        pass
