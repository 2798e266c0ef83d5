"""The client's add stream over a bookie's framed port (bookie.proto, FramedHello).

A gRPC bidi stream costs the client's loop ~190 us of CPU per message; a frame on an
asyncio socket about half that (scripts/floor_research). So where a bookie registers a
framed address, BookieClient opens its add stream here, behind the interface it uses
of a gRPC StreamStreamCall (``write(bytes)``, ``async for`` AddResponses, ``cancel()``):
what it does when the stream breaks, reconnects and times out is unchanged.

A hello the bookie refuses for the caller's credentials does not break the stream:
it answers each add written to it with the bookie's refusal, as the gRPC stream
refuses each batch of an unauthenticated caller, so the writer fails with the same
typed error. Any other failure to open (no connection, a TLS or version mismatch, the
bookie's connection limit) raises FramedOpenError, and the caller uses gRPC instead.

A bookie that stops answering while its connection stays open (SIGSTOP, a hung host)
is not noticed by TCP: its kernel still acknowledges the bytes, and keepalive probes.
gRPC notices it by its pings; so the stream takes a ``lost`` watch (the client's gRPC
channel to the same bookie, which it pings anyway) and ends when that says the bookie is
gone, as the gRPC stream would have.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

from google.protobuf.message import DecodeError

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
from streamlib.protocol.errors import BookieUnavailableError

# A bookie's answers are bounded by its ANSWER_MESSAGE_BYTES (1 MiB) unless one answer
# is bigger (a refusal's message per entry of a big batch): the gRPC client's limit.
MAX_MESSAGE_BYTES = 64 << 20
_REFUSALS = (pb.UNAUTHENTICATED, pb.UNAUTHORIZED)


class FramedStreamError(BookieUnavailableError):
    """The framed add stream broke (the connection ended or the bookie broke the
    framing): every add on it is unanswered, as when a gRPC stream fails."""


class FramedOpenError(BookieUnavailableError):
    """The framed add stream could not be opened; gRPC may still serve the adds."""


def client_ssl_context(
    tls_ca: str | None, tls_cert: str | None, tls_key: str | None
) -> ssl.SSLContext | None:
    """What the gRPC channel's credentials say, as an SSLContext: trust tls_ca, check
    the bookie's name, show the client certificate for mutual TLS. None: plaintext."""
    if tls_ca is None:
        return None
    ctx = ssl.create_default_context(cafile=tls_ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls_cert is not None and tls_key is not None:
        ctx.load_cert_chain(tls_cert, tls_key)
    return ctx


class FramedAddCall:
    """One open framed add stream (see the module doc)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refusal: pb.AddResult
    ) -> None:
        self._reader = reader
        self._writer = writer
        # Set when the bookie refused the hello: then nothing is sent, each add written
        # is answered with it (queued here).
        self._refusal = refusal if refusal.status else None
        self._refused: collections.deque[pb.AddResponse] = collections.deque()
        self._answered = asyncio.Event()
        self._cancelled = False
        self._watch: asyncio.Task[None] | None = None

    def _watch_for(self, lost: Callable[[], Awaitable[None]]) -> None:
        """End the stream when lost() returns (the bookie is gone)."""

        async def watch() -> None:
            await lost()
            self.cancel()

        self._watch = asyncio.get_running_loop().create_task(watch())

    @classmethod
    async def open(
        cls,
        address: str,
        token: str | None,
        ssl_context: ssl.SSLContext | None,
        keepalive: tuple[float, float] = (30.0, 10.0),
        lost: Callable[[], Awaitable[None]] | None = None,
    ) -> FramedAddCall:
        """Connect, say hello, read the answer (the caller bounds the time it takes)."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")  # an IPv6 address as registered: [v6]:port
        try:
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=ssl_context,
                server_hostname=host if ssl_context else None,
                limit=STREAM_LIMIT_BYTES,
            )
        except OSError as e:  # refused, unreachable, or the TLS handshake failed
            raise FramedOpenError(f"framed port {address}: {e}") from e
        try:
            set_keepalive(writer, *keepalive)
            hello = pb.FramedHello(version=FRAMED_VERSION, token=token or "")
            writer.write(frame(hello.SerializeToString()))
            data = await read_frame(reader, MAX_HELLO_BYTES)
            if data is None:
                raise FrameError("closed without answering the hello")
            answer = pb.FramedHelloResponse.FromString(data)
        except (OSError, FrameError, ValueError) as e:
            writer.close()
            raise FramedOpenError(f"framed port {address}: {e}") from e
        except BaseException:
            writer.close()
            raise
        if answer.status == pb.OK:
            call = cls(reader, writer, pb.AddResult())
            if lost is not None:
                call._watch_for(lost)
            return call
        writer.close()
        if answer.status in _REFUSALS:
            refusal = pb.AddResult(status=answer.status, message=answer.message)
            return cls(reader, writer, refusal)
        raise FramedOpenError(
            f"framed port {address} refused the stream: "
            f"{pb.StatusCode.Name(answer.status)} {answer.message}"
        )

    async def write(self, data: bytes) -> None:
        """Send one serialized AddRequest(Framed); waits while the bookie does not
        read (its back-pressure)."""
        if self._cancelled:
            raise FramedStreamError("the framed add stream was cancelled")
        if self._refusal is not None:
            self._refuse(data)
            return
        write_frame(self._writer, data)
        try:
            await self._writer.drain()
        except OSError as e:
            raise FramedStreamError(f"framed add stream broke: {e}") from e

    def _refuse(self, data: bytes) -> None:
        """Answer each add of a request with the hello's refusal."""
        assert self._refusal is not None
        response = pb.AddResponse()
        for entry in pb.AddRequest.FromString(data).entries:
            result = response.results.add()
            result.CopyFrom(self._refusal)
            result.ledger_id, result.entry_id = entry.ledger_id, entry.entry_id
        self._refused.append(response)
        self._answered.set()

    def __aiter__(self) -> AsyncIterator[pb.AddResponse]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[pb.AddResponse]:
        if self._refusal is not None:
            while not self._cancelled:
                await self._answered.wait()
                self._answered.clear()
                while self._refused:
                    yield self._refused.popleft()
            return
        parse = pb.AddResponse.FromString
        while True:
            try:
                data = await read_frame(self._reader, MAX_MESSAGE_BYTES)
            except (OSError, FrameError) as e:
                raise FramedStreamError(f"framed add stream broke: {e}") from e
            if data is None:  # the bookie ended the stream (it stopped)
                return
            try:
                response = parse(data)
            except DecodeError as e:
                raise FramedStreamError(f"framed add stream: a malformed answer: {e}") from e
            yield response

    def cancel(self) -> bool:
        """End the stream: the connection is closed, a pending read ends."""
        if self._cancelled:
            return False
        self._cancelled = True
        self._answered.set()
        self._writer.close()
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        return True
