"""A subscription's dispatch on its stream's owner: the broker's own direct consumer
reads the subscription's cursor, and the dispatch rules (streamlib/protocol/dispatch.py)
hand its entries, whole, to the connected consumers (Pulsar's dispatch: the client
batches, the broker appends a batch as one entry and dispatches it as it is stored, the
consumer unbatches). What a consumer holds is some messages of one entry (`Handed`): all
of them, or those a key_shared subscription routes to it, or those to deliver again.
Acknowledgements come by message (batch-index acks): an entry leaves its consumer's
unacknowledged ones when all of its messages have been acknowledged, and the cursor
takes each acknowledged run of messages as one range."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamlib.broker.access import Budgets
from streamlib.broker.load import Traffic
from streamlib.broker.sessions import ConsumerSession, Done, StreamGone
from streamlib.closing import CloseOnce
from streamlib.protocol.dispatch import ConsumerBusy, Kind, Pending, key_slot
from streamlib.protocol.errors import (
    ConsumerBusyError,
)
from streamlib.stream.consumer import Consumer
from streamlib.stream.message import EntryMessages
from streamlib.stream.positions import MessageId
from streamlib.tasks import Waker

log = logging.getLogger(__name__)

# One entry's acknowledgements: (ledger id, entry id, the indexes of its messages; None:
# all of them).
EntryAcks = Iterable[tuple[int, int, Iterable[int] | None]]


@dataclass(eq=False)
class Handed:
    """Messages of one entry, handed out together: `indexes` (ascending) are those not
    acknowledged yet."""

    entry: EntryMessages
    indexes: list[int]
    redeliveries: int = 0
    cid: int | None = None  # the consumer that holds it

    @property
    def whole(self) -> bool:
        """Every message of the entry (the usual case: the client needs no list)."""
        return len(self.indexes) == len(self.entry.payloads)


class SubscriptionDispatcher:
    """Reads the subscription's cursor through one direct consumer (the broker's) and
    hands the entries out by the dispatch rules (streamlib/protocol/dispatch.py)."""

    def __init__(
        self,
        inner: Consumer,
        kind: Kind,
        nack_delay_s: float,
        on_fail: Callable[[SubscriptionDispatcher, BaseException], None] | None = None,
        budgets: Budgets | None = None,
        traffic: Traffic | None = None,
    ) -> None:
        self.inner = inner
        self.traffic = traffic or Traffic()  # (what it hands out: the load report)
        self.source: Any = inner.source  # (a DirectSubscription: entries, ranges)
        self.dispatch = (budgets or Budgets()).dispatch(kind)
        self.sessions: dict[int, ConsumerSession] = {}
        self._nack_delay_s = nack_delay_s
        self._wake = Waker()
        self._generation = 0  # a seek starts a new one: older redeliveries are dropped
        self._on_fail = on_fail
        self.failed: BaseException | None = None
        self._closing = CloseOnce()
        # What consumers hold, by entry: an ack finds it there.
        self._handed: dict[tuple[int, int], list[Pending]] = {}
        self._serial = itertools.count()  # (what is handed out is told apart by it)
        self._task = self._start_task()

    def add(self, session: ConsumerSession) -> None:
        try:
            self.dispatch.add(session.cid, session.name, session.kind)
        except ConsumerBusy as busy:
            raise ConsumerBusyError(str(busy)) from None
        self.sessions[session.cid] = session
        self._active_changed()
        self._wake.set()

    def remove(self, cid: int) -> None:
        """A consumer left: what it held goes to the others (delivered again)."""
        if self.sessions.pop(cid, None) is None:
            return
        for pending in self.dispatch.unacked_of(cid):
            self._unhand(pending)
            handed = pending.ref
            handed.redeliveries += 1
            handed.cid = None
            # (What is left of it: the next consumer is charged that, not what it was.)
            pending.count = len(handed.indexes)
            pending.size = _charge(handed.entry, handed.indexes)
        self.dispatch.remove(cid)
        self._active_changed()
        self._wake.set()

    def _active_changed(self) -> None:
        if self.dispatch.kind is not Kind.FAILOVER:
            return
        first = self.dispatch.active()
        for cid, session in self.sessions.items():
            active = cid == first
            if active != session.active:
                session.active = active
                session.outbox.put_nowait([])  # (an empty delivery: the RPC re-reads .active)

    def flow(self, cid: int, permits: int) -> None:
        self.dispatch.flow(cid, permits)
        self._wake.set()

    # -- acknowledgements ---------------------------------------------------------------

    def ack(self, cid: int, entries: EntryAcks) -> None:
        """Individual acks (batch-index acks) of messages this consumer holds; others
        are ignored (handed to another since, or never)."""
        for ledger_id, entry_id, indexes in entries:
            for pending, hit in self._hits(cid, ledger_id, entry_id, indexes):
                self._to_cursor(pending.ref.entry, hit)
        self._wake.set()

    def ack_cumulative(self, cid: int, upto: MessageId) -> None:
        """Everything up to `upto` that this consumer holds (the others' messages stay
        theirs: a shared subscription's cumulative ack is the consumer's own)."""
        self.ack(cid, self._held_upto(cid, upto))

    def nack(self, cid: int, entries: EntryAcks) -> None:
        """Negative acks: those messages are delivered again after the subscription's
        redelivery delay (to this consumer or, shared, another)."""
        back = self._taken_back(cid, entries)
        if back:
            asyncio.get_running_loop().call_later(
                self._nack_delay_s, self._redeliver, back, self._generation
            )

    def redeliver_now(self, cid: int, entries: EntryAcks | None = None) -> None:
        """Pulsar's RedeliverUnacknowledgedMessages: those messages (None: all this
        consumer holds) are delivered again at once (its client waited its own delay)."""
        if entries is None:
            entries = [
                (p.ref.entry.ledger_id, p.ref.entry.entry_id, None)
                for p in self.dispatch.unacked_of(cid)
            ]
        back = self._taken_back(cid, entries)
        if back:
            self._redeliver(back, self._generation)

    def _taken_back(self, cid: int, entries: EntryAcks) -> list[Pending]:
        back = []
        for ledger_id, entry_id, indexes in entries:
            for pending, hit in self._hits(cid, ledger_id, entry_id, indexes):
                handed = pending.ref
                back.append(self._pending(handed.entry, hit, pending.slot, handed.redeliveries + 1))
        return back

    def _hits(
        self, cid: int, ledger_id: int, entry_id: int, indexes: Iterable[int] | None
    ) -> list[tuple[Pending, list[int]]]:
        """What of these messages (None: all) this consumer holds, taken from what it
        holds (an entry it no longer holds any of leaves its unacknowledged ones)."""
        found = self._handed.get((ledger_id, entry_id))
        if not found:
            return []
        wanted = set(indexes) if indexes is not None else None
        hits = []
        for pending in list(found):
            handed = pending.ref
            if handed.cid != cid:
                continue
            if wanted is None or wanted.issuperset(handed.indexes):  # (the usual case)
                hit, handed.indexes = handed.indexes, []
            else:
                hit = [i for i in handed.indexes if i in wanted]
                if not hit:
                    continue
                handed.indexes = [i for i in handed.indexes if i not in wanted]
            hits.append((pending, hit))
            if not handed.indexes:
                self.dispatch.ack(cid, pending.message_id)
                self._unhand(pending)
        return hits

    def _held_upto(self, cid: int, upto: MessageId) -> list[tuple[int, int, list[int]]]:
        last = (upto.ledger_id, upto.entry_id)
        held = []
        for pending in self.dispatch.unacked_of(cid):
            handed = pending.ref
            where = (handed.entry.ledger_id, handed.entry.entry_id)
            if where < last:
                held.append((*where, list(handed.indexes)))
            elif where == last:
                held.append((*where, [i for i in handed.indexes if i <= upto.batch_index]))
        return held

    def _to_cursor(self, entry: EntryMessages, hit: list[int]) -> None:
        """Acknowledged messages of an entry (ascending), to the cursor: a range per run
        of consecutive ones (each from the message before it)."""
        ledger_id, entry_id = entry.ledger_id, entry.entry_id
        first = last = hit[0]
        for index in itertools.chain(hit[1:], (None,)):
            if index is not None and index == last + 1:
                last = index
                continue
            lower = (
                entry.previous
                if first == entry.start
                else MessageId(ledger_id, entry_id, first - 1)
            )
            self.source.acknowledge_range(lower, MessageId(ledger_id, entry_id, last))
            if index is not None:
                first = last = index

    def _unhand(self, pending: Pending) -> None:
        entry = pending.ref.entry
        where = (entry.ledger_id, entry.entry_id)
        found = self._handed.get(where)
        if found is not None:
            found.remove(pending)
            if not found:
                del self._handed[where]

    def _redeliver(self, back: list[Pending], generation: int) -> None:
        if generation != self._generation:  # a seek came between: these are the past
            return
        self.dispatch.redeliver(back)
        self._wake.set()

    # -- reading and handing out --------------------------------------------------------

    def _start_task(self) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._run())
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The reading loop stopped: cancelled (a seek, the end), or failed (a read no
        bookie could serve, ...): then every consumer is told, and reconnects to a new
        dispatcher."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        assert error is not None
        log.warning("subscription %s: reading failed: %s", self.inner.subscription, error)
        self.failed = StreamGone(f"the subscription's reading failed: {error}")
        self.disconnect_all(str(self.failed))
        if self._on_fail is not None:
            self._on_fail(self, self.failed)

    async def _run(self) -> None:
        """Read while someone can take messages; deliver what the rules allow. (A read
        waits in a task of its own: a consumer leaving or acking must not wait for the
        next entry to be handed out.)"""
        loop = asyncio.get_running_loop()
        source = self.source
        reading: asyncio.Task[tuple[EntryMessages, list[int]]] | None = None
        try:
            while True:
                while reading is None and self.dispatch.wants_more():
                    taken = source.take_entry()
                    if taken is None:
                        break
                    self._offer(*taken)
                self._deliver()
                if reading is None and self.dispatch.wants_more():
                    reading = loop.create_task(self._next_entry())
                    reading.add_done_callback(lambda _: self._wake.set())
                # (one future per wait, woken by a set() or the read: no task for it)
                await self._wake.wait(already=reading is not None and reading.done())
                if reading is not None and reading.done():
                    self._offer(*reading.result())
                    reading = None
        finally:
            if reading is not None:
                reading.cancel()

    async def _next_entry(self) -> tuple[EntryMessages, list[int]]:
        """The next entry to hand out, waiting for it (and for the broker's own
        consumer's turn: another broker may still hold the subscription)."""
        source = self.source
        while True:
            await source.prepare()
            taken = source.take_entry()
            if taken is not None:
                return taken  # type: ignore[no-any-return]
            source.wake.clear()
            taken = source.take_entry()  # (what came before the clear)
            if taken is not None:
                return taken  # type: ignore[no-any-return]
            await source.wake.wait()

    def _offer(self, entry: EntryMessages, indexes: list[int]) -> None:
        if self.dispatch.kind is Kind.KEY_SHARED:
            for slot, some in _by_slot(entry, indexes):
                self.dispatch.offer(self._pending(entry, some, slot))
        else:
            self.dispatch.offer(self._pending(entry, indexes, 0))

    def _pending(
        self, entry: EntryMessages, indexes: list[int], slot: int, redeliveries: int = 0
    ) -> Pending:
        handed = Handed(entry, indexes, redeliveries)
        key = (entry.ledger_id, entry.entry_id, indexes[0], next(self._serial))
        return Pending(handed, key, slot, _charge(entry, indexes), len(indexes))

    def _deliver(self) -> None:
        """Hand out what the rules allow: to each consumer, an entry once however many
        of its parts (key_shared's slots) go to it together."""
        grouped: dict[int, dict[tuple[int, int, int], Handed]] = collections.defaultdict(dict)
        traffic = self.traffic
        for cid, pending in self.dispatch.deliveries():
            traffic.msgs_out += pending.count
            traffic.bytes_out += pending.size
            handed = pending.ref
            handed.cid = cid
            entry = handed.entry
            where = (entry.ledger_id, entry.entry_id)
            self._handed.setdefault(where, []).append(pending)
            to_one = grouped[cid]  # type: ignore[index]
            together = to_one.get((*where, handed.redeliveries))
            if together is None:
                to_one[(*where, handed.redeliveries)] = Handed(
                    entry, list(handed.indexes), handed.redeliveries
                )
            else:
                together.indexes = sorted(together.indexes + handed.indexes)
        for cid, handed_out in grouped.items():
            session = self.sessions.get(cid)
            if session is not None:
                session.outbox.put_nowait(list(handed_out.values()))

    async def seek(self, target: MessageId | int) -> None:
        """Move the cursor (Pulsar's seek): what was read or handed out is forgotten,
        the cursor is written, and every consumer is disconnected: each reconnects and
        receives from the new position. (A seek that fails disconnects them too: they
        start again from the cursor as it is.)"""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        # Forget what was handed out BEFORE the cursor moves: an ack of it arriving while
        # the seek runs must find nothing to pass on (applied to the moved cursor, it would
        # skip that message for good). A seek that fails disconnects every consumer too.
        self._generation += 1
        self.dispatch.reset()
        self._handed.clear()
        try:
            await self.inner.seek(target)
        finally:
            self._task = self._start_task()

    def disconnect_all(self, why: str, done: Done | None = None, to: int | None = None) -> None:
        for cid, session in self.sessions.items():
            if done is not None and cid == to:
                session.outbox.put_nowait(done)
            session.outbox.put_nowait(StreamGone(why))

    async def unsubscribe(self, cid: int) -> None:
        """Delete the subscription; ConsumerBusyError while others are connected."""
        others = [c for c in self.sessions if c != cid]
        if others:
            raise ConsumerBusyError(
                f"subscription {self.inner.subscription!r} has {len(others)} other consumers"
            )
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self.inner.unsubscribe()
        except BaseException:
            self._task = self._start_task()  # it stays: reading goes on
            raise

    async def close(self) -> None:
        """Stop reading and close the direct consumer (persisting its cursor, leaving
        the subscription's line): to its end even when the RPC that closes is cancelled
        (closing.py), or the next dispatcher of the subscription waits behind it."""
        await self._closing.run(self._close)

    async def _close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.inner.close()


def _charge(entry: EntryMessages, indexes: list[int]) -> int:
    """The bytes some messages of an entry count for (its share of the entry)."""
    return max(1, len(entry.stored()) * len(indexes) // len(entry.payloads))


def _by_slot(entry: EntryMessages, indexes: list[int]) -> list[tuple[int, list[int]]]:
    """Key_shared: the entry's messages by hash slot, each slot's in order (an entry of
    several keys is split: a key never goes to two consumers). A message without a key
    hashes by its entry's position (an entry of such messages goes whole)."""
    where = (entry.ledger_id, entry.entry_id)
    metadata = entry.metadata
    if metadata is None:
        return [(key_slot(None, where), indexes)]
    slots: dict[int, list[int]] = {}
    for i in indexes:
        one = metadata[i]
        key = one.key if one.HasField("key") else None
        ordering = one.ordering_key if one.HasField("ordering_key") else None
        slots.setdefault(key_slot(key, where, ordering), []).append(i)
    return list(slots.items())
