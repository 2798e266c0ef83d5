"""Direct mode's durable subscription: this process reads the stream's ledgers itself
(read ahead, whole entries), delivers in order with redeliveries first and delayed
messages when due, and keeps the subscription's cursor (mark-delete position +
individually acknowledged ranges) beside the stream in the metadata store, written by
CAS at most every `cursor_persist_interval_ms` and on close. After a crash the consumer
resumes after the persisted mark-delete position and skips persisted individual acks:
only what was not acknowledged (or whose acknowledgement had not been persisted yet)
comes again -- at-least-once, as in Pulsar. A Consumer (consumer.py) receives through it.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

from metadata.errors import BadVersionError
from metadata.schemas import CursorState, Position, PositionRange
from metadata.services.streams import StreamRegistry
from streamlib.protocol.errors import (
    BadRequestError,
)
from streamlib.stream.ack_ranges import AckRanges
from streamlib.stream.message import EntryMessages, new_message
from streamlib.stream.positions import (
    EARLIEST,
    LATEST,
    MessageId,
    position_before,
)
from streamlib.stream.reader import (
    EntryQueue,
    Message,
    StreamScanner,
)
from streamlib.stream.subscription import SubscriptionGate
from streamlib.stream.writer import now_ms
from streamlib.tasks import HeldTasks


def position_to_pb(position: MessageId) -> Position:
    return Position(
        ledger_id=position.ledger_id, entry_id=position.entry_id, batch_index=position.batch_index
    )


def position_from_pb(position: Position) -> MessageId:
    return MessageId(position.ledger_id, position.entry_id, position.batch_index)


def ranges_to_state(
    acks: AckRanges, properties: dict[str, int] | None = None, *, read_compacted: bool = False
) -> CursorState:
    return CursorState(
        read_compacted=read_compacted,
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


# The most delayed messages a consumer holds before it stops reading ahead (until the
# first of them is due): what deliver_at / deliver_after can make it keep in memory.
MAX_HELD_MESSAGES = 100_000


class DirectSubscription:
    """Direct mode's subscription: reads the stream's ledgers itself (read ahead, whole
    entries), delivers in order with redeliveries first and delayed messages when due,
    and writes the cursor (CAS) at most every cursor_persist_interval_ms and on close.
    The subscription type's gate (streamlib/stream/subscription.py) says when it may
    deliver: a consumer that becomes active starts from the durable cursor."""

    acks_by_message = True  # (a cursor range starts at the message before it)

    def __init__(
        self,
        scanner: StreamScanner,
        registry: StreamRegistry,
        subscription: str,
        acks: AckRanges,
        version: int,
        *,
        receiver_queue_size: int = 1000,
        cursor_persist_interval_ms: int = 100,
        gate: SubscriptionGate | None = None,
        schema: Any = None,
    ) -> None:
        if receiver_queue_size < 1:
            raise BadRequestError("receiver_queue_size must be >= 1")
        if cursor_persist_interval_ms < 0:
            raise BadRequestError("cursor_persist_interval_ms must be >= 0")
        self._scanner = scanner
        self._registry = registry
        self.stream = scanner.name
        self.subscription = subscription
        self._acks = acks
        self._version = version
        self.forget_received: Callable[[], None] = lambda: None
        # Whole entries read ahead, and messages to deliver again. `wake` is set when
        # either gets more.
        self._queue_size = receiver_queue_size
        self.wake = asyncio.Event()
        self._schema = schema  # what message.value() decodes with
        self._queue = EntryQueue(receiver_queue_size, self.wake, schema)
        self._redeliver: collections.deque[Message] = collections.deque()
        self._persist_interval_s = cursor_persist_interval_ms / 1000.0
        self._dirty = False
        self._persist_timer: asyncio.TimerHandle | None = None
        self._persisting: asyncio.Task[None] | None = None
        self._persist_lock = asyncio.Lock()
        self._fill_task: asyncio.Task[None] | None = None
        self._closed = False
        self.persisted = 0  # cursor writes (observability)
        self._gate = gate
        self._reload_cursor = False
        if gate is not None:
            gate.on_change = self._on_active_change
        # Delayed messages not due yet: a heap of (deliver at ms, order, message).
        self._held: list[tuple[int, int, Message]] = []
        self._held_order = itertools.count()
        self._held_timer: asyncio.TimerHandle | None = None
        self._tasks = HeldTasks(f"subscription {subscription!r}")  # (reading ahead)

    @property
    def consumer_type(self) -> str:
        return self._gate.kind.value if self._gate is not None else "exclusive"

    @property
    def is_active(self) -> bool:
        return self._gate is None or self._gate.active.is_set()

    @property
    def mark_delete_position(self) -> MessageId:
        return self._acks.mark_delete

    def _on_active_change(self, active: bool) -> None:
        if active:
            self._reload_cursor = True
            self.wake.set()
            return
        # Another consumer may be active now: what was read ahead or handed out and not
        # acknowledged is its to deliver. Stop reading; drop it all.
        if self._fill_task is not None:
            self._fill_task.cancel()  # (held: close() waits for it)
            self._fill_task = None
        self._forget_read()
        self.wake.set()  # a receive() waiting now goes back to waiting for its turn

    async def prepare(self) -> None:
        """Wait to be the subscription's active consumer (a new turn starts from the
        cursor as stored: the previous active one persisted it on its way out), and
        read ahead."""
        if self._gate is not None:
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
                    self._forget_read()
        self._start()  # (again, if a seek or a change of turn stopped it)

    def _forget_read(self) -> None:
        """Drop what was read ahead, held or handed out (another turn, or a seek)."""
        self._queue = EntryQueue(self._queue_size, self.wake, self._schema)
        self._redeliver = collections.deque()
        self.forget_received()
        self._held = []
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None

    def _start(self) -> None:
        if self._fill_task is None and not self._closed:
            self._scanner.start_after = self._acks.mark_delete
            self._fill_task = self._tasks.spawn(self._queue.fill(self._scanner))

    def take(self) -> Message | None:
        """The next message to deliver, if one is here now: redeliveries first, then
        delayed messages now due, then the read-ahead messages not acknowledged yet
        (individual acks persisted before a restart); a message delayed past now is held
        (at most MAX_HELD_MESSAGES: then reading ahead waits for the first to be due)."""
        if not self.is_active or self._reload_cursor:
            return None
        self._start()
        first = self._again_or_due()
        if first is not None:
            return first
        acks, held = self._acks, self._held
        now = 0
        while len(held) < MAX_HELD_MESSAGES:
            message = self._queue.take_nowait()
            if message is None:
                break
            if acks.is_acked(message.message_id):
                self._cover_gap(message.previous, message.message_id)
                continue
            if message._entry.deliver_at is None:  # (the usual case: no delayed message)
                return message
            deliver_at = message.deliver_at_ms
            if deliver_at and deliver_at > (now := now or now_ms()):
                heapq.heappush(held, (deliver_at, next(self._held_order), message))
                continue
            return message
        if held:
            self._wake_when_due(held[0][0])
        return None

    def _again_or_due(self) -> Message | None:
        """A message to deliver before what was read ahead: one given back (not
        acknowledged since), else a delayed one now due."""
        acks = self._acks
        while self._redeliver:
            again = self._redeliver.popleft()
            if not acks.is_acked(again.message_id):  # (acknowledged since it timed out?)
                return again
        held = self._held
        now = now_ms() if held else 0
        while held and held[0][0] <= now:
            due = heapq.heappop(held)[2]
            if not acks.is_acked(due.message_id):
                return due
        return None

    def take_entry(self) -> tuple[EntryMessages, list[int]] | None:
        """take(), by entry (a broker dispatches entries whole): an entry and the
        indexes of its messages to deliver now -- those not acknowledged and due (a
        delayed message is held as take() holds it, and comes as an entry of one)."""
        if not self.is_active or self._reload_cursor:
            return None
        self._start()
        first = self._again_or_due()
        if first is not None:
            return first._entry, [first._index]
        held = self._held
        now = now_ms() if held else 0
        while len(held) < MAX_HELD_MESSAGES:
            entry = self._queue.take_entry_nowait()
            if entry is None:
                break
            indexes = self._not_acked(entry)
            if indexes and entry.deliver_at is not None:
                indexes = self._due_now(entry, indexes, now or now_ms())
            if indexes:
                return entry, indexes
        if held:
            self._wake_when_due(held[0][0])
        return None

    def _not_acked(self, entry: EntryMessages) -> list[int]:
        """The indexes of the entry's messages (from its start) not acknowledged: all of
        them, unless the cursor holds individual acks past its mark-delete position."""
        acks = self._acks
        ledger_id, entry_id, count = entry.ledger_id, entry.entry_id, len(entry.payloads)
        mark = acks.mark_delete
        if (ledger_id, entry_id, count - 1) <= mark:
            return []
        first = MessageId(ledger_id, entry_id, entry.start)
        if first > mark and acks.is_acked(first):
            self._cover_gap(entry.previous, first)
        if not acks.has_ranges() and (ledger_id, entry_id, entry.start) > mark:
            return list(range(entry.start, count))
        return [
            i
            for i in range(entry.start, count)
            if not acks.is_acked(MessageId(ledger_id, entry_id, i))
        ]

    def _due_now(self, entry: EntryMessages, indexes: list[int], now: int) -> list[int]:
        """Those of the indexes due now; the others are held until their time."""
        deliver_at = entry.deliver_at
        assert deliver_at is not None
        due = []
        for i in indexes:
            at = deliver_at[i]
            if at and at > now:
                heapq.heappush(self._held, (at, next(self._held_order), new_message(entry, i)))
            else:
                due.append(i)
        return due

    def keep_entries(self) -> None:
        """Keep the bytes of the entries read (a broker hands entries on as stored)."""
        self._scanner.keep_raw = True

    def _cover_gap(self, previous: MessageId, acked: MessageId) -> None:
        """A message acknowledged before (individual acks of an earlier session) comes
        again after `previous`: what lies between -- messages a compacted view left out
        since, which never come -- is acknowledged with it, or the mark-delete position
        would wait on them forever."""
        acks = self._acks
        if previous < acked:
            before = (acks.mark_delete, acks.range_count)
            acks.ack(previous, acked)
            if (acks.mark_delete, acks.range_count) != before:
                self._changed()

    def acknowledge_range(self, lower: MessageId, upper: MessageId) -> None:
        """Acknowledge the messages in (lower, upper] (a broker's dispatch, by entry)."""
        self._acks.ack_range(lower, upper)
        self._changed()

    def _wake_when_due(self, due_ms: int) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, (due_ms - now_ms()) / 1000.0)
        if self._held_timer is not None:
            if self._held_timer.when() <= when:
                return
            self._held_timer.cancel()
        self._held_timer = loop.call_at(when, self._held_due)

    def _held_due(self) -> None:
        self._held_timer = None
        self.wake.set()

    def _deliver_again(self, message: Message, into: collections.deque[Message]) -> None:
        into.append(message)  # (dropped if a seek replaced the deque meanwhile)
        if into is self._redeliver:
            self.wake.set()

    # -- acknowledging ------------------------------------------------------------------

    @staticmethod
    def _message(message: Message | MessageId) -> Message:
        if isinstance(message, MessageId):
            raise BadRequestError(f"message {message} was not received by this consumer")
        return message

    def acknowledge(self, message: Message | MessageId) -> None:
        message = self._message(message)
        self._acks.ack(message.previous, message.message_id)
        self._changed()

    def acknowledge_cumulative(self, position: MessageId) -> None:
        self._acks.ack_cumulative(position)
        self._changed()

    def give_back(self, message: Message | MessageId, delay_s: float) -> None:
        again = self._message(message).redelivered()
        if delay_s <= 0:
            self._deliver_again(again, self._redeliver)
            return
        asyncio.get_running_loop().call_later(delay_s, self._deliver_again, again, self._redeliver)

    # -- the durable cursor -------------------------------------------------------------

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
        """Write the cursor now (CAS; this consumer owns the subscription's cursor).
        One write at a time: a call while the background persist writes waits for it,
        then writes what was acknowledged since. (Two writes of one version side by
        side made the loser take the winner's older cursor for an admin's reset, and
        forget acknowledgements: the cursor then stuck below them.)"""
        async with self._persist_lock:
            while self._dirty:
                self._dirty = False
                state = ranges_to_state(self._acks, read_compacted=self._scanner.read_compacted)
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

    async def seek(self, target: MessageId | int) -> None:
        if isinstance(target, MessageId):
            # (the symbolic ones are positions already: "before" them is not)
            position = target if target in (EARLIEST, LATEST) else position_before(target)
        else:
            position = await self._scanner.position_before_time(target)
        if position == LATEST:
            position = await self._scanner.end_position()
        filling = self._fill_task
        if filling is not None:
            filling.cancel()
            await asyncio.gather(filling, return_exceptions=True)
        # From here to the wake-up, no await: a receive() meanwhile sees the new state.
        self._acks.reset(position)
        self._forget_read()
        self._fill_task = None  # the next receive reads from the new position
        self.wake.set()  # ... including one waiting now
        self._dirty = True
        await self.persist()
        await self._registry.cursor_moved_back(self.stream)  # retention must see it now

    async def unsubscribe(self) -> None:
        """Delete the subscription (its cursor); the consumer closes after."""
        await self.close(persist=False)
        await self._registry.delete_cursor(self.stream, self.subscription)

    async def close(self, persist: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self._persist_timer is not None:
            self._persist_timer.cancel()
        if self._held_timer is not None:
            self._held_timer.cancel()
        self.wake.set()
        await self._tasks.close()  # (reading ahead: this one's, and any stopped before)
        if self._persisting is not None:
            await asyncio.gather(self._persisting, return_exceptions=True)
        try:
            # (A standby that never received has nothing of its own to write.)
            if persist and (self.is_active or self._dirty):
                self._dirty = True
                await self.persist()
        finally:
            if self._gate is not None:  # the cursor first, then the next in line
                await self._gate.leave()
