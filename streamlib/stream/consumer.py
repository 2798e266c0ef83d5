"""Consumer: a durable subscription on a stream.

The cursor (mark-delete position + individually acknowledged ranges) lives beside the
stream in the metadata store and is written by CAS, at most every
`cursor_persist_interval_ms` and on close, so acknowledgements are cheap. After a crash
the consumer resumes after the persisted mark-delete position and skips persisted
individual acks: only what was not acknowledged (or whose acknowledgement had not been
persisted yet) comes again -- at-least-once, as in Pulsar.
"""

from __future__ import annotations

import asyncio
import logging
import time

from metadata.errors import BadVersionError
from metadata.schemas import CursorState, Position, PositionRange
from metadata.services.streams import StreamRegistry
from streamlib.protocol.errors import BadRequestError, ClientClosedError, StreamlibError
from streamlib.stream.ack_ranges import AckRanges
from streamlib.stream.positions import EARLIEST, LATEST, MessageId, position_before
from streamlib.stream.reader import Message, StreamScanner

log = logging.getLogger(__name__)


def position_to_pb(position: MessageId) -> Position:
    return Position(
        ledger_id=position.ledger_id, entry_id=position.entry_id, batch_index=position.batch_index
    )


def position_from_pb(position: Position) -> MessageId:
    return MessageId(position.ledger_id, position.entry_id, position.batch_index)


def ranges_to_state(acks: AckRanges, properties: dict[str, int] | None = None) -> CursorState:
    return CursorState(
        mark_delete=position_to_pb(acks.mark_delete),
        individually_acked=[
            PositionRange(lower=position_to_pb(lo), upper=position_to_pb(hi))
            for lo, hi in acks.ranges
        ],
        properties=properties or {},
        last_active_ms=int(time.time() * 1000),
    )


def ranges_from_state(state: CursorState) -> AckRanges:
    return AckRanges(
        position_from_pb(state.mark_delete),
        [(position_from_pb(r.lower), position_from_pb(r.upper)) for r in state.individually_acked],
    )


