"""One client connection to one bookie: the batched add stream and the unary reads.

Adds are the hot path. ``add()`` is synchronous and cheap: it queues the entry and a
callback. One sender task per bookie drains the queue into AddRequest batches on a
single bidirectional stream (many entries per message, never one RPC per entry); one
receiver task reads AddResponses and calls each entry's callback with its status. An
add that gets no answer within ``add_timeout_s``, or whose stream breaks, is answered
with ``None`` (unknown): the protocol machine decides what that means.

Reconnecting. When a bookie goes away, gRPC backs off between connection attempts, by
default up to two minutes, and while it backs off every call fails at once: a client that
lived through a restart of the cluster found the bookies "unreachable" long after they
were back. So the backoff here is capped at about a second (CHANNEL_OPTIONS), and the
calls whose Unknown answers cost the most wait up to ``connect_timeout_s`` (never past
their own deadline) for the connection to come up instead of failing on a stale backoff:
fencing requests (an Unknown aborts the whole recovery) and the add stream (one failure
answers every add on it, and the writer replaces the bookie). A bookie that is really
down still fails them within that bound. Plain reads and LAC polls fail fast as before:
their callers have other replicas to try right away.

The framed add stream. A bookie that registers a framed address serves the add stream
without gRPC too (bookie/framed.py), at about half the CPU per message on each side:
the add stream is opened there (streamlib/ledger/framed_stream.py), with the channel's
TLS files and token, behind the interface of the gRPC call, so everything above is the
same. Where the bookie has no framed port (an older one), or it cannot be opened, the
add stream is the gRPC one. Reads and the other calls always go over gRPC.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from bookie.wire import bookie_pb2 as pb
from bookie.wire import bookie_pb2_grpc as pb_grpc
from streamlib.ledger.framed_stream import (
    FramedAddCall,
    FramedOpenError,
    FramedStreamError,
    client_ssl_context,
)
from streamlib.protocol.errors import BookieTlsError, BookieUnavailableError
from streamlib.tasks import Recent
from streamlib.tls_failures import tls_mismatch

log = logging.getLogger(__name__)

# Called with the answers for some entries of one add() batch: [(entry id, status)],
# status None for "no answer" (timeout, broken stream).
ResultsHandler = Callable[[list[tuple[int, int | None]]], None]
# Called with entry ids the bookie stored durably (status OK): the hot path.
OkHandler = Callable[[list[int]], None]
AddCall = grpc.aio.StreamStreamCall | FramedAddCall


def frame_add(entry: pb.AddEntry) -> bytes:
    """One entry as serialized for the add stream (see pb.AddRequestFramed)."""
    return entry.SerializeToString()


class AddHandler:
    """Who waits for the answers of an add() batch: on_results for any answer, and
    optionally on_ok for the common all-OK answer as a bare id list (cheaper)."""

    __slots__ = ("on_ok", "on_results")

    def __init__(self, on_results: ResultsHandler, on_ok: OkHandler | None = None) -> None:
        self.on_results = on_results
        self.on_ok = on_ok


MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect backoff (gRPC core channel args): first retry after 100 ms, then x1.6
    # up to 1 s (+-20% jitter), instead of 1 s growing to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Despite its name, the least time one connection attempt is given (default 20 s):
    # shorter, so a bookie that was unreachable (no refusal, just silence) is dialled
    # afresh soon after it is back; long enough for a lost SYN or two to be resent.
    ("grpc.min_reconnect_backoff_ms", 5000),
    # Keepalive: a bookie that vanished without closing the connection (a dead host, a
    # partition) fails a quiet add stream within ~40 s instead of the OS's hours. Every
    # 30 s is well above the most a bookie permits (`bookie serve
    # --min-client-ping-interval`, default 10 s); pinging more often would earn a GOAWAY
    # "too_many_pings", which breaks every call on the connection.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # No cap on pings between data frames (default 2): the add stream may be quiet for long.
    ("grpc.http2.max_pings_without_data", 0),
]


@dataclass(eq=False)
class _Batch:
    deadline: float
    keys: list[tuple[int, int]]
    handler: AddHandler


@dataclass
class BookieClientConfig:
    add_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    # How long a fencing request or a new add stream waits for the connection to be
    # (re)established before the bookie counts as unreachable: more than the longest
    # reconnect backoff (CHANNEL_OPTIONS), so it always covers a fresh attempt.
    connect_timeout_s: float = 2.0
    # A bookie that vanished without closing the connection (a dead host, a partition)
    # fails a quiet connection within keepalive_time_s + keepalive_timeout_s (see
    # CHANNEL_OPTIONS: keep keepalive_time_s above the bookies' --min-client-ping-interval).
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    max_batch_entries: int = 1024
    max_batch_bytes: int = 8 * 1024 * 1024
    # TLS (PEM file paths): tls_ca set means dial bookies over TLS, trusting that CA;
    # tls_cert + tls_key (only together) are the client certificate for mutual TLS.
    # Bookies are dialled at their registered address, so their certificates must name
    # it (an IP SAN for an IP address).
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # A JWT naming this client's principal to bookies that authenticate (sent as
    # "authorization: Bearer" on every call; never in a repr or a log).
    token: str | None = field(default=None, repr=False)

    def call_metadata(self) -> tuple[tuple[str, str], ...] | None:
        return None if not self.token else (("authorization", f"Bearer {self.token}"),)

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("a TLS client certificate needs both tls_cert and tls_key")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("tls_cert/tls_key need tls_ca (the CA that signs the bookies)")

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials read from the configured files; None: plaintext."""
        if self.tls_ca is None:
            return None

        def pem(path: str | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise ValueError(f"cannot read the TLS {what} {path}: {e.strerror}") from e

        return grpc.ssl_channel_credentials(
            root_certificates=pem(self.tls_ca, "CA certificate (tls_ca)"),
            private_key=pem(self.tls_key, "key (tls_key)"),
            certificate_chain=pem(self.tls_cert, "certificate (tls_cert)"),
        )

    def channel_options(self) -> list[tuple[str, int]]:
        keepalive = {
            "grpc.keepalive_time_ms": int(self.keepalive_time_s * 1000),
            "grpc.keepalive_timeout_ms": int(self.keepalive_timeout_s * 1000),
            # The wait for a ping's answer: without it gRPC waits 60 s whatever the
            # keepalive timeout says, and a frozen peer went unnoticed that long.
            "grpc.http2.ping_timeout_ms": int(self.keepalive_timeout_s * 1000),
        }
        known = {k for k, _ in CHANNEL_OPTIONS}
        return [(k, keepalive.get(k, v)) for k, v in CHANNEL_OPTIONS] + [
            (k, v) for k, v in keepalive.items() if k not in known
        ]


@dataclass
class _Stats:
    batches: int = 0
    entries: int = 0
    timeouts: int = 0
    stream_failures: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class BookieClient:
    def __init__(
        self,
        bookie_id: str,
        address: str,
        config: BookieClientConfig | None = None,
        *,
        on_unavailable: Callable[[], None] | None = None,
        framed_address: str | None = None,
    ):
        self.bookie_id = bookie_id
        self.address = address
        # Where the bookie serves the framed add stream (None: it does not; gRPC then).
        self.framed_address = framed_address or None
        self._framed_ssl: ssl.SSLContext | None = None
        self.config = config or BookieClientConfig()
        # Told when the bookie could not be reached: it may have moved (a new address).
        self.on_unavailable = on_unavailable
        self.stats = _Stats()
        credentials = self.config.channel_credentials()
        options = self.config.channel_options()
        self._channel = (
            grpc.aio.insecure_channel(address, options=options)
            if credentials is None
            else grpc.aio.secure_channel(address, credentials, options=options)
        )
        self._stub = pb_grpc.BookieStub(self._channel)
        self._metadata = self.config.call_metadata()
        self._outbox: list[bytes] = []  # serialized AddEntry messages (see frame_add)
        self._outbox_bytes = 0
        # Explicit LACs to ride on the add stream, by ledger (only the newest counts).
        self._lacs: dict[int, bytes] = {}
        # Who waits for each (ledger, entry). The same entry can be in flight twice (a
        # write-back and a writer's add in one process): later handlers queue in _more.
        self._handlers: dict[tuple[int, int], AddHandler] = {}
        self._more: dict[tuple[int, int], collections.deque[AddHandler]] = {}
        self._batches: collections.deque[_Batch] = collections.deque()  # by deadline
        self._wakeup = asyncio.Event()
        self._stream_task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        self._info: Recent[pb.GetBookieInfoResponse] = Recent()  # (info's last answer)

    # -- adds ---------------------------------------------------------------------------

    def add(self, entries: list[pb.AddEntry], handler: AddHandler) -> None:
        """Queue entries for the add stream; handler gets their answers (maybe in parts)."""
        framed = [frame_add(e) for e in entries]
        keys = [(e.ledger_id, e.entry_id) for e in entries]
        self.add_framed(framed, keys, sum(len(f) for f in framed), handler)

    def send_lac(self, request: pb.WriteLacRequest) -> None:
        """Send an explicit LAC on the add stream: no answer, no call of its own (best
        effort, as the unary WriteLac a writer's timer sends). A LAC queued for the same
        ledger before this one went out is replaced."""
        if self._closed:
            return
        self._lacs[request.ledger_id] = request.SerializeToString()
        self._wakeup.set()
        if self._stream_task is None or self._stream_task.done():
            self._stream_task = asyncio.get_running_loop().create_task(self._run_stream())

    def add_framed(
        self,
        framed: list[bytes],
        keys: list[tuple[int, int]],
        nbytes: int,
        handler: AddHandler,
    ) -> None:
        """add() of entries already serialized (frame_add; the same bytes serve every
        bookie of a write set); keys: their (ledger id, entry id); nbytes: their size."""
        loop = asyncio.get_running_loop()
        if self._closed:
            # Answer later, never from inside the caller's step (machines are not re-entrant).
            unanswered: list[tuple[int, int | None]] = [(k[1], None) for k in keys]
            loop.call_soon(self._answer, handler, unanswered)
            return
        handlers = self._handlers
        for key in keys:
            if key in handlers:
                self._more.setdefault(key, collections.deque()).append(handler)
            else:
                handlers[key] = handler
        self._batches.append(_Batch(time.monotonic() + self.config.add_timeout_s, keys, handler))
        self._outbox += framed
        self._outbox_bytes += nbytes
        self._wakeup.set()
        if self._stream_task is None or self._stream_task.done():
            self._stream_task = loop.create_task(self._run_stream())
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())

    def _take(self, key: tuple[int, int]) -> AddHandler | None:
        """The handler waiting for key's answer, no longer waiting (None: answered
        already, by a timeout, or never asked); the next one in line, if any, moves up."""
        handler = self._handlers.pop(key, None)
        if handler is not None and self._more:
            queued = self._more.get(key)
            if queued:
                self._handlers[key] = queued.popleft()
                if not queued:
                    del self._more[key]
        return handler

    def _dispatch(self, answers: Sequence[tuple[int, int, int | None]]) -> None:
        """Hand (ledger, entry, status) answers to their handlers, one call per handler."""
        groups: dict[AddHandler, list[tuple[int, int | None]]] = {}
        for ledger_id, entry_id, status in answers:
            handler = self._take((ledger_id, entry_id))
            if handler is not None:
                groups.setdefault(handler, []).append((entry_id, status))
        for handler, results in groups.items():
            self._answer(handler, results)

    def _dispatch_ok(self, ledger_id: int, entry_ids: Sequence[int]) -> None:
        """Hand the ids of entries stored durably to their handlers (the hot path)."""
        groups: dict[AddHandler, list[int]] = {}
        take = self._take
        for entry_id in entry_ids:
            handler = take((ledger_id, entry_id))
            if handler is None:
                continue
            group = groups.get(handler)
            if group is None:
                groups[handler] = [entry_id]
            else:
                group.append(entry_id)
        for handler, ids in groups.items():
            if handler.on_ok is None:
                self._answer(handler, [(e, pb.OK) for e in ids])
                continue
            try:
                handler.on_ok(ids)
            except Exception:
                log.exception("bookie %s: add results handler failed", self.bookie_id)

    def _answer(self, handler: AddHandler, results: list[tuple[int, int | None]]) -> None:
        """Call one handler. A handler that raises is a bug, but it must not cost the
        other handlers their answers (an unanswered add would wait forever)."""
        try:
            handler.on_results(results)
        except Exception:
            log.exception("bookie %s: add results handler failed", self.bookie_id)

    def _fail_all(self) -> None:
        """Answer None to every add waiting on this stream. The maps are swapped out
        first: a handler may add again at once (a recovery's retry), and that add must
        survive into the next stream."""
        handlers, more = self._handlers, self._more
        self._handlers, self._more = {}, {}
        self._batches.clear()
        self._outbox.clear()
        self._outbox_bytes = 0
        self._lacs.clear()  # best effort: the next entry carries the LAC anyway
        groups: dict[AddHandler, list[tuple[int, int | None]]] = {}
        for (_, entry_id), handler in handlers.items():
            groups.setdefault(handler, []).append((entry_id, None))
        for (_, entry_id), queued in more.items():
            for handler in queued:
                groups.setdefault(handler, []).append((entry_id, None))
        for handler, results in groups.items():
            self._answer(handler, results)

    def _ensure_stream(self) -> None:
        """Start a stream for adds queued while the previous one was ending."""
        idle = self._stream_task is None or self._stream_task.done()
        if (self._outbox or self._lacs) and not self._closed and idle:
            self._stream_task = asyncio.get_running_loop().create_task(self._run_stream())

    async def _run_stream(self) -> None:
        call: AddCall | None = None

        async def send(call: AddCall) -> None:
            try:
                while True:
                    await self._wakeup.wait()
                    self._wakeup.clear()
                    while self._outbox or self._lacs:
                        batch, self._outbox = self._take_batch()
                        lacs = list(self._lacs.values())
                        self._lacs.clear()
                        self.stats.batches += 1
                        self.stats.entries += len(batch)
                        request = pb.AddRequestFramed(entries=batch, lacs=lacs)
                        await call.write(request.SerializeToString())
            except (
                grpc.aio.AioRpcError,
                grpc.aio.UsageError,
                asyncio.InvalidStateError,
                FramedStreamError,
            ):
                call.cancel()  # the stream is broken: end the receiver too, so all is answered

        sender: asyncio.Task[None] | None = None
        try:
            # Opened on a channel still backing off, the stream would fail at once and
            # every add on it with it; wait for the connection (bounded) instead.
            wait_s = min(self.config.connect_timeout_s, self.config.add_timeout_s)
            if not await self._connected(wait_s):
                return  # unreachable: the finally answers every queued add None
            call = await self._open_add_stream(wait_s)
            sender = asyncio.get_running_loop().create_task(send(call))
            async for response in call:
                # Durable OKs first: one message may merge answers the bookie sent apart,
                # and an OK is never made wrong by a later error (the fence waits for it).
                for ok in response.ok:
                    self._dispatch_ok(ok.ledger_id, ok.entry_ids)
                if response.results:
                    self._dispatch([(r.ledger_id, r.entry_id, r.status) for r in response.results])
        except (
            grpc.aio.AioRpcError,
            asyncio.CancelledError,
            grpc.aio.UsageError,
            FramedStreamError,
        ):
            pass
        finally:
            if sender is not None:
                sender.cancel()
            if call is not None:
                call.cancel()
            if not self._closed:
                self.stats.stream_failures += 1
                self._unavailable()
            # Everything not answered on this stream is unknown now.
            self._fail_all()
            if self._outbox and not self._closed:  # added while we were answering
                asyncio.get_running_loop().call_soon(self._ensure_stream)

    def _take_batch(self) -> tuple[list[bytes], list[bytes]]:
        limit_n, limit_b = self.config.max_batch_entries, self.config.max_batch_bytes
        if len(self._outbox) <= limit_n and self._outbox_bytes <= limit_b:
            batch, self._outbox_bytes = self._outbox, 0
            return batch, []
        size = 0
        n = 0
        for n, framed in enumerate(self._outbox):
            size += len(framed)
            if n >= limit_n or (size > limit_b and n > 0):
                break
        else:
            n = len(self._outbox)
        batch, rest = self._outbox[:n], self._outbox[n:]
        self._outbox_bytes -= size - (len(self._outbox[n]) if n < len(self._outbox) else 0)
        return batch, rest

    async def _sweep(self) -> None:
        """Answer None for adds past their deadline (batches are in deadline order)."""
        period = max(0.05, self.config.add_timeout_s / 4)
        while not self._closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            while self._batches and self._batches[0].deadline <= now:
                batch = self._batches.popleft()
                unanswered: list[tuple[int, int | None]] = []
                for key in batch.keys:
                    if self._forget(key, batch.handler):
                        unanswered.append((key[1], None))
                self.stats.timeouts += len(unanswered)
                if unanswered:
                    self._answer(batch.handler, unanswered)

    def _forget(self, key: tuple[int, int], handler: AddHandler) -> bool:
        """Drop one wait of handler for key (a timeout); whether it was still waiting."""
        queued = self._more.get(key)
        if self._handlers.get(key) is handler:
            if queued:
                self._handlers[key] = queued.popleft()
                if not queued:
                    del self._more[key]
            else:
                del self._handlers[key]
            return True
        if queued and handler in queued:
            queued.remove(handler)
            if not queued:
                del self._more[key]
            return True
        return False

    async def _open_add_stream(self, timeout_s: float) -> AddCall:
        """The add stream: on the bookie's framed port when it has one and it opens
        within timeout_s, else over gRPC (which then fails, or not, as it would)."""
        if self.framed_address is not None:
            try:
                if self._framed_ssl is None and self.config.tls_ca is not None:
                    cfg = self.config
                    self._framed_ssl = client_ssl_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)
                keepalive = (self.config.keepalive_time_s, self.config.keepalive_timeout_s)
                async with asyncio.timeout(timeout_s):
                    call = await FramedAddCall.open(
                        self.framed_address,
                        self.config.token,
                        self._framed_ssl,
                        keepalive,
                        lost=self._lost,
                    )
                self._count("framed_streams")
                return call
            except (FramedOpenError, TimeoutError, OSError) as e:
                self._count("framed_fallbacks")
                log.info("bookie %s: add stream over gRPC (%s)", self.bookie_id, e)
                self._unavailable()  # its framed port may have moved: look it up again
        return self._add_stream()

    async def _lost(self) -> None:
        """Return once the bookie is gone for a framed add stream's sake: the gRPC
        channel (whose keepalive pings the bookie) left READY and did not get back within
        connect_timeout_s. A bookie that only closed an idle gRPC connection (its
        --max-connection-idle) is READY again at once, and the stream goes on.

        The state is looked at every second or so rather than awaited: a pending
        wait_for_state_change is an operation in gRPC core that outlives its cancelled
        task, and completing after the event loop closed it raises there."""
        channel = self._channel
        period_s = min(1.0, self.config.keepalive_timeout_s)
        while True:
            await asyncio.sleep(period_s)
            if channel.get_state() is grpc.ChannelConnectivity.READY:
                continue
            if not await self._connected(self.config.connect_timeout_s):
                return

    def _count(self, what: str) -> None:
        self.stats.extra[what] = self.stats.extra.get(what, 0) + 1

    def _add_stream(self) -> grpc.aio.StreamStreamCall:
        """The add stream, its requests written as bytes: serialized AddRequestFramed
        messages, wire-identical to AddRequest."""
        method = self._channel.stream_stream(
            "/streamlib.bookie.v1.Bookie/AddStream",
            request_serializer=None,
            response_deserializer=pb.AddResponse.FromString,
        )
        return method(metadata=self._metadata)  # type: ignore[call-arg]  # requests are written

    # -- connection ---------------------------------------------------------------------

    async def _connected(self, timeout_s: float) -> bool:
        """Whether the channel is READY, or gets there within timeout_s (asking it to
        connect, and so waiting out at most one reconnect backoff)."""
        channel = self._channel
        if channel.get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY:
            return True

        async def ready() -> bool:
            state = channel.get_state(try_to_connect=True)
            while state is not grpc.ChannelConnectivity.READY:
                if state is grpc.ChannelConnectivity.SHUTDOWN:  # closed: it never will be
                    return False
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)
            return True

        try:
            # Not wait_for: on Python 3.11 it can drop a cancellation (see metadata's
            # ZooKeeper backend); a cancelled caller must stop waiting.
            async with asyncio.timeout(timeout_s):
                return await ready()
        except TimeoutError:
            self.stats.extra["connect_timeouts"] = self.stats.extra.get("connect_timeouts", 0) + 1
            return False

    # -- unary calls --------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        request: object,
        timeout_s: float | None = None,
        *,
        wait_for_ready: bool = False,
    ) -> object:
        """One unary call within timeout_s (default read_timeout_s). With wait_for_ready
        it first waits up to connect_timeout_s for the connection, and then rides out a
        reconnection within what is left of its deadline, instead of failing at once."""
        if self._closed:
            raise BookieUnavailableError(f"client of bookie {self.bookie_id} is closed")
        timeout = timeout_s or self.config.read_timeout_s
        if wait_for_ready:
            loop = asyncio.get_running_loop()
            started = loop.time()
            connect_s = min(self.config.connect_timeout_s, timeout)
            if not await self._connected(connect_s):
                if self._closed:
                    raise BookieUnavailableError(f"client of bookie {self.bookie_id} is closed")
                self._unavailable()
                raise BookieUnavailableError(
                    f"bookie {self.bookie_id} at {self.address}: no connection within "
                    f"{connect_s:g}s"
                )
            timeout = max(0.001, timeout - (loop.time() - started))
        try:
            return await getattr(self._stub, method)(
                request, timeout=timeout, wait_for_ready=wait_for_ready, metadata=self._metadata
            )
        except asyncio.CancelledError:
            # Closing the channel (the pool replaced this client: the bookie moved) ends
            # the calls on it as "locally cancelled"; for the caller that is an
            # unreachable bookie, not a cancellation of its own task.
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                raise BookieUnavailableError(
                    f"bookie {self.bookie_id} at {self.address}: its client was closed"
                ) from None
            raise
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._unavailable()
            if err.code() is grpc.StatusCode.UNAVAILABLE:
                mismatch = await tls_mismatch(
                    f"bookie {self.bookie_id}",
                    self.address,
                    err.details() or "",
                    tls_ca=self.config.tls_ca,
                    tls_cert=self.config.tls_cert,
                )
                if mismatch is not None:
                    raise BookieTlsError(mismatch) from None
            raise BookieUnavailableError(
                f"bookie {self.bookie_id} at {self.address}: {err.code().name} {err.details()}"
            ) from None

    def _unavailable(self) -> None:
        if self.on_unavailable is not None and not self._closed:
            self.on_unavailable()

    @staticmethod
    def _fences(request: pb.ReadRequest | pb.ReadLacRequest) -> bool:
        """A recovery's request: it fences (the flag, or a term claimed by a takeover).
        Its Unknown answer can abort the whole recovery, so it waits for the connection."""
        return bool(request.flags & pb.FENCE) or request.term > 0

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self._call(  # type: ignore[return-value]
            "ReadEntries", request, wait_for_ready=self._fences(request)
        )

    async def read_lac(self, request: pb.ReadLacRequest) -> pb.ReadLacResponse:
        timeout = self.config.read_timeout_s + request.timeout_ms / 1000.0
        return await self._call(  # type: ignore[return-value]
            "ReadLac", request, timeout, wait_for_ready=self._fences(request)
        )

    async def write_lac(self, request: pb.WriteLacRequest) -> pb.WriteLacResponse:
        return await self._call("WriteLac", request)  # type: ignore[return-value]

    async def force(self, request: pb.ForceRequest) -> pb.ForceResponse:
        return await self._call("Force", request)  # type: ignore[return-value]

    async def info(self, max_age_s: float = 0.0) -> pb.GetBookieInfoResponse:
        """The bookie's GetBookieInfo answer. max_age_s: one asked within that long will
        do (concurrent callers share one call; a failed one is not kept)."""
        if max_age_s <= 0:
            return await self._call("GetBookieInfo", pb.GetBookieInfoRequest())  # type: ignore[return-value]
        return await self._info.get(self.info, max_age_s)

    async def close(self) -> None:
        self._closed = True
        for task in (self._stream_task, self._sweeper):
            if task is not None:
                task.cancel()
        for task in (self._stream_task, self._sweeper):
            if task is not None:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._fail_all()
        await self._channel.close(None)
