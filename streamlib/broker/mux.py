"""One Session call (broker.proto): many producers' and consumers' calls carried on one,
as Pulsar's binary protocol carries them on one connection. Each handle is served by
the handler its own Produce or Consume call would have (BrokerService's), fed the
handle's parts and answering through the call's one outbox; answers of many handles
travel in one gRPC message.

Bounds, so that no client grows the broker: the parts received and not yet taken by
their handles hold at most MAX_PENDING_BYTES (past it the call is not read: a producer
waiting for room in its stream holds back the call's other handles, as Pulsar throttles
a connection), answers not yet written at most OUTBOX_BYTES (past it the handles wait:
a client that does not read its call holds nothing more), and a call at most
`max_handles` handles at once (each also holds a session: SessionLimits)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from streamlib.protocol.errors import BadRequestError, TooManySessionsError
from streamlib.tasks import Waker
from streamlib.wire import broker_pb2 as pb
from streamlib.wire.convert import error_pb, move_parts

log = logging.getLogger(__name__)

MAX_PENDING_BYTES = 8 * 1024 * 1024
OUTBOX_BYTES = 4 * 1024 * 1024
ANSWER_BYTES = 1 << 20  # answers gathered into one gRPC message up to about this

Handler = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


class _Inbox:
    """One handle's parts, as the request iterator its handler reads."""

    def __init__(self, served: ServedSession) -> None:
        self._served = served
        self._items: collections.deque[tuple[Any, int]] = collections.deque()
        self._wake = Waker()
        self.ended = False

    def put(self, request: Any, size: int) -> None:
        self._items.append((request, size))
        self._wake.set()

    def end(self) -> None:
        self.ended = True
        self._wake.set()

    def drop(self) -> None:
        """The handle is over: what it did not take is given back."""
        self.ended = True
        self._served.taken(sum(size for _, size in self._items))
        self._items.clear()

    def __aiter__(self) -> _Inbox:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            if self.ended:
                raise StopAsyncIteration
            await self._wake.wait()
        request, size = self._items.popleft()
        self._served.taken(size)
        return request


class _Handle:
    def __init__(self, kind: str, inbox: _Inbox) -> None:
        self.kind = kind  # produce | consume
        self.inbox = inbox
        self.task: asyncio.Task[None] | None = None


class ServedSession:
    """The broker's side of one Session call. handlers: by a part's kind (produce,
    consume), what serves a handle's parts (a request iterator and the call's context)."""

    def __init__(self, handlers: dict[str, Handler], context: Any, max_handles: int) -> None:
        self._handlers = handlers
        self._context = context
        self._max_handles = max_handles
        self._handles: dict[int, _Handle] = {}
        self._pending = 0  # bytes received, not yet taken by their handles
        self._drained = asyncio.Event()
        self._outbox: collections.deque[tuple[int, str, Any, int]] = collections.deque()
        self._out_bytes = 0
        self._out_wake = asyncio.Event()
        self._room = asyncio.Event()
        self._reading = True

    def taken(self, size: int) -> None:
        self._pending -= size
        if self._pending <= MAX_PENDING_BYTES:
            self._drained.set()

    async def serve(self, requests: AsyncIterator[pb.SessionRequest]) -> AsyncIterator[Any]:
        """The call's answers (SessionResponse), until its client half-closes it and
        every handle is over, or it ends."""
        reader = asyncio.get_running_loop().create_task(self._read(requests))
        try:
            while True:
                while not self._outbox:
                    if not self._reading and not self._handles:
                        return
                    self._out_wake.clear()
                    await self._out_wake.wait()
                yield self._gathered()
        finally:
            reader.cancel()
            tasks = [h.task for h in self._handles.values() if h.task is not None]
            for task in tasks:
                task.cancel()  # (each ends its session to the end: _stop_then)
            await asyncio.gather(reader, *tasks, return_exceptions=True)

    def _gathered(self) -> pb.SessionResponse:
        out = pb.SessionResponse()
        self._out_bytes -= move_parts(self._outbox, out.parts, ANSWER_BYTES)
        if self._out_bytes <= OUTBOX_BYTES:
            self._room.set()
        return out

    def _answer(self, handle: int, kind: str, response: Any, size: int) -> None:
        self._outbox.append((handle, kind, response, size))
        self._out_bytes += size
        self._out_wake.set()

    async def _read(self, requests: AsyncIterator[pb.SessionRequest]) -> None:
        try:
            async for request in requests:
                for part in request.parts:
                    self._take(part)
                while self._pending > MAX_PENDING_BYTES:
                    self._drained.clear()
                    await self._drained.wait()
        finally:
            # The client sends no more: every handle's requests are over.
            self._reading = False
            for handle in self._handles.values():
                handle.inbox.end()
            self._out_wake.set()

    def _take(self, part: pb.SessionPart) -> None:
        which = part.WhichOneof("kind")
        handle = self._handles.get(part.handle)
        if which in ("end", "cancel") or which is None:
            if handle is not None:
                if which == "cancel" and handle.task is not None:
                    handle.task.cancel()
                else:
                    handle.inbox.end()
            return
        request = getattr(part, which)
        if handle is None:
            self._open(part.handle, which, request)
            return
        if which != handle.kind:
            error = BadRequestError(f"handle {part.handle} is a {handle.kind}r's, not a {which}r's")
            self._answer(part.handle, handle.kind, _error_response(handle.kind, error), 64)
            if handle.task is not None:
                handle.task.cancel()
            return
        size = part.ByteSize()
        self._pending += size
        handle.inbox.put(request, size)

    def _open(self, number: int, kind: str, request: Any) -> None:
        if len(self._handles) >= self._max_handles:
            error = TooManySessionsError(
                f"this call holds {len(self._handles)} producers and consumers, its limit"
            )
            self._answer(number, kind, _error_response(kind, error), 64)
            self._answer(number, "end", None, 8)
            return
        handle = _Handle(kind, _Inbox(self))
        size = request.ByteSize()
        self._pending += size
        handle.inbox.put(request, size)
        self._handles[number] = handle
        handle.task = asyncio.get_running_loop().create_task(self._pump(number, handle))

    async def _pump(self, number: int, handle: _Handle) -> None:
        """A handle's answers into the outbox (waiting while it is full), then its end."""
        answers = self._handlers[handle.kind](handle.inbox, self._context)
        try:
            async for response in answers:
                self._answer(number, handle.kind, response, response.ByteSize() + 8)
                while self._out_bytes > OUTBOX_BYTES:
                    self._room.clear()
                    await self._room.wait()
        except Exception:  # (a handler ends its session with an error answer, not this)
            log.exception("handle %d of a session call failed", number)
        finally:
            with contextlib.suppress(Exception):
                await answers.aclose()  # type: ignore[attr-defined]
            handle.inbox.drop()
            if self._handles.get(number) is handle:
                del self._handles[number]
            self._answer(number, "end", None, 8)


def _error_response(kind: str, error: BaseException) -> Any:
    if kind == "produce":
        return pb.ProduceResponse(error=error_pb(error))
    return pb.ConsumeResponse(error=error_pb(error))
