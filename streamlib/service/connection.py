"""The way to the brokers: channels (one per broker address, shared by every producer,
consumer and reader of a client), lookups through the seed brokers, and Session -- one
producer's or consumer's call to its stream's owner, opened again whenever it breaks
(Pulsar's ConnectionHandler)."""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc

from streamlib import liveness
from streamlib.protocol.errors import (
    BadRequestError,
    BrokerUnavailableError,
    RetriesExhausted,
    TlsError,
)
from streamlib.protocol.ownership import Probe
from streamlib.retry import FIRST_CONNECT, RECONNECT
from streamlib.tasks import Waker
from streamlib.tls_failures import tls_mismatch
from streamlib.wire import broker_pb2 as pb
from streamlib.wire import broker_pb2_grpc as pb_grpc
from streamlib.wire.convert import error_from_pb, move_parts

log = logging.getLogger(__name__)
EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # (what read() gives at the end)

SCHEME = "streamlib://"
LOOKUP_TIMEOUT_S = 5.0
# A connection to a broker that does not complete its HTTP/2 handshake within this is
# given up, and the stream looked up again: a stopped owner's port accepts connections,
# and once its session is over the lookup names the next owner.
REACH_TIMEOUT_S = 1.0
OPEN_TIMEOUT_S = 60.0  # a takeover fences and recovers: it can take a while
FIRST_CONNECT_S = 30.0  # how long creating a producer / consumer tries
# Deliveries carry whole messages: a chunked one (up to 256 MiB) comes in one piece.
MAX_RECEIVE_BYTES = 300 * 1024 * 1024


def channel_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.max_send_message_length", 8 * 1024 * 1024),
        # A broker that stops answering (SIGSTOP, a partition) is noticed within seconds.
        ("grpc.keepalive_time_ms", 2_000),
        ("grpc.keepalive_timeout_ms", 2_000),
        # gRPC's own timeout for a ping's answer: 60 s unless set (the keepalive timeout
        # alone leaves a SIGSTOPped broker unnoticed for a minute).
        ("grpc.http2.ping_timeout_ms", 2_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # A broker restarted on its address is connected to again within 0.1-1 s
        # (gRPC's own backoff after a refused connection grows to 2 minutes). Not
        # grpc.min_reconnect_backoff_ms: gRPC takes it for each connect's own timeout too
        # (20 s by default), and a loaded broker then looks unreachable.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1_000),
    ]


SESSION_BYTES = 1 << 20  # parts of many handles gathered into one gRPC message up to this
OUTBOX_BYTES = 4 * 1024 * 1024  # parts not yet written: past it, writers wait


class Mux:
    """One Session call to a broker (broker.proto), carrying the calls of every producer
    and consumer of a client that broker serves: MuxCall is one of them, to its user as
    a Produce or Consume call would be. What many handles send while a write is under
    way goes in the next one, in one gRPC message; a call that breaks breaks them all
    (each looks its stream up again, and opens on the next Mux)."""

    def __init__(self, stub: pb_grpc.BrokerStub, metadata: Any) -> None:
        self._call = stub.Session(metadata=metadata)
        self._calls: dict[int, MuxCall] = {}
        self._next = 0
        self._outbox: collections.deque[tuple[int, str, Any, int]] = collections.deque()
        self._out_bytes = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self.error: BaseException | None = None
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._write_loop()), loop.create_task(self._read_loop())]

    def open(self, kind: str) -> MuxCall:
        self._next += 1
        call = MuxCall(self, self._next, kind)
        self._calls[self._next] = call
        return call

    def send(self, handle: int, kind: str, message: Any) -> None:
        if self.error is not None:
            raise _again(self.error)
        size = 8 if message is None else message.ByteSize() + 8
        self._outbox.append((handle, kind, message, size))
        self._out_bytes += size
        self._wake.set()

    async def room(self) -> None:
        while self._out_bytes > OUTBOX_BYTES and self.error is None:
            self._room.clear()
            await self._room.wait()

    def forget(self, handle: int) -> None:
        self._calls.pop(handle, None)

    async def _write_loop(self) -> None:
        try:
            while True:
                while not self._outbox:
                    self._wake.clear()
                    await self._wake.wait()
                request = pb.SessionRequest()
                self._out_bytes -= move_parts(self._outbox, request.parts, SESSION_BYTES)
                if self._out_bytes <= OUTBOX_BYTES:
                    self._room.set()
                await self._call.write(request)
        except Exception as error:
            self._broke(error)

    async def _read_loop(self) -> None:
        try:
            while True:
                response = await self._call.read()
                if response is EOF:
                    raise BrokerUnavailableError("the broker ended the session call")
                calls = self._calls
                for part in response.parts:
                    call = calls.get(part.handle)
                    if call is None:
                        continue  # (a call this client let go of)
                    which = part.WhichOneof("kind")
                    if which == "end":
                        del calls[part.handle]
                        call.ended()
                    elif which is not None:
                        call.answered(getattr(part, which))
        except Exception as error:
            self._broke(error)

    def _broke(self, error: BaseException) -> None:
        if self.error is not None:
            return
        self.error = error
        self._room.set()
        for call in self._calls.values():
            call.broke(error)
        self._calls.clear()
        self._call.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def close(self) -> None:
        self._broke(BrokerUnavailableError("the client closed"))
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # (the cancelled call's status, so that gRPC's task for it ends before the loop)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._call.code(), 1.0)


