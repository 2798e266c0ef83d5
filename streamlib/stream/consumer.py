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
import builtins
import collections
import logging
import time

from metadata.errors import BadVersionError
from metadata.schemas import CursorState, Position, PositionRange
from metadata.services.streams import StreamRegistry
from streamlib.protocol.errors import BadRequestError, ClientClosedError, TimeoutError
from streamlib.stream.ack_ranges import AckRanges
from streamlib.stream.positions import EARLIEST, LATEST, MessageId, position_before
from streamlib.stream.reader import (
    EntryQueue,
    Message,
    StreamScanner,
)
from streamlib.stream.subscription import SubscriptionGate

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
        gate: SubscriptionGate | None = None,
    ) -> None:
        if receiver_queue_size < 1:
            raise BadRequestError("receiver_queue_size must be >= 1")
        self._scanner = scanner
        self._registry = registry
        self.stream = scanner.name
        self.subscription = subscription
        self._acks = acks
        self._version = version
        # Whole entries read ahead, and messages to deliver again. `_wake` is set when
        # either gets more.
        self._queue_size = receiver_queue_size
        self._wake = asyncio.Event()
        self._queue = EntryQueue(receiver_queue_size, self._wake)
        self._redeliver: collections.deque[Message] = collections.deque()
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
        # The subscription type's say in who receives (subscription.py). A consumer that
        # becomes active (again) starts from the durable cursor: read it first.
        self._gate = gate
        self._reload_cursor = False
        if gate is not None:
            gate.on_change = self._on_active_change

    @property
    def consumer_type(self) -> str:
        return self._gate.kind.value if self._gate is not None else "exclusive"

    @property
    def is_active(self) -> bool:
        """Whether this consumer receives now (a failover standby does not)."""
        return self._gate is None or self._gate.active.is_set()

    def _on_active_change(self, active: bool) -> None:
        if active:
            self._reload_cursor = True
            self._wake.set()
            return
        # Another consumer may be active now: what was read ahead or handed out and not
        # acknowledged is its to deliver. Stop reading; drop it all.
        if self._fill_task is not None:
            self._fill_task.cancel()
            self._fill_task = None
        self._queue = EntryQueue(self._queue_size, self._wake)
        self._redeliver = collections.deque()
        self._unacked.clear()
        self._wake.set()  # a receive() waiting now goes back to waiting for its turn

    async def _activate(self) -> None:
        """Wait to be the subscription's active consumer; a new turn starts from the
        cursor as stored (the previous active one persisted it on its way out)."""
        assert self._gate is not None
        await self._gate.wait_active()
        if self._reload_cursor:
            self._reload_cursor = False
            stored = await self._registry.read_cursor(self.stream, self.subscription)
            if stored is not None and stored[1] != self._version:
                self._acks, self._version = ranges_from_state(stored[0]), stored[1]
                if self._fill_task is not None:
                    self._fill_task.cancel()
                    await asyncio.gather(self._fill_task, return_exceptions=True)
                    self._fill_task = None
                self._queue = EntryQueue(self._queue_size, self._wake)
                self._redeliver = collections.deque()
                self._unacked.clear()

    # -- receiving ----------------------------------------------------------------------

    def _start(self) -> None:
        if self._fill_task is None:
            self._scanner.start_after = self._acks.mark_delete
            self._fill_task = asyncio.get_running_loop().create_task(
                self._queue.fill(self._scanner)
            )
        if self._ack_timeout_s > 0 and self._timeout_task is None:
            self._timeout_task = asyncio.get_running_loop().create_task(self._ack_timeouts())

    def _take(self) -> Message | None:
        """The next message to deliver, if one is here now: redeliveries first, then the
        read-ahead messages not acknowledged yet (individual acks persisted before a
        restart)."""
        acks = self._acks
        while self._redeliver:
            again = self._redeliver.popleft()
            if not acks.is_acked(again.message_id):  # (acknowledged since it timed out?)
                return again
        while True:
            message = self._queue.take_nowait()
            if message is None or not acks.is_acked(message.message_id):
                return message

    def _deliver_again(self, message: Message, into: collections.deque[Message]) -> None:
        into.append(message)  # (dropped if a seek replaced the deque meanwhile)
        if into is self._redeliver:
            self._wake.set()

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message (redeliveries first); TimeoutError after timeout seconds."""
        if self._closed:
            raise ClientClosedError(f"consumer {self.subscription!r} is closed")
        message = None
        if self.is_active and not self._reload_cursor:
            self._start()
            message = self._take()
        if message is None:
            try:
                async with asyncio.timeout(timeout):
                    while message is None:
                        if self._gate is not None:
                            await self._activate()
                        self._start()  # (again, if a seek or a change of turn stopped it)
                        message = self._take()
                        if message is None:
                            self._wake.clear()
                            await self._wake.wait()
            except builtins.TimeoutError:
                raise TimeoutError(f"no message on {self.stream!r} within {timeout} s") from None
        self._unacked[message.message_id] = (message, time.monotonic())
        return message

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

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Have the message (given as received, or its id) delivered again after the
        redelivery delay."""
        if isinstance(message, MessageId):
            entry = self._unacked.get(message)
            if entry is None:
                raise BadRequestError(f"message {message} was not received by this consumer")
            message = entry[0]
        self._unacked.pop(message.message_id, None)
        again = message.redelivered()
        asyncio.get_running_loop().call_later(
            self._nack_delay_s, self._deliver_again, again, self._redeliver
        )

    async def _ack_timeouts(self) -> None:
        """Redeliver messages left unacknowledged for ack_timeout_ms."""
        period = max(0.01, self._ack_timeout_s / 4)
        while not self._closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            for position, (message, received_at) in list(self._unacked.items()):
                if now - received_at >= self._ack_timeout_s:
                    del self._unacked[position]
                    self._deliver_again(message.redelivered(), self._redeliver)

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
        if position == LATEST:
            position = await self._scanner.end_position()
        filling = self._fill_task
        if filling is not None:
            filling.cancel()
            await asyncio.gather(filling, return_exceptions=True)
        # From here to the wake-up, no await: a receive() meanwhile sees the new state.
        self._acks.reset(position)
        self._unacked.clear()
        self._queue = EntryQueue(self._queue_size, self._wake)
        self._redeliver = collections.deque()
        self._fill_task = None  # the next receive reads from the new position
        self._wake.set()  # ... including one waiting now
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
        try:
            # (A standby that never received has nothing of its own to write.)
            if persist and (self.is_active or self._dirty):
                self._dirty = True
                await self.persist()
        finally:
            if self._gate is not None:  # the cursor first, then the next in line
                await self._gate.leave()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        return await self.receive()
