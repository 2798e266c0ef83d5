"""Producer deduplication, as Pulsar's: a producer names itself and numbers its
messages; the owning broker drops a message whose sequence id is not above the last
one it took from that name.

The state is each name's last sequence id (and recent ids' positions, to answer a
duplicate with where the original went). It survives a broker failover: every message
a broker writes carries its producer's name and sequence id (the batch's producer
columns), so the next owner rebuilds the state from a snapshot plus the stream's tail
after it -- read after its takeover fenced the old owner, so nothing the old owner
acknowledged can be missing from it. (Where the snapshot is kept: dedup_store.py.)

The recent ids' positions of every stream of a broker share one budget (RecentBudget):
each name keeps its last total/names of them (at least MIN_RECENT_IDS, at most
RECENT_IDS). 4,096 for each of 10,000 producers at a message a second would have grown
the broker by gigabytes within the hour. A duplicate older than what its name keeps is
still dropped (its sequence id is not above the last); only its answer lacks the
original's position (EARLIEST, as Pulsar answers every duplicate: -1:-1).

A name idle past the inactivity timeout is forgotten (Pulsar's
brokerDeduplicationProducerInactivityTimeoutMinutes, 6 h by default): a producer gone
that long is not resending, and a stream that met thousands of names once each must not
carry them in every snapshot. A name is active when a message of it is checked, taken
or seen; a name with a message in flight, or whose producer is connected, is kept.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time
import weakref
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from streamlib.protocol.errors import StreamlibError
from streamlib.stream.positions import EARLIEST, MessageId

MAX_PRODUCERS = 10_000  # names remembered per stream (least recently used go first)
RECENT_IDS = 4096  # per name: the positions of its last sequence ids, at most
MIN_RECENT_IDS = 16  # ... and at least, however many names share the budget
RECENT_BUDGET = 262_144  # the recent ids of every name of a broker, together
RECOUNT_S = 1.0  # how often the budget counts the names that share it
MAX_NAME_CHARS = 256  # of a producer's name: the broker refuses longer ones
INACTIVITY_TIMEOUT_S = 6 * 3600.0


@dataclass
class _Name:
    pushed: int = -1  # the last sequence id taken (written or being written)
    durable: int = -1  # the last one acknowledged by the bookies
    recent: collections.OrderedDict[int, MessageId] = field(default_factory=collections.OrderedDict)
    in_flight: dict[int, asyncio.Future[MessageId]] = field(default_factory=dict)
    active_at: float = 0.0  # (the Dedup's clock)


def _keep_newest(recent: collections.OrderedDict[int, MessageId], most: int) -> None:
    while len(recent) > most:
        recent.popitem(last=False)


class RecentBudget:
    """The recent ids the Dedups of one broker keep, together: each name keeps `total`
    divided by the names of every stream (counted at most every RECOUNT_S), within
    [MIN_RECENT_IDS, RECENT_IDS]. A name trims its own as it takes new ones; when the
    share falls to half of what a name may have kept, every name is trimmed at once: the
    names together keep at most about twice `total` (or MIN_RECENT_IDS each)."""

    def __init__(self, total: int = RECENT_BUDGET, clock: Callable[[], float] = time.monotonic):
        if total < 1:
            raise ValueError(f"the recent ids budget must be >= 1, got {total}")
        self.total = total
        self._clock = clock
        self._dedups: weakref.WeakSet[Dedup] = weakref.WeakSet()
        self._share = RECENT_IDS
        self._highest = RECENT_IDS  # the most a name may hold since the last trim of all
        self._counted_at = -float("inf")

    def join(self, dedup: Dedup) -> None:
        """A stream's dedup shares the budget from now: trimmed to the share at once (a
        stream taken over comes with what its tail scan saw, up to RECENT_IDS a name)."""
        self._dedups.add(dedup)
        dedup.trim(self.share())

    def share(self) -> int:
        """What each name may keep now."""
        now = self._clock()
        if now - self._counted_at < RECOUNT_S:
            return self._share
        self._counted_at = now
        names = sum(dedup.names_known for dedup in self._dedups)
        self._share = max(MIN_RECENT_IDS, min(RECENT_IDS, self.total // max(1, names)))
        if self._share * 2 <= self._highest:
            for dedup in list(self._dedups):
                dedup.trim(self._share)
            self._highest = self._share
        else:
            self._highest = max(self._highest, self._share)
        return self._share


class Dedup:
    def __init__(
        self,
        inactivity_timeout_s: float = INACTIVITY_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not inactivity_timeout_s > 0:
            raise ValueError(f"the inactivity timeout must be > 0 s, got {inactivity_timeout_s}")
        self._names: collections.OrderedDict[str, _Name] = collections.OrderedDict()
        self.position: MessageId = EARLIEST  # the last durable message the state covers
        self.since_snapshot = 0
        self.inactivity_timeout_s = inactivity_timeout_s
        self._clock = clock
        self._budget: RecentBudget | None = None  # (none: RECENT_IDS a name)

    def share(self, budget: RecentBudget) -> None:
        """Keep recent ids within the broker's budget, from now."""
        self._budget = budget
        budget.join(self)

    def trim(self, most: int) -> None:
        """Keep at most `most` recent ids a name (the newest)."""
        for state in self._names.values():
            _keep_newest(state.recent, most)

    @property
    def names_known(self) -> int:
        return len(self._names)

    def _name(self, name: str) -> _Name:
        state = self._names.get(name)
        if state is None:
            state = self._names[name] = _Name()
            while len(self._names) > MAX_PRODUCERS:
                self._names.popitem(last=False)
        else:
            self._names.move_to_end(name)
        state.active_at = self._clock()
        return state

    def recent(self, name: str, count: int) -> list[tuple[int, MessageId]]:
        """The positions of the name's last `count` durable messages, by sequence id."""
        state = self._names.get(name)
        if state is None:
            return []
        return list(itertools.islice(reversed(state.recent.items()), count))

    def last(self, name: str) -> int:
        state = self._names.get(name)
        return -1 if state is None else state.pushed

    def check(self, name: str, sequence_id: int) -> asyncio.Future[MessageId] | MessageId | None:
        """None: a new message, to write. Otherwise a duplicate: the future of the same
        message still being written, or the position of the original (EARLIEST when it
        is too old to remember)."""
        state = self._name(name)
        if sequence_id > state.pushed:
            return None
        in_flight = state.in_flight.get(sequence_id)
        if in_flight is not None:
            return in_flight
        return state.recent.get(sequence_id, EARLIEST)

    def taken(self, name: str, sequence_id: int, future: asyncio.Future[MessageId]) -> None:
        state = self._name(name)
        state.pushed = max(state.pushed, sequence_id)
        state.in_flight[sequence_id] = future

    def durable(
        self, name: str, sequence_id: int, message_id: MessageId | None, messages: int = 1
    ) -> None:
        """A taken message (or entry of `messages`, by its last sequence id) was written
        (message_id: its last message's) or failed (None)."""
        state = self._names.get(name)
        if state is None:
            return
        state.in_flight.pop(sequence_id, None)
        if message_id is not None:
            self.observe(name, sequence_id, message_id)
            self.since_snapshot += messages

    def observe(self, name: str, sequence_id: int, message_id: MessageId) -> None:
        """A message of the stream (a durable one, or one read while recovering)."""
        if message_id > self.position:
            self.position = message_id
        if len(name) > MAX_NAME_CHARS:
            return  # (no producer of that name can connect: nothing to check against it)
        state = self._name(name)
        state.pushed = max(state.pushed, sequence_id)
        state.durable = max(state.durable, sequence_id)
        state.recent[sequence_id] = message_id
        _keep_newest(state.recent, RECENT_IDS if self._budget is None else self._budget.share())

    def forget_idle(self, keep: Container[str] = ()) -> int:
        """Forget the names idle past the inactivity timeout, except those with a
        message in flight and those in `keep` (connected producers'). How many went."""
        cutoff = self._clock() - self.inactivity_timeout_s
        idle = [
            name
            for name, state in self._names.items()
            if state.active_at <= cutoff and not state.in_flight and name not in keep
        ]
        for name in idle:
            del self._names[name]
        return len(idle)

    # -- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """What the next owner starts from: each name's last durable sequence id, its
        position and how long the name has been idle (whole seconds: clocks are not
        shared between processes), least recently active first; and the position up to
        which that is complete."""
        now = self._clock()
        names = {
            name: [s.durable, *s.recent.get(s.durable, EARLIEST), max(0, int(now - s.active_at))]
            for name, s in self._names.items()
            if s.durable >= 0
        }
        data = {"position": list(self.position), "names": names}
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def restore(
        cls,
        data: bytes | None,
        inactivity_timeout_s: float = INACTIVITY_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> Dedup:
        """From a snapshot (None or unreadable: from nothing; the tail scan is then the
        whole stream). A name's idle time goes on from what the snapshot says; names
        over MAX_NAME_CHARS are skipped."""
        dedup = cls(inactivity_timeout_s, clock)
        if not data:
            return dedup
        try:
            raw = json.loads(data)
            position = MessageId(*(int(v) for v in raw["position"])).checked()
            names: dict[str, tuple[int, MessageId, int]] = {}
            for name, value in raw["names"].items():
                # [sequence id, ledger, entry, batch index] and, since idle times are
                # kept, [..., idle seconds]
                if len(value) not in (4, 5):
                    raise ValueError(f"a name's entry is 4 or 5 numbers: {value!r}")
                sequence_id, *parts = (int(x) for x in value[:4])
                idle_s = int(value[4]) if len(value) == 5 else 0
                if idle_s < 0:
                    raise ValueError(f"a negative idle time: {value!r}")
                names[str(name)] = (sequence_id, MessageId(*parts).checked(), idle_s)
        except (ValueError, KeyError, TypeError, AttributeError, StreamlibError):
            return dedup  # (the tail scan from the start rebuilds it)
        now = clock()
        for name, (sequence_id, last_at, idle_s) in names.items():
            dedup.observe(name, sequence_id, last_at)
            if name in dedup._names:
                dedup._names[name].active_at = now - idle_s
        dedup.position = position
        return dedup