class MuxCall:
    """One handle of a Mux: write, read (EOF once the broker ended it), done_writing and
    cancel, as a gRPC stream-stream call's. kind: produce | consume."""

    def __init__(self, mux: Mux, handle: int, kind: str) -> None:
        self._mux = mux
        self.handle = handle
        self.kind = kind
        self._answers: collections.deque[Any] = collections.deque()
        self._wake = Waker()
        self._error: BaseException | None = None
        self._over = False

    async def write(self, request: Any) -> None:
        if self._error is not None:
            raise _again(self._error)
        self._mux.send(self.handle, self.kind, request)
        await self._mux.room()

    async def read(self) -> Any:
        while not self._answers:
            if self._error is not None:
                raise _again(self._error)
            if self._over:
                return EOF
            await self._wake.wait()
        return self._answers.popleft()

    async def done_writing(self) -> None:
        if self._error is None and not self._over:
            self._mux.send(self.handle, "end", None)

    def cancel(self) -> None:
        if self._error is None and not self._over:
            self._over = True
            self._mux.forget(self.handle)
            with contextlib.suppress(Exception):
                self._mux.send(self.handle, "cancel", None)
            self._wake.set()

    def answered(self, answer: Any) -> None:
        self._answers.append(answer)
        self._wake.set()

    def ended(self) -> None:
        self._over = True
        self._wake.set()

    def broke(self, error: BaseException) -> None:
        self._error = error
        self._wake.set()


def _again(error: BaseException) -> BaseException:
    """A broken call's error, anew for each of its handles (one exception object raised
    in many tasks would chain their tracebacks)."""
    if isinstance(error, grpc.aio.AioRpcError):
        return grpc.aio.AioRpcError(
            error.code(),
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            error.details(),
            error.debug_error_string(),
        )
    again = BrokerUnavailableError(f"the session call to the broker broke: {error}")
    again.__cause__ = error
    return again


async def read(call: Any) -> Any:
    """The next message of a broker's stream. (A broker that stops answering -- SIGSTOP,
    a partition -- is noticed by the channel's keepalive, which fails every call on it:
    one check per connection, however many producers and consumers share it.)

    The read runs in a task of its own: measured, a producer publishes 15-20% faster
    than when the loop that handles its receipts awaits it directly (1 producer, 1 KiB
    messages, E3/Qw3/Qa2: 19.3k against 15.5k msgs/s, median of 6). A MuxCall's answers
    are read by its Mux's task already."""
    if isinstance(call, MuxCall):
        return await call.read()
    return await asyncio.ensure_future(call.read())


def parse_service_uri(uri: str) -> list[str]:
    if not uri.startswith(SCHEME):
        raise BadRequestError(f"a service URI is {SCHEME}HOST:PORT[,HOST:PORT...]: {uri!r}")
    hosts = [h.strip() for h in uri[len(SCHEME) :].strip("/").split(",") if h.strip()]
    if not hosts or any(":" not in h for h in hosts):
        raise BadRequestError(f"a service URI is {SCHEME}HOST:PORT[,HOST:PORT...]: {uri!r}")
    return hosts


