"""A simulated cluster for the protocol state machines: bookies, a CAS metadata store
and a network with seeded delays, drops and bookie crashes.

Everything runs on one virtual clock from one random.Random(seed), so a seed replays
exactly. The bookies implement the bookie rules of ARCHITECTURE.md §3 / §5 (durable
before answering, fence, master key, recovery adds pass the fence, terms, truncate),
nothing more: this is the environment the real state machines are tested against.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bookie import ledger_rules as rules
from bookie.errors import RequestError
from bookie.ledger_rules import LedgerState
from streamlib.protocol import LedgerMetadata
from streamlib.protocol.actions import (
    ADD_FLAG_RECOVERY,
    ADD_FLAG_TRUNCATE,
    Action,
    ChooseBookies,
    EntryData,
    ReadEntry,
    ReadLac,
    ReadMetadata,
    SendAdd,
    WriteMetadata,
)
from streamlib.protocol.errors import NotEnoughBookiesError, StatusCode
from streamlib.protocol.events import (
    AddResults,
    BookiesChosen,
    BookiesUnavailable,
    Event,
    LacResult,
    MetadataConflict,
    MetadataRead,
    MetadataWritten,
    ReadResult,
)


@dataclass
class SimLedgerState:
    """A ledger on a simulated bookie: the real bookie's state (decided by the real
    bookie's rules, bookie/ledger_rules.py) and its entries."""

    state: LedgerState
    entries: dict[int, EntryData] = field(default_factory=dict)


def _refused(err: RequestError) -> int:
    return StatusCode(int(err.status))


class SimBookie:
    """One bookie. Its state survives crashes: it only answers once an add is durable,
    and a crash loses only messages in flight (the network drops them). Every decision
    about the ledger's state is the real bookie's (bookie/ledger_rules.py); fences of
    ledgers unknown here behave as on a bookie without a metadata store (the simulated
    clients only fence ledgers that exist)."""

    def __init__(self, bookie_id: str) -> None:
        self.id = bookie_id
        self.alive = True
        self.ledgers: dict[int, SimLedgerState] = {}

    def add(
        self, ledger_id: int, entry: EntryData, master_key: bytes, flags: int, term: int
    ) -> int:
        known = self.ledgers.get(ledger_id)
        try:
            state, _ = rules.check_add(
                ledger_id, known.state if known else None, master_key, flags, term, read_only=False
            )
            if known is None:
                known = self.ledgers[ledger_id] = SimLedgerState(state)
            stored = known.entries.get(entry.entry_id)
            # As a real bookie: the entry is stored with the request's flags (no-op marks),
            # less the request-only recovery bit, stamped with the request's term.
            copy = entry._replace(flags=flags & ~ADD_FLAG_RECOVERY, term=term)
            if stored is not None:
                rules.check_rewrite(ledger_id, entry.entry_id, _copy(stored), _copy(copy))
        except RequestError as err:
            return _refused(err)
        known.entries[entry.entry_id] = copy
        state.piggyback_lac = max(state.piggyback_lac, entry.last_add_confirmed)
        state.highest_entry = max(state.highest_entry, entry.entry_id)
        if flags & ADD_FLAG_TRUNCATE:
            for higher in [e for e in known.entries if e > entry.entry_id]:
                del known.entries[higher]
            rules.truncated(state, entry.entry_id)
            state.highest_entry = entry.entry_id
        return StatusCode.OK

    def read_lac(
        self, ledger_id: int, fence: bool, master_key: bytes, term: int
    ) -> tuple[int, int]:
        known = self.ledgers.get(ledger_id)
        try:
            if fence:
                state, _ = rules.check_fence(
                    ledger_id, known.state if known else None, master_key, term, in_metadata=None
                )
                if known is None:
                    known = self.ledgers[ledger_id] = SimLedgerState(state)
            elif term:
                state, _ = rules.check_term_read(
                    ledger_id, known.state if known else None, master_key, term, in_metadata=None
                )
                if known is None:
                    known = self.ledgers[ledger_id] = SimLedgerState(state)
        except RequestError as err:
            return _refused(err), -1
        if known is None:
            return StatusCode.NO_SUCH_LEDGER, -1
        return StatusCode.OK, known.state.lac

    def read(
        self, ledger_id: int, entry_id: int, fence: bool, master_key: bytes, term: int
    ) -> tuple[int, EntryData | None]:
        if fence or term:
            status, _ = self.read_lac(ledger_id, fence, master_key, term)
            if status != StatusCode.OK:
                return status, None
        known = self.ledgers.get(ledger_id)
        if known is None:
            return StatusCode.NO_SUCH_LEDGER, None
        entry = known.entries.get(entry_id)
        if entry is None:
            return StatusCode.NO_SUCH_ENTRY, None
        return StatusCode.OK, entry


