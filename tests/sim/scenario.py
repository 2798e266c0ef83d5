"""One seeded scenario: a writer appending to a ledger while one or two recoveries fence
and close it, over a network that delays and drops messages and bookies that crash and
restart. The REAL state machines of streamlib.protocol run here; only I/O is simulated.

Invariants (checked after every step, and at the end):
- an entry acknowledged to the writer's caller is never acknowledged after the ledger
  was closed before it, and a closed ledger's last entry >= every acknowledged entry;
- no acknowledged entry is lost or changed: every stored copy holds its payload;
- every entry of a closed ledger up to its last entry is stored on >= Qa bookies of its
  write set, all copies identical, so every reader sees the same sequence;
- all recoveries that finish agree on the last entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from streamlib.protocol import DigestManager, Fragment, LedgerMetadata, LedgerState
from streamlib.protocol.actions import (
    Action,
    Closed,
    CloseFailed,
    CompleteAdds,
    FailAdds,
    RecoveryDone,
    RecoveryFailed,
)
from streamlib.protocol.digest import master_key, password_hash
from streamlib.protocol.errors import NotEnoughBookiesError, RecoveryAbortedError
from streamlib.protocol.recovery import LedgerRecovery, RecoveryOptions
from streamlib.protocol.writer import LedgerWriter, WriterState
from tests.sim.cluster import LedgerIO, NetworkConfig, World

LEDGER_ID = 7
PASSWORD_HASH = password_hash(b"sim")
MASTER_KEY = master_key(PASSWORD_HASH)


class InvariantViolation(AssertionError):
    pass


@dataclass
class Mutation:
    """Test-only switches that make the protocol unsafe; the simulator must catch each."""

    name: str = "none"
    recovery: RecoveryOptions = field(default_factory=RecoveryOptions)


MUTATIONS = {
    "none": Mutation(),
    "skip_fencing": Mutation("skip_fencing", RecoveryOptions(unsafe_skip_fencing=True)),
    "unknown_as_negative": Mutation(
        "unknown_as_negative", RecoveryOptions(unsafe_unknown_as_negative=True)
    ),
    "skip_write_back": Mutation("skip_write_back", RecoveryOptions(unsafe_skip_write_back=True)),
}


class Scenario:
    def __init__(
        self,
        seed: int,
        mutation: Mutation | None = None,
        *,
        net: NetworkConfig | None = None,
        quorums: tuple[int, int] | None = None,
        ensemble: tuple[str, ...] | None = None,
    ) -> None:
        self.mutation = mutation or MUTATIONS["none"]
        self.world = World(seed, [f"b{i}" for i in range(5)], net or NetworkConfig())
        self.io = LedgerIO(self.world, on_written=self.check_closed_covers_acks)
        rnd = self.world.rnd
        self.write_quorum = rnd.choice([2, 3])
        self.ack_quorum = rnd.randint(2, self.write_quorum)
        if quorums is not None:
            self.write_quorum, self.ack_quorum = quorums
        ensemble = ensemble or tuple(rnd.sample(sorted(self.world.bookies), 3))
        self.initial = LedgerMetadata(
            LEDGER_ID,
            3,
            self.write_quorum,
            self.ack_quorum,
            (Fragment(0, ensemble),),
            password_hash=PASSWORD_HASH,
        )
        self.world.metadata.create(self.initial)
        self.digest = DigestManager(LEDGER_ID, "crc32c", PASSWORD_HASH)
        self.acked: dict[int, bytes] = {}
        self.recovered_last: list[int] = []
        self.recoveries: list[LedgerRecovery] = []
        self.attempts: dict[int, int] = {}
        self.writer = LedgerWriter(self.initial, 0, master_key=MASTER_KEY, digest=self.digest)
        self.entries_to_write = rnd.randint(8, 40)
        self.written = 0
        self.may_close = True
        self.sent: dict[tuple[int, int], bytes] = {}  # (id(writer), entry) -> payload

    # -- the clients --------------------------------------------------------------------

    def payload(self, entry_id: int) -> bytes:
        return f"seed{self.world.seed}-entry{entry_id}".encode()

    def writer_append(self) -> None:
        if self.writer.state is not WriterState.WRITING or self.written >= self.entries_to_write:
            return
        count = self.world.rnd.randint(1, 3)
        first = self.writer.tracker.next_entry_id
        self.append([self.payload(first + i) for i in range(count)])
        self.written += count
        if self.written >= self.entries_to_write:
            if self.may_close and self.world.rnd.random() < 0.5:
                self.world.log("writer closes")
                self.execute("writer", self.writer, self.writer.close())
        else:
            self.world.at(self.world.rnd.randint(1, 25), self.writer_append)

    def append(self, payloads: list[bytes]) -> None:
        """The current writer appends (remembering what it sent, to check its acks)."""
        first = self.writer.tracker.next_entry_id
        for i, payload in enumerate(payloads):
            self.sent[(id(self.writer), first + i)] = payload
        _, actions = self.writer.append(payloads)
        self.world.log(f"writer appends {first}..{first + len(payloads) - 1}")
        self.execute("writer", self.writer, actions)

    def start_recovery(self, attempt: int = 0) -> None:
        metadata, version = self.world.metadata.read(LEDGER_ID)
        recovery = LedgerRecovery(
            metadata,
            version,
            master_key=MASTER_KEY,
            digest=self.digest,
            options=self.mutation.recovery,
        )
        name = f"recovery{len(self.recoveries)}.{attempt}"
        self.world.log(f"{name} starts ({metadata.state.value}, v{version})")
        self.attempts[id(recovery)] = attempt
        self.recoveries.append(recovery)  # kept alive so id() stays unique
        self.execute(name, recovery, recovery.start())

    # -- executing actions --------------------------------------------------------------

    def execute(self, name: str, machine: object, actions: list[Action]) -> None:
        self.io.execute(name, machine, actions, lambda a: self.on_outcome(name, machine, a))

    def on_outcome(self, name: str, machine: object, action: Action) -> None:
        """A machine's outcome (its I/O is carried by LedgerIO)."""
        world = self.world
        if isinstance(action, CompleteAdds):
            for entry_id in range(action.first_entry_id, action.last_entry_id + 1):
                self.record_ack(entry_id, self.sent[(id(machine), entry_id)])
            world.log(f"writer acknowledged ..{action.last_entry_id}")
            self.check_closed_covers_acks()
        elif isinstance(action, FailAdds):
            world.log(f"writer failed {len(action.entry_ids)} adds: {action.error!r}")
        elif isinstance(action, Closed | CloseFailed):
            world.log(f"writer close: {action!r}"[:200])
        elif isinstance(action, RecoveryDone):
            world.log(f"{name} done: last={action.metadata.last_entry_id}")
            self.recovered_last.append(action.metadata.last_entry_id)
        elif isinstance(action, RecoveryFailed):
            world.log(f"{name} failed: {action.error!r}")
            attempt = self.attempts.get(id(machine), 0)
            retryable = isinstance(action.error, RecoveryAbortedError | NotEnoughBookiesError)
            if retryable and attempt < 20:
                world.at(world.rnd.randint(20, 80), lambda: self.start_recovery(attempt + 1))
        else:  # pragma: no cover - a new action kind must be taught to the simulator
            raise AssertionError(f"unknown action {action!r}")

    def record_ack(self, entry_id: int, payload: bytes) -> None:
        self.acked[entry_id] = payload

    # -- faults -------------------------------------------------------------------------

    def crash(self, bookie_id: str, down_for: int) -> None:
        self.world.crash(bookie_id, down_for)

    # -- invariants ---------------------------------------------------------------------

    def fail(self, message: str) -> None:
        raise InvariantViolation(message)

    def check_closed_covers_acks(self) -> None:
        metadata, _ = self.world.metadata.read(LEDGER_ID)
        if metadata.state is LedgerState.CLOSED and self.acked:
            highest = max(self.acked)
            if metadata.last_entry_id < highest:
                self.fail(
                    f"ledger closed at {metadata.last_entry_id} but entry {highest} was "
                    "acknowledged (acknowledged data lost)"
                )

    def check_final(self) -> None:
        metadata, _ = self.world.metadata.read(LEDGER_ID)
        self.check_closed_covers_acks()
        for entry_id, payload in self.acked.items():
            for bookie in self.world.bookies.values():
                copy = bookie.ledgers.get(LEDGER_ID)
                stored = copy.entries.get(entry_id) if copy else None
                if stored is not None and stored.payload != payload:
                    self.fail(f"entry {entry_id} changed on {bookie.id}")
        if len(set(self.recovered_last)) > 1:
            self.fail(f"recoveries disagree on the last entry: {self.recovered_last}")
        if metadata.state is not LedgerState.CLOSED:
            self.fail("the ledger never closed although every bookie came back")
        for entry_id in range(metadata.last_entry_id + 1):
            copies = []
            for bookie_id in metadata.write_set_bookies(entry_id):
                state = self.world.bookies[bookie_id].ledgers.get(LEDGER_ID)
                entry = state.entries.get(entry_id) if state else None
                if entry is not None:
                    copies.append(entry.payload)
            if len(copies) < metadata.ack_quorum:
                self.fail(
                    f"entry {entry_id} of the closed ledger is on {len(copies)} bookies of its "
                    f"write set, fewer than Qa={metadata.ack_quorum}: readers may not see it"
                )
            if len(set(copies)) > 1:
                self.fail(f"entry {entry_id} has different payloads on different bookies")

    # -- the run ------------------------------------------------------------------------

    def run(self, max_steps: int = 200_000) -> None:
        world, rnd = self.world, self.world.rnd
        world.at(1, self.writer_append)
        world.at(rnd.randint(10, 250), self.start_recovery)
        self.schedule_more_recoveries()
        for _ in range(rnd.choice([0, 1, 1, 2])):
            victim = rnd.choice(sorted(world.bookies))
            world.at(rnd.randint(1, 300), lambda v=victim: self.crash(v, rnd.randint(30, 400)))
        steps = 0
        while world.step():
            steps += 1
            if steps > max_steps:
                self.fail("the simulation did not settle (livelock?)")
        # Quiet the world -- every bookie back, no drops -- and finish there.
        for bookie in world.bookies.values():
            bookie.alive = True
        world.net.drop_rate = 0.0
        self.finish_quietly()
        while world.step():
            pass
        self.check_final()

    def schedule_more_recoveries(self) -> None:
        """A second, concurrent recovery half the time."""
        if self.world.rnd.random() < 0.5:
            self.world.at(self.world.rnd.randint(10, 400), self.start_recovery)

    def finish_quietly(self) -> None:
        """Make sure the ledger ends closed (a recovery may have aborted for good while
        bookies were down)."""
        metadata, _ = self.world.metadata.read(LEDGER_ID)
        if metadata.state is not LedgerState.CLOSED:
            self.world.log("final recovery in a quiet world")
            self.start_recovery(attempt=100)


class Runnable(Protocol):
    world: World

    def run(self) -> None: ...


R = TypeVar("R", bound=Runnable)


def run_replayable(scenario: R, what: str, replay_flags: str) -> R:
    """Run a scenario; a violation names its seed, how to replay it, and its trace."""
    seed = scenario.world.seed
    try:
        scenario.run()
    except InvariantViolation as violation:
        trace = "\n".join(scenario.world.trace[-200:])
        raise InvariantViolation(
            f"seed {seed} ({what}): {violation}\n"
            f"replay: python -m tests.sim {replay_flags} --seed {seed}\n{trace}"
        ) from None
    return scenario


def run_seed(seed: int, mutation: str = "none") -> Scenario:
    return run_replayable(
        Scenario(seed, MUTATIONS[mutation]), f"mutation {mutation}", f"--mutation {mutation}"
    )