class Brokers:
    """Channels to the brokers of one service URI, and the calls any broker answers."""

    def __init__(
        self,
        uri: str,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        *,
        tls_files: tuple[str | None, str | None] = (None, None),
    ) -> None:
        self.uri = uri
        self.seeds = parse_service_uri(uri)
        self._credentials = credentials
        self._tls_ca, self._tls_cert = tls_files  # (named when TLS is why a call failed)
        #: What every call carries: the client's token, if it has one.
        self.metadata: tuple[tuple[str, str], ...] | None = (
            (("authorization", f"Bearer {token}"),) if token else None
        )
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._muxes: dict[str, Mux] = {}

    def open_call(self, address: str, kind: str) -> MuxCall:
        """A producer's (kind produce) or consumer's (consume) call to the broker at
        address: a handle of the one Session call this client holds to it (opened again
        once it broke)."""
        mux = self._muxes.get(address)
        if mux is None or mux.error is not None:
            mux = self._muxes[address] = Mux(self.stub(address), self.metadata)
        return mux.open(kind)

    def stub(self, address: str) -> pb_grpc.BrokerStub:
        channel = self._channels.get(address)
        if channel is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=channel_options())
            else:
                channel = grpc.aio.secure_channel(
                    address, self._credentials, options=channel_options()
                )
            self._channels[address] = channel
        return pb_grpc.BrokerStub(channel)

    async def reachable(self, address: str) -> None:
        """BrokerUnavailableError unless a connection to address is up within the lookup
        timeout. (A stopped broker's port still accepts TCP connections: only the
        HTTP/2 handshake shows it does not answer.) A refused connection fails at once:
        the broker's process is gone, and the next lookup finds its successor. A
        connection that is up already answers at once (its calls would have broken, the
        process gone)."""
        channel = self._channels.get(address)
        if channel is not None and channel.get_state() is grpc.ChannelConnectivity.READY:
            return
        if await liveness.probe(address) is Probe.REFUSED:
            raise BrokerUnavailableError(f"broker {address} refused the connection")
        self.stub(address)
        try:
            await asyncio.wait_for(self._channels[address].channel_ready(), REACH_TIMEOUT_S)
        except builtins.TimeoutError:
            raise BrokerUnavailableError(f"broker {address} does not answer") from None

    async def ask(self, call: Callable[[pb_grpc.BrokerStub], Any], *, once: bool = False) -> Any:
        """call(stub) on the first seed broker that answers; a broker's refusal raises
        as the error it names. once: a call that must not run twice (it changes
        something) goes to another seed only if the first could not be reached."""
        last: BaseException | None = None
        mismatches: list[str] = []  # seeds TLS kept this client from
        for address in self.seeds:
            try:
                return await call(self.stub(address))
            except grpc.aio.AioRpcError as error:
                if error.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                ):  # the broker's answer: "ErrorClass: message"
                    code, _, text = (error.details() or "BadRequestError: bad request").partition(
                        ": "
                    )
                    raise error_from_pb(pb.Error(code=code, message=text)) from None
                if once and error.code() is not grpc.StatusCode.UNAVAILABLE:
                    raise BrokerUnavailableError(
                        f"broker {address} did not answer ({error.code().name}); the call "
                        f"may or may not have been done: look before asking again"
                    ) from None
                last = error
                if error.code() is grpc.StatusCode.UNAVAILABLE:
                    mismatch = await tls_mismatch(
                        "the broker",
                        address,
                        error.details() or "",
                        tls_ca=self._tls_ca,
                        tls_cert=self._tls_cert,
                    )
                    if mismatch is not None:
                        mismatches.append(mismatch)
        if mismatches and len(mismatches) == len(self.seeds):
            raise TlsError(mismatches[0])
        raise BrokerUnavailableError(
            f"no broker of {self.uri} answered: {getattr(last, 'details', lambda: last)()}"
        )

    async def lookup_any(self) -> None:
        """Raises unless a broker answers (and accepts this client's credentials)."""
        await self.lookup_answer("")

    async def lookup_answer(self, stream: str, create: bool = False) -> pb.LookupResponse:
        """Where `stream` is served; NoSuchStreamError if it does not exist, unless
        `create` (a producer's lookup) and the cluster and this client's roles allow."""
        return await self.ask(
            lambda stub: stub.Lookup(
                pb.LookupRequest(stream=stream, create=create),
                timeout=LOOKUP_TIMEOUT_S,
                metadata=self.metadata,
            )
        )

    async def lookup(self, stream: str, create: bool = False) -> str:
        """The address of the broker serving `stream` (see lookup_answer)."""
        answer = await self.lookup_answer(stream, create)
        if answer.partitions:
            raise BadRequestError(f"stream {stream!r} is partitioned: use its partitions")
        return str(answer.address)

    async def close(self) -> None:
        for mux in self._muxes.values():
            await mux.close()
        self._muxes.clear()
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()