def _copy(e: EntryData) -> rules.Copy:
    return rules.Copy(e.payload, e.length, e.flags, e.term)


class SimMetadata:
    """A CAS store of ledger metadata (the version bumps on every write)."""

    def __init__(self) -> None:
        self.ledgers: dict[int, tuple[LedgerMetadata, int]] = {}

    def create(self, metadata: LedgerMetadata) -> int:
        self.ledgers[metadata.ledger_id] = (metadata, 0)
        return 0

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return self.ledgers[ledger_id]

    def cas(self, metadata: LedgerMetadata, expected: int) -> int | None:
        _, version = self.ledgers[metadata.ledger_id]
        if version != expected:
            return None
        self.ledgers[metadata.ledger_id] = (metadata, version + 1)
        return version + 1


@dataclass
class NetworkConfig:
    min_delay: int = 1
    max_delay: int = 12
    drop_rate: float = 0.03
    timeout: int = 60


class World:
    """The virtual clock, the event queue and the network."""

    def __init__(self, seed: int, bookie_ids: list[str], net: NetworkConfig) -> None:
        self.seed = seed
        self.rnd = random.Random(seed)
        self.now = 0
        self.net = net
        self.bookies = {b: SimBookie(b) for b in bookie_ids}
        self.metadata = SimMetadata()
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.trace: list[str] = []

    def log(self, message: str) -> None:
        self.trace.append(f"t={self.now:5d} {message}")

    def at(self, delay: int, event: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (self.now + delay, next(self._seq), event))

    def delay(self) -> int:
        return self.rnd.randint(self.net.min_delay, self.net.max_delay)

    def dropped(self) -> bool:
        return self.rnd.random() < self.net.drop_rate

    def rpc(
        self,
        bookie_id: str,
        request: Callable[[SimBookie], object],
        reply: Callable[[object | None], None],
    ) -> None:
        """Send a request; deliver the reply, or None once the timeout passes if the
        request or the reply was lost (dropped, or the bookie was down)."""
        done = [False]

        def finish(result: object | None) -> None:
            if not done[0]:
                done[0] = True
                reply(result)

        def deliver() -> None:
            bookie = self.bookies[bookie_id]
            if not bookie.alive:
                return
            result = request(bookie)
            if self.dropped():
                return

            def answer() -> None:
                finish(result)

            self.at(self.delay(), answer)

        if not self.dropped():
            self.at(self.delay(), deliver)
        self.at(self.net.timeout, lambda: finish(None))

    def metadata_op(self, op: Callable[[], object], reply: Callable[[object], None]) -> None:
        """Metadata operations are reliable (ZooKeeper retries) but take time, so CAS
        races between clients happen."""

        def deliver() -> None:
            result = op()
            self.at(self.delay(), lambda: reply(result))

        self.at(self.delay(), deliver)

    def crash(self, bookie_id: str, down_for: int) -> None:
        """The bookie is down for down_for ticks (its state survives: it is durable)."""
        self.bookies[bookie_id].alive = False
        self.log(f"CRASH {bookie_id} for {down_for}")

        def restart() -> None:
            self.bookies[bookie_id].alive = True
            self.log(f"RESTART {bookie_id}")

        self.at(down_for, restart)

    def step(self) -> bool:
        if not self._queue:
            return False
        when, _, event = heapq.heappop(self._queue)
        self.now = when
        event()
        return True