class Consumer:
    def __init__(
        self,
        scanner: StreamScanner,
        registry: StreamRegistry,
        subscription: str,
        acks: AckRanges,
        version: int,
        *,
        receiver_queue_size: int = 1000,
        ack_timeout_ms: int = 0,
        negative_ack_redelivery_delay_ms: int = 1000,
        cursor_persist_interval_ms: int = 100,
    ) -> None:
        if receiver_queue_size < 1:
            raise BadRequestError("receiver_queue_size must be >= 1")
        self._scanner = scanner
        self._registry = registry
        self.stream = scanner.name
        self.subscription = subscription
        self._acks = acks
        self._version = version
        self._queue: asyncio.Queue[Message | BaseException] = asyncio.Queue(receiver_queue_size)
        self._redeliver: asyncio.Queue[Message] = asyncio.Queue()
        self._unacked: dict[MessageId, tuple[Message, float]] = {}
        self._ack_timeout_s = ack_timeout_ms / 1000.0
        self._nack_delay_s = negative_ack_redelivery_delay_ms / 1000.0
        self._persist_interval_s = cursor_persist_interval_ms / 1000.0
        self._dirty = False
        self._persist_timer: asyncio.TimerHandle | None = None
        self._persisting: asyncio.Task[None] | None = None
        self._fill_task: asyncio.Task[None] | None = None
        self._timeout_task: asyncio.Task[None] | None = None
        self._closed = False
        self.persisted = 0  # cursor writes (observability)

    # -- receiving ----------------------------------------------------------------------

    def _start(self) -> None:
        if self._fill_task is None:
            self._scanner.start_after = self._acks.mark_delete
            self._fill_task = asyncio.get_running_loop().create_task(self._fill())
        if self._ack_timeout_s > 0 and self._timeout_task is None:
            self._timeout_task = asyncio.get_running_loop().create_task(self._ack_timeouts())

    async def _fill(self) -> None:
        queue = self._queue
        try:
            async for message in self._scanner.messages():
                if self._acks.is_acked(message.message_id):
                    continue
                if queue.full():
                    await queue.put(message)
                else:
                    queue.put_nowait(message)
        except StreamlibError as error:
            await self._queue.put(error)

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message (redeliveries first); TimeoutError after timeout seconds."""
        if self._closed:
            raise ClientClosedError(f"consumer {self.subscription!r} is closed")
        self._start()
        if not self._redeliver.empty():
            item: Message | BaseException = self._redeliver.get_nowait()
        elif not self._queue.empty():
            item = self._queue.get_nowait()
        else:
            get = asyncio.ensure_future(self._queue.get())
            again = asyncio.ensure_future(self._redeliver.get())
            done, pending = await asyncio.wait(
                {get, again}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if not done:
                raise TimeoutError(f"no message on {self.stream!r} within {timeout} s")
            # If both finished, keep the other one for next time.
            item = (get if get in done else again).result()
            for other in done:
                if other is not get and other is not again:
                    continue
                if other is get and again in done:
                    self._redeliver.put_nowait(again.result())
        if isinstance(item, BaseException):
            raise item
        self._unacked[item.message_id] = (item, time.monotonic())
        return item

    # -- acknowledging ------------------------------------------------------------------

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (given as received, or its id)."""
        if isinstance(message, MessageId):
            entry = self._unacked.get(message)
            if entry is None:
                raise BadRequestError(f"message {message} was not received by this consumer")
            message = entry[0]
        self._unacked.pop(message.message_id, None)
        self._acks.ack(message.previous, message.message_id)
        self._changed()

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge this message and everything before it."""
        position = message if isinstance(message, MessageId) else message.message_id
        self._acks.ack_cumulative(position)
        for received in [p for p in self._unacked if p <= position]:
            del self._unacked[received]
        self._changed()

    def negative_acknowledge(self, message: Message) -> None:
        """Have the message delivered again after the redelivery delay."""
        self._unacked.pop(message.message_id, None)
        again = message.redelivered()
        asyncio.get_running_loop().call_later(self._nack_delay_s, self._redeliver.put_nowait, again)

    async def _ack_timeouts(self) -> None:
        """Redeliver messages left unacknowledged for ack_timeout_ms."""
        period = max(0.01, self._ack_timeout_s / 4)
        while not self._closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            for position, (message, received_at) in list(self._unacked.items()):
                if now - received_at >= self._ack_timeout_s:
                    del self._unacked[position]
                    again = message.redelivered()
                    self._redeliver.put_nowait(again)

    # -- the durable cursor -------------------------------------------------------------

    @property
    def mark_delete_position(self) -> MessageId:
        return self._acks.mark_delete

    def _changed(self) -> None:
        self._dirty = True
        if self._persist_timer is None and not self._closed:
            self._persist_timer = asyncio.get_running_loop().call_later(
                self._persist_interval_s, self._persist_soon
            )

    def _persist_soon(self) -> None:
        self._persist_timer = None
        if self._persisting is None or self._persisting.done():
            self._persisting = asyncio.get_running_loop().create_task(self.persist())

    async def persist(self) -> None:
        """Write the cursor now (CAS; this consumer owns the subscription's cursor)."""
        while self._dirty:
            self._dirty = False
            state = ranges_to_state(self._acks)
            try:
                self._version = await self._registry.write_cursor(
                    self.stream, self.subscription, state, self._version
                )
            except BadVersionError:
                # Reset by an admin (reset_cursor) meanwhile: theirs wins.
                stored = await self._registry.read_cursor(self.stream, self.subscription)
                if stored is not None:
                    self._acks = ranges_from_state(stored[0])
                    self._version = stored[1]
                return
            self.persisted += 1

    # -- moving the cursor --------------------------------------------------------------

    async def seek(self, target: MessageId | int) -> None:
        """Redeliver from a message id (that message first), or from the first message
        published at or after a timestamp (epoch milliseconds)."""
        if isinstance(target, int) and not isinstance(target, bool):
            position = await self._position_before_time(target)
        elif isinstance(target, MessageId):
            position = position_before(target)
        else:
            raise BadRequestError(f"seek takes a MessageId or epoch milliseconds, got {target!r}")
        await self._restart(position)

    async def _position_before_time(self, timestamp_ms: int) -> MessageId:
        scanner = StreamScanner(
            self._scanner._ledgers, self._registry, self.stream, EARLIEST, tail=False
        )
        async for message in scanner.messages():
            if message.publish_time_ms >= timestamp_ms:
                return message.previous
        return LATEST

    async def _restart(self, position: MessageId) -> None:
        if self._fill_task is not None:
            self._fill_task.cancel()
            await asyncio.gather(self._fill_task, return_exceptions=True)
            self._fill_task = None
        if position == LATEST:
            position = await self._scanner.end_position()
        self._acks.reset(position)
        self._unacked.clear()
        self._queue = asyncio.Queue(self._queue.maxsize)
        self._redeliver = asyncio.Queue()
        self._dirty = True
        await self.persist()
        await self._registry.cursor_moved_back(self.stream)  # retention must see it now

    async def unsubscribe(self) -> None:
        """Delete the subscription (its cursor) and close."""
        await self.close(persist=False)
        await self._registry.delete_cursor(self.stream, self.subscription)

    async def close(self, persist: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if self._persist_timer is not None:
            self._persist_timer.cancel()
        for task in (self._fill_task, self._timeout_task, self._persisting):
            if task is not None and task is not self._persisting:
                task.cancel()
        tasks = [t for t in (self._fill_task, self._timeout_task, self._persisting) if t]
        await asyncio.gather(*tasks, return_exceptions=True)
        if persist:
            self._dirty = True
            await self.persist()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        return await self.receive()
