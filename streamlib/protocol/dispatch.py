"""Which consumer of a subscription gets which message: the broker's dispatch rules.

Sans-I/O (no asyncio, no clocks): the broker feeds it the consumers that come and go,
their flow permits, the messages read from the subscription's cursor and the acks; it
answers with the deliveries to make. One Dispatch per subscription on its owning broker.

- exclusive: one consumer; a second is refused (ConsumerBusy).
- failover: the first consumer (in arrival order) receives; the others stand by and
  take over, in order, when it leaves; its unacknowledged messages go to the next.
- shared: round robin over the consumers that have permits; a consumer that leaves
  has its unacknowledged messages delivered to the others.
- key_shared: a message goes to the consumer that owns its key's hash slot (consistent
  hashing, so a consumer coming or going moves few slots); its ordering key, when it has
  one, is the key that counts (Pulsar's rule). Per-key order holds across such moves: a
  slot's messages wait while a consumer other than its new owner still has messages of
  that slot unacknowledged, and a waiting slot's later messages wait behind them
  (Pulsar's Key_Shared with its "recently joined consumers" rule does the same thing by
  read position).

What it hands out is opaque to it (a `Pending(ref, message_id, slot, size, count)`):
the broker hands out whole entries, `count` messages each (Pulsar's dispatch of batches):
one costs a consumer `count` permits -- an entry goes whole to a consumer with any
permit left, which may then owe some (Pulsar's too) -- and counts `count` messages
against its unacknowledged budget. It never reads ahead more than `max_pending`
messages or `max_pending_bytes`, and hands a consumer no more while it holds
`max_unacked` messages or `max_unacked_bytes` unacknowledged (at least one entry always
goes: an entry larger than a budget is not stuck), so a subscription's memory is bounded
in bytes whatever permits its consumers grant.
"""

from __future__ import annotations

import bisect
import collections
import enum
import zlib
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import mmh3

SLOTS = 1 << 16
POINTS_PER_CONSUMER = 64


class Kind(enum.Enum):
    EXCLUSIVE = "exclusive"
    FAILOVER = "failover"
    SHARED = "shared"
    KEY_SHARED = "key_shared"


def key_slot(key: str | None, message_id: Hashable, ordering_key: bytes | None = None) -> int:
    """The hash slot of a message: by its ordering key when it has one, else by its key
    (Pulsar's Key_Shared order); a message with neither hashes by its id, as Pulsar's
    Key_Shared spreads them. An ordering key and a key of the same UTF-8 bytes share a
    slot. The hash is Pulsar's broker's: Murmur3_32Hash (murmur3 x86 32-bit, seed 0, sign
    bit cleared) modulo its 65,536 slots."""
    if ordering_key is not None:
        return _murmur3(ordering_key) % SLOTS
    text = key if key is not None else repr(message_id)
    return _murmur3(text.encode()) % SLOTS


def _murmur3(data: bytes) -> int:
    return int(mmh3.hash(data, 0, signed=False)) & 0x7FFFFFFF


@dataclass
class Pending:
    ref: Any  # what the broker delivers (an entry's messages)
    message_id: Any  # ordered and hashable, unique among those in flight
    slot: int
    size: int = 0  # bytes it holds
    count: int = 1  # messages it holds


@dataclass
class _Consumer:
    cid: Hashable
    name: str
    permits: int = 0
    unacked: dict[Hashable, Pending] = field(default_factory=dict)
    unacked_bytes: int = 0
    unacked_count: int = 0  # messages in `unacked`


class ConsumerBusy(Exception):
    """The subscription refuses this consumer (exclusive and taken, or another type)."""


