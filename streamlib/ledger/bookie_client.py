"""One client connection to one bookie: the batched add stream and the unary reads.

Adds are the hot path. ``add()`` is synchronous and cheap: it queues the entry and a
callback. One sender task per bookie drains the queue into AddRequest batches on a
single bidirectional stream (many entries per message, never one RPC per entry); one
receiver task reads AddResponses and calls each entry's callback with its status. An
add that gets no answer within ``add_timeout_s``, or whose stream breaks, is answered
with ``None`` (unknown): the protocol machine decides what that means.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from bookie.wire import bookie_pb2 as pb
from bookie.wire import bookie_pb2_grpc as pb_grpc
from streamlib.protocol.errors import BookieUnavailableError

AddCallback = Callable[[int | None], None]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]


@dataclass(eq=False)
class _Waiter:
    key: tuple[int, int]
    deadline: float
    callback: AddCallback
    done: bool = False


@dataclass
class BookieClientConfig:
    add_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    max_batch_entries: int = 1024
    max_batch_bytes: int = 8 * 1024 * 1024


@dataclass
class _Stats:
    batches: int = 0
    entries: int = 0
    timeouts: int = 0
    stream_failures: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class BookieClient:
    def __init__(self, bookie_id: str, address: str, config: BookieClientConfig | None = None):
        self.bookie_id = bookie_id
        self.address = address
        self.config = config or BookieClientConfig()
        self.stats = _Stats()
        self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.BookieStub(self._channel)
        self._outbox: list[pb.AddEntry] = []
        self._outbox_bytes = 0
        self._waiters: dict[tuple[int, int], collections.deque[_Waiter]] = {}
        self._by_deadline: collections.deque[_Waiter] = collections.deque()
        self._wakeup = asyncio.Event()
        self._stream_task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    # -- adds ---------------------------------------------------------------------------

    def add(self, entry: pb.AddEntry, callback: AddCallback) -> None:
        if self._closed:
            # Answer later, never from inside the caller's step (machines are not re-entrant).
            asyncio.get_running_loop().call_soon(callback, None)
            return
        waiter = _Waiter(
            (entry.ledger_id, entry.entry_id),
            time.monotonic() + self.config.add_timeout_s,
            callback,
        )
        self._waiters.setdefault(waiter.key, collections.deque()).append(waiter)
        self._by_deadline.append(waiter)
        self._outbox.append(entry)
        self._outbox_bytes += len(entry.payload)
        self._wakeup.set()
        if self._stream_task is None or self._stream_task.done():
            self._stream_task = asyncio.get_running_loop().create_task(self._run_stream())
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def _answer(self, key: tuple[int, int], status: int | None) -> None:
        queue = self._waiters.get(key)
        while queue:
            waiter = queue.popleft()
            if not waiter.done:
                waiter.done = True
                if not queue:
                    del self._waiters[key]
                waiter.callback(status)
                return
        self._waiters.pop(key, None)

    def _fail_all(self) -> None:
        waiters = [w for queue in self._waiters.values() for w in queue if not w.done]
        self._waiters.clear()
        self._by_deadline.clear()
        self._outbox.clear()
        self._outbox_bytes = 0
        for waiter in waiters:
            waiter.done = True
            waiter.callback(None)

    async def _run_stream(self) -> None:
        call = self._stub.AddStream()

        async def send() -> None:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._outbox:
                    batch, self._outbox = self._take_batch()
                    self.stats.batches += 1
                    self.stats.entries += len(batch)
                    await call.write(pb.AddRequest(entries=batch))

        sender = asyncio.get_running_loop().create_task(send())
        try:
            async for response in call:
                for result in response.results:
                    self._answer((result.ledger_id, result.entry_id), result.status)
        except (grpc.aio.AioRpcError, asyncio.CancelledError, grpc.aio.UsageError):
            pass
        finally:
            sender.cancel()
            call.cancel()
            if not self._closed:
                self.stats.stream_failures += 1
            # Everything not answered on this stream is unknown now.
            self._fail_all()

    def _take_batch(self) -> tuple[list[pb.AddEntry], list[pb.AddEntry]]:
        limit_n, limit_b = self.config.max_batch_entries, self.config.max_batch_bytes
        if len(self._outbox) <= limit_n and self._outbox_bytes <= limit_b:
            batch, self._outbox_bytes = self._outbox, 0
            return batch, []
        size = 0
        for n, entry in enumerate(self._outbox):
            size += len(entry.payload)
            if n >= limit_n or (size > limit_b and n > 0):
                break
        else:
            n = len(self._outbox)
        batch, rest = self._outbox[:n], self._outbox[n:]
        self._outbox_bytes = sum(len(e.payload) for e in rest)
        return batch, rest

    async def _sweep(self) -> None:
        """Answer None for adds past their deadline (deadlines are in send order)."""
        period = max(0.05, self.config.add_timeout_s / 4)
        while not self._closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            while self._by_deadline and (
                self._by_deadline[0].done or self._by_deadline[0].deadline <= now
            ):
                waiter = self._by_deadline.popleft()
                if not waiter.done:
                    self.stats.timeouts += 1
                    self._answer_waiter_timeout(waiter)

    def _answer_waiter_timeout(self, waiter: _Waiter) -> None:
        queue = self._waiters.get(waiter.key)
        if queue is not None:
            try:
                queue.remove(waiter)
            except ValueError:
                pass
            if not queue:
                del self._waiters[waiter.key]
        waiter.done = True
        waiter.callback(None)

    # -- unary calls --------------------------------------------------------------------

    async def _call(self, method: str, request: object, timeout_s: float | None = None) -> object:
        if self._closed:
            raise BookieUnavailableError(f"client of bookie {self.bookie_id} is closed")
        try:
            return await getattr(self._stub, method)(
                request, timeout=timeout_s or self.config.read_timeout_s
            )
        except grpc.aio.AioRpcError as err:
            raise BookieUnavailableError(
                f"bookie {self.bookie_id} at {self.address}: {err.code().name} {err.details()}"
            ) from None

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self._call("ReadEntries", request)  # type: ignore[return-value]

    async def read_lac(self, request: pb.ReadLacRequest) -> pb.ReadLacResponse:
        timeout = self.config.read_timeout_s + request.timeout_ms / 1000.0
        return await self._call("ReadLac", request, timeout)  # type: ignore[return-value]

    async def write_lac(self, request: pb.WriteLacRequest) -> pb.WriteLacResponse:
        return await self._call("WriteLac", request)  # type: ignore[return-value]

    async def force(self, request: pb.ForceRequest) -> pb.ForceResponse:
        return await self._call("Force", request)  # type: ignore[return-value]

    async def info(self) -> pb.GetBookieInfoResponse:
        return await self._call("GetBookieInfo", pb.GetBookieInfoRequest())  # type: ignore[return-value]

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