class Session:
    """One producer's or consumer's bidirectional call to its stream's owner: looked up,
    opened, and opened again whenever it breaks for a reason another lookup may cure
    (bounded backoff). Subclasses say what a session does (session) and what a
    permanent failure does (fail)."""

    creates_stream = False  # (a producer's lookup creates its stream: see lookup_answer)

    def __init__(self, brokers: Brokers, stream: str) -> None:
        self.brokers = brokers
        self.stream = stream
        self.closed = False
        self.ready = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self.reconnects = 0
        self.connected = False  # the last attempt got as far as the broker's Ready
        self.live_call: Any = None  # the call of the session that is up, if one is
        self._over = asyncio.Event()  # set when that session ends
        # The owner a lookup just named (the client's, for the stream's partitions): the
        # first connection dials it without looking the stream up again. Any later one,
        # or a first one that fails, looks it up.
        self.first_address: str | None = None

    async def start(self) -> None:
        """The first connection (its refusal raises here)."""
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self.ready

    async def _run(self) -> None:
        """Connect, and connect again whenever the connection breaks for a reason another
        lookup may cure (the error's class says: streamlib/retry.py). The first
        connection gives up after FIRST_CONNECT_S (its error is create_producer's /
        subscribe's); later ones try until closed, as Pulsar's clients do, the pauses
        starting over after each connection that came up."""
        policy = FIRST_CONNECT.replace(stop_after_s=FIRST_CONNECT_S)
        while not self.closed:
            try:
                await policy.run(f"stream {self.stream!r}: connecting", self._connect_once,
                                 on_retry=self._broke)  # fmt: skip
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if self.ready.done():
                    self.fail(error)
                    return
                # (create_producer / subscribe raise the refusal itself, or the last error)
                last = error.last_error if isinstance(error, RetriesExhausted) else None
                self.ready.set_exception(last or error)
                self.closed = True
                return
            policy = RECONNECT  # it was up and broke

    async def _connect_once(self) -> None:
        self.connected = False
        address, self.first_address = self.first_address, None
        if not address:
            address = await self.brokers.lookup(self.stream, self.creates_stream)
        await self.brokers.reachable(address)
        try:
            await self.session(address)
        except Exception as error:
            if not (self.connected and RECONNECT.retry_on(error)):
                raise
            self._broke(error, 0)  # (it was up: at once again, the pauses start over)

    def _broke(self, error: BaseException, attempt: int) -> None:
        self.reconnects += 1
        detail = error.code() if isinstance(error, grpc.aio.AioRpcError) else error
        log.info("%s: connection broke (%s); looking it up again", self.stream, detail)

    async def open(self, call: Any, request: Any) -> Any:
        """Send the Open, and return the broker's first answer (its error raised)."""
        await call.write(request)
        first = await asyncio.wait_for(call.read(), OPEN_TIMEOUT_S)
        if first is EOF:
            raise BrokerUnavailableError(f"the broker closed the call for {self.stream!r}")
        if first.WhichOneof("kind") == "error":
            raise error_from_pb(first.error)
        return first

    def up(self, call: Any) -> None:
        """The session on `call` is up (the broker answered Ready)."""
        self.connected = True
        self._over = asyncio.Event()
        self.live_call = call

    def down(self) -> None:
        """... and ended."""
        self.live_call = None
        self._over.set()

    async def session(self, address: str) -> None:
        """Serve one call to the broker at address (Brokers.open_call) until it ends."""
        raise NotImplementedError

    def fail(self, error: BaseException) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        self.closed = True
        call, over = self.live_call, self._over
        if call is not None:
            # Half-close, and wait (bounded) for the broker to end the call: it ends it
            # once it let go of this producer / consumer, so one created right after
            # this returns is not refused for this one (a name, exclusivity).
            with contextlib.suppress(Exception):
                await call.done_writing()
                await asyncio.wait_for(over.wait(), 5)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
