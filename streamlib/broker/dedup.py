"""Producer deduplication, as Pulsar's: a producer names itself and numbers its
messages; the owning broker drops a message whose sequence id is not above the last
one it took from that name.

The state is each name's last sequence id (and recent ids' positions, to answer a
duplicate with where the original went). It survives a broker failover: every message
a broker writes carries its producer's name and sequence id (the batch's producer
columns), so the next owner rebuilds the state from a snapshot plus the stream's tail
after it -- read after its takeover fenced the old owner, so nothing the old owner
acknowledged can be missing from it.
"""

from __future__ import annotations

import asyncio
import collections
import json
from dataclasses import dataclass, field

from streamlib.protocol.errors import StreamlibError
from streamlib.stream.positions import EARLIEST, MessageId

MAX_PRODUCERS = 10_000  # names remembered per stream (least recently used go first)
RECENT_IDS = 4096  # per name: the positions of its last sequence ids


@dataclass
class _Name:
    pushed: int = -1  # the last sequence id taken (written or being written)
    durable: int = -1  # the last one acknowledged by the bookies
    recent: collections.OrderedDict[int, MessageId] = field(default_factory=collections.OrderedDict)
    in_flight: dict[int, asyncio.Future[MessageId]] = field(default_factory=dict)


class Dedup:
    def __init__(self) -> None:
        self._names: collections.OrderedDict[str, _Name] = collections.OrderedDict()
        self.position: MessageId = EARLIEST  # the last durable message the state covers
        self.since_snapshot = 0

    def _name(self, name: str) -> _Name:
        state = self._names.get(name)
        if state is None:
            state = self._names[name] = _Name()
            while len(self._names) > MAX_PRODUCERS:
                self._names.popitem(last=False)
        else:
            self._names.move_to_end(name)
        return state

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

    def durable(self, name: str, sequence_id: int, message_id: MessageId | None) -> None:
        """A taken message was written (message_id) or failed (None)."""
        state = self._names.get(name)
        if state is None:
            return
        state.in_flight.pop(sequence_id, None)
        if message_id is not None:
            self.observe(name, sequence_id, message_id)
            self.since_snapshot += 1

    def observe(self, name: str, sequence_id: int, message_id: MessageId) -> None:
        """A message of the stream (a durable one, or one read while recovering)."""
        state = self._name(name)
        state.pushed = max(state.pushed, sequence_id)
        state.durable = max(state.durable, sequence_id)
        state.recent[sequence_id] = message_id
        while len(state.recent) > RECENT_IDS:
            state.recent.popitem(last=False)
        if message_id > self.position:
            self.position = message_id

    # -- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """What the next owner starts from: each name's last durable sequence id and its
        position, and the position up to which that is complete."""
        names = {
            name: [s.durable, *s.recent.get(s.durable, EARLIEST)]
            for name, s in self._names.items()
            if s.durable >= 0
        }
        return json.dumps({"position": list(self.position), "names": names}).encode()

    @classmethod
    def restore(cls, data: bytes | None) -> Dedup:
        """From a snapshot (None or unreadable: from nothing; the tail scan is then the
        whole stream)."""
        dedup = cls()
        if not data:
            return dedup
        try:
            raw = json.loads(data)
            position = MessageId(*(int(v) for v in raw["position"])).checked()
            names: dict[str, tuple[int, MessageId]] = {}
            for name, value in raw["names"].items():
                sequence_id, *parts = (int(x) for x in value)
                names[str(name)] = (sequence_id, MessageId(*parts).checked())
        except (ValueError, KeyError, TypeError, AttributeError, StreamlibError):
            return dedup  # (the tail scan from the start rebuilds it)
        for name, (sequence_id, last_at) in names.items():
            dedup.observe(name, sequence_id, last_at)
        dedup.position = position
        return dedup