class LedgerIO:
    """Carries the I/O actions of ledger machines (writers, recoveries) of ANY ledger over
    the world, and hands every outcome action to the caller's callback."""

    def __init__(self, world: World, on_written: Callable[[], None] | None = None) -> None:
        self.world = world
        self.on_written = on_written  # after every successful metadata CAS (a check)

    def execute(
        self,
        name: str,
        machine: Any,
        actions: list[Action],
        outcome: Callable[[Action], None],
    ) -> None:
        for action in actions:
            self._one(name, machine, action, outcome)

    def _step(
        self, name: str, machine: Any, outcome: Callable[[Action], None], event: Event
    ) -> None:
        self.execute(name, machine, machine.step(event), outcome)

    def _one(
        self, name: str, machine: Any, action: Action, outcome: Callable[[Action], None]
    ) -> None:
        world = self.world
        step = functools.partial(self._step, name, machine, outcome)
        if isinstance(action, SendAdd):
            a = action

            def add(b: SimBookie) -> object:
                return [b.add(a.ledger_id, e, a.master_key, a.flags, a.term) for e in a.entries]

            def add_reply(statuses: object | None) -> None:
                ids = [e.entry_id for e in a.entries]
                answers = statuses if statuses is not None else [None] * len(ids)
                step(AddResults(a.bookie, list(zip(ids, answers, strict=True))))  # type: ignore[call-overload]

            world.rpc(a.bookie, add, add_reply)
        elif isinstance(action, ReadLac):
            r = action

            def lac_reply(result: object | None) -> None:
                status, lac = result if result is not None else (None, -1)  # type: ignore[misc]
                step(LacResult(r.bookie, status, lac))

            world.rpc(
                r.bookie,
                lambda b: b.read_lac(r.ledger_id, r.fence, r.master_key, r.term),
                lac_reply,
            )
        elif isinstance(action, ReadEntry):
            re = action

            def read_reply(result: object | None) -> None:
                status, entry = result if result is not None else (None, None)  # type: ignore[misc]
                step(ReadResult(re.bookie, re.entry_id, status, entry))

            world.rpc(
                re.bookie,
                lambda b: b.read(re.ledger_id, re.entry_id, re.fence, re.master_key, re.term),
                read_reply,
            )
        elif isinstance(action, ChooseBookies):
            candidates = sorted(
                b for b, bk in world.bookies.items() if bk.alive and b not in action.exclude
            )
            if len(candidates) < action.count:
                error = NotEnoughBookiesError(f"{len(candidates)} bookies for {action.count}")
                world.at(1, lambda: step(BookiesUnavailable(error)))
            else:
                chosen = world.rnd.sample(candidates, action.count)
                world.at(1, lambda: step(BookiesChosen(chosen)))
        elif isinstance(action, WriteMetadata):
            w = action

            def cas_reply(version: object) -> None:
                if version is None:
                    world.log(f"{name} CAS {w.purpose.value} conflict")
                    step(MetadataConflict())
                else:
                    world.log(
                        f"{name} CAS {w.purpose.value} ok: {w.metadata.state.value} "
                        f"last={w.metadata.last_entry_id} fragments={len(w.metadata.fragments)}"
                    )
                    if self.on_written is not None:
                        self.on_written()
                    assert isinstance(version, int)
                    step(MetadataWritten(w.metadata, version))

            world.metadata_op(lambda: world.metadata.cas(w.metadata, w.expected_version), cas_reply)
        elif isinstance(action, ReadMetadata):
            ledger_id = machine.ledger_id
            world.metadata_op(
                lambda: world.metadata.read(ledger_id),
                lambda result: step(MetadataRead(*result)),  # type: ignore[misc]
            )
        else:
            outcome(action)