class Dispatch:
    def __init__(
        self,
        kind: Kind,
        max_pending: int = 1000,
        max_unacked: int = 50_000,
        *,
        max_pending_bytes: int = 4 << 20,
        max_unacked_bytes: int = 8 << 20,
    ) -> None:
        self.kind = kind
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.max_unacked_bytes = max_unacked_bytes
        # A consumer holding this many unacknowledged messages gets no more until it
        # acknowledges (Pulsar's maxUnackedMessagesPerConsumer): its permits come back as
        # it receives, so without this a consumer that never acks would grow the broker.
        self.max_unacked = max_unacked
        self._consumers: dict[Hashable, _Consumer] = {}  # arrival order
        self._queue: collections.deque[Pending] = collections.deque()  # not yet delivered
        self._queue_bytes = 0
        self._queue_count = 0  # messages in the queue
        self._robin = 0
        self._ring: list[tuple[int, Hashable]] = []  # key_shared: (point, consumer)
        # key_shared: per slot, consumer -> its unacknowledged messages of the slot.
        self._slot_unacked: dict[int, collections.Counter[Hashable]] = {}

    # -- consumers ----------------------------------------------------------------------

    def add(self, cid: Hashable, name: str, kind: Kind) -> None:
        if kind is not self.kind:
            holder = next(iter(self._consumers.values())).name if self._consumers else "?"
            raise ConsumerBusy(
                f"the subscription has an active {self.kind.value} consumer ({holder}); "
                f"a {kind.value} consumer cannot join"
            )
        if self.kind is Kind.EXCLUSIVE and self._consumers:
            holder = next(iter(self._consumers.values())).name
            raise ConsumerBusy(
                f"the subscription already has an active consumer (exclusive, {holder}): an "
                f"exclusive subscription takes one; use consumer_type='failover' for a "
                f"standby, or another subscription name"
            )
        self._consumers[cid] = _Consumer(cid, name)
        self._rebuild_ring()

    def remove(self, cid: Hashable) -> None:
        """A consumer left: its unacknowledged messages go first to the others."""
        gone = self._consumers.pop(cid, None)
        if gone is None:
            return
        back = sorted(gone.unacked.values(), key=lambda p: p.message_id)
        for pending in back:
            self._forget_slot(pending.slot, cid)
        self._queue_first(back)
        self._rebuild_ring()

    def unacked_of(self, cid: Hashable) -> list[Pending]:
        consumer = self._consumers.get(cid)
        return [] if consumer is None else list(consumer.unacked.values())

    def reset(self) -> None:
        """A seek moved the cursor: nothing delivered is outstanding any more, nothing
        read is queued, and every consumer starts again without permits (each one
        reconnects and gives its own)."""
        self._queue.clear()
        self._queue_bytes = 0
        self._queue_count = 0
        self._slot_unacked.clear()
        for consumer in self._consumers.values():
            consumer.unacked.clear()
            consumer.unacked_bytes = 0
            consumer.unacked_count = 0
            consumer.permits = 0

    def consumers(self) -> list[Hashable]:
        return list(self._consumers)

    def active(self) -> Hashable | None:
        """Failover: the consumer that receives (the first to arrive)."""
        return next(iter(self._consumers), None)

    def flow(self, cid: Hashable, permits: int) -> None:
        consumer = self._consumers.get(cid)
        if consumer is not None:
            consumer.permits += max(0, permits)

    # -- messages -----------------------------------------------------------------------

    def wants_more(self) -> bool:
        """Whether reading another message from the cursor is useful now."""
        if self._queue_count >= self.max_pending or self._queue_bytes >= self.max_pending_bytes:
            return False
        return any(self._can_take(c) for c in self._receivers())

    def _can_take(self, consumer: _Consumer) -> bool:
        return (
            consumer.permits > 0
            and consumer.unacked_count < self.max_unacked
            and consumer.unacked_bytes < self.max_unacked_bytes
        )

    def offer(self, pending: Pending) -> None:
        self._queue.append(pending)
        self._queue_bytes += pending.size
        self._queue_count += pending.count

    def redeliver(self, pendings: Iterable[Pending]) -> None:
        """Messages to deliver again before the others (a negative ack's, when due)."""
        self._queue_first(sorted(pendings, key=lambda p: p.message_id))

    def _queue_first(self, pendings: list[Pending]) -> None:
        self._queue.extendleft(reversed(pendings))
        self._queue_bytes += sum(p.size for p in pendings)
        self._queue_count += sum(p.count for p in pendings)

    def ack(self, cid: Hashable, message_id: Hashable) -> Pending | None:
        consumer = self._consumers.get(cid)
        if consumer is None:
            return None
        pending = consumer.unacked.pop(message_id, None)
        if pending is not None:
            consumer.unacked_bytes -= pending.size
            consumer.unacked_count -= pending.count
            self._forget_slot(pending.slot, cid)
        return pending

    def take_back(self, cid: Hashable, message_id: Hashable) -> Pending | None:
        """A consumer's negative ack: the message is no longer its (the broker
        redelivers it after the delay, with redeliver())."""
        return self.ack(cid, message_id)

    def deliveries(self) -> list[tuple[Hashable, Pending]]:
        """What to deliver now, in order: (consumer, message)."""
        out: list[tuple[Hashable, Pending]] = []
        if not self._consumers or not self._queue:
            return out
        if self.kind is Kind.KEY_SHARED:
            return self._key_shared()
        receivers = self._receivers()
        while self._queue:
            target = self._next_with_permits(receivers)
            if target is None:
                break
            self._give(target, self._queue.popleft(), out)
        return out

    def _receivers(self) -> list[_Consumer]:
        if self.kind in (Kind.EXCLUSIVE, Kind.FAILOVER):
            first = next(iter(self._consumers.values()), None)
            return [] if first is None else [first]
        return list(self._consumers.values())

    def _next_with_permits(self, receivers: list[_Consumer]) -> _Consumer | None:
        for step in range(len(receivers)):
            candidate = receivers[(self._robin + step) % len(receivers)]
            if self._can_take(candidate):
                self._robin = (self._robin + step + 1) % len(receivers)
                return candidate
        return None

    def _give(
        self, consumer: _Consumer, pending: Pending, out: list[tuple[Hashable, Pending]]
    ) -> None:
        consumer.permits -= pending.count
        consumer.unacked[pending.message_id] = pending
        consumer.unacked_bytes += pending.size
        consumer.unacked_count += pending.count
        self._queue_bytes -= pending.size
        self._queue_count -= pending.count
        out.append((consumer.cid, pending))

    # -- key_shared ---------------------------------------------------------------------

    def _rebuild_ring(self) -> None:
        if self.kind is not Kind.KEY_SHARED:
            return
        ring: list[tuple[int, Hashable]] = []
        for consumer in self._consumers.values():
            for point in range(POINTS_PER_CONSUMER):
                # (name and id: two consumers may share a name, and each needs slots)
                where = f"{consumer.name}#{consumer.cid}#{point}".encode()
                ring.append((zlib.crc32(where) % SLOTS, consumer.cid))
        ring.sort(key=lambda p: p[0])
        self._ring = ring

    def owner(self, slot: int) -> Hashable | None:
        """The consumer a slot's messages go to (key_shared)."""
        if not self._ring:
            return None
        at = bisect.bisect_left(self._ring, slot, key=lambda p: p[0])
        return self._ring[at % len(self._ring)][1]

    def _key_shared(self) -> list[tuple[Hashable, Pending]]:
        out: list[tuple[Hashable, Pending]] = []
        blocked: set[int] = set()  # slots with an earlier message waiting: keep order
        kept: collections.deque[Pending] = collections.deque()
        while self._queue:
            pending = self._queue.popleft()
            slot = pending.slot
            if slot not in blocked:
                target = self._consumers.get(self.owner(slot))  # type: ignore[arg-type]
                holders = self._slot_unacked.get(slot)
                free = target is not None and (not holders or all(c == target.cid for c in holders))
                if free and target is not None and self._can_take(target):
                    self._give(target, pending, out)
                    self._slot_unacked.setdefault(slot, collections.Counter())[target.cid] += 1
                    continue
                blocked.add(slot)
            kept.append(pending)
        self._queue = kept
        return out

    def _forget_slot(self, slot: int, cid: Hashable) -> None:
        holders = self._slot_unacked.get(slot)
        if holders is None:
            return
        holders[cid] -= 1
        if holders[cid] <= 0:
            del holders[cid]
        if not holders:
            del self._slot_unacked[slot]

    def queued(self) -> int:
        return len(self._queue)
