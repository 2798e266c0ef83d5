"""Streams in the simulator: the REAL stream writer machine (takeover, rolling, the list
moving on, replacing a broken ledger) over the real ledger machines (LedgerWriter,
LedgerRecovery), with two or three writers dueling for one stream, writers crashing,
readers catching up during rolls, and bookies crashing and coming back.

Readers follow the reader rules of streamlib.protocol.stream_rules: every ledger opened
without recovery, read up to its last entry (closed) or LAC (open), and at an open
ledger they wait (``reader_step``). The test-only ``reader_fences`` switch makes them
recover an open ledger that is no longer last, as readers once did: the simulator must
catch that a writer then loses the stream to nobody.

Invariants:
- a writer gives up (fenced) only after another writer started a takeover;
- every reader reads every acknowledged message exactly once, each writer's in the order
  it was acknowledged, and all readers read the same sequence;
- liveness: once faults heal, the last writer standing serves, and an append it makes is
  acknowledged (a writer with enough live bookies never stays failed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from streamlib.protocol import DigestManager, Fragment, LedgerMetadata, LedgerState
from streamlib.protocol.actions import (
    Action,
    Closed,
    CloseFailed,
    CompleteAdds,
    FailAdds,
    RecoveryDone,
    RecoveryFailed,
    is_noop,
)
from streamlib.protocol.errors import (
    InvalidTermError,
    LedgerFencedError,
    NotEnoughBookiesError,
    RecoveryAbortedError,
    StatusCode,
)
from streamlib.protocol.recovery import LedgerRecovery
from streamlib.protocol.stream_rules import LedgerSpan, ReaderStep, reader_step
from streamlib.protocol.stream_writer import (
    CloseLedger,
    CreateLedger,
    DiscardLedger,
    GiveUp,
    LedgerClosed,
    LedgerCloseFailed,
    LedgerCreated,
    LedgerCreateFailed,
    LedgerFailed,
    LedgerRecovered,
    LedgerRecoveryFailed,
    ListConflict,
    ListRead,
    ListWritten,
    Op,
    ReadList,
    RecordSize,
    RecoverLedger,
    ReplaceFailed,
    Rolled,
    Serve,
    State,
    StreamAction,
    StreamEvent,
    StreamWriterMachine,
    TakeOverLedger,
    WriteList,
)
from streamlib.protocol.writer import LedgerWriter
from tests.sim.cluster import LedgerIO, NetworkConfig, World
from tests.sim.scenario import MASTER_KEY, PASSWORD_HASH, InvariantViolation, run_replayable


@dataclass
class SimList:
    spans: tuple[LedgerSpan, ...] = ()
    version: int = 0


@dataclass
class SimWriter:
    """One writer process of the stream."""

    no: int
    machine: StreamWriterMachine
    started_at: int
    alive: bool = True
    served_at: int = -1  # when it last began serving
    takeover_at: int = -1  # when it last ran a takeover step
    ledgers: dict[int, LedgerWriter] = field(default_factory=dict)
    in_current: int = 0  # entries appended to the served ledger
    sent: dict[tuple[int, int], bytes] = field(default_factory=dict)
    acked: list[bytes] = field(default_factory=list)
    appended: list[bytes] = field(default_factory=list)  # in append order
    next_message: int = 0


@dataclass
class SimReader:
    no: int
    index: int = 0  # position in the list
    next_entry: int = 0
    lac: dict[int, int] = field(default_factory=dict)
    read: list[bytes] = field(default_factory=list)
    done: bool = False


class StreamScenario:
    def __init__(self, seed: int, *, reader_fences: bool = False) -> None:
        self.world = World(seed, [f"b{i}" for i in range(5)], NetworkConfig())
        self.io = LedgerIO(self.world)
        rnd = self.world.rnd
        self.reader_fences = reader_fences
        self.quorums = rnd.choice([(2, 2), (3, 2), (2, 1)])
        self.max_entries = rnd.randint(2, 6)
        self.list = SimList()
        self.next_ledger_id = 100
        self.writers: list[SimWriter] = []
        self.readers = [SimReader(i) for i in range(rnd.randint(1, 2))]
        self.quiet = False
        self.final_closed = False
        self.final: SimWriter | None = None
        self.digest = {}  # ledger id -> DigestManager

    # -- the stream's metadata ------------------------------------------------------------

    def digest_of(self, ledger_id: int) -> DigestManager:
        if ledger_id not in self.digest:
            self.digest[ledger_id] = DigestManager(ledger_id, "crc32c", PASSWORD_HASH)
        return self.digest[ledger_id]

    # -- writers --------------------------------------------------------------------------

    def start_writer(self) -> None:
        writer = SimWriter(len(self.writers), StreamWriterMachine("s"), self.world.now)
        self.writers.append(writer)
        self.world.log(f"writer{writer.no} starts a takeover")
        self.run_stream(writer, writer.machine.start())

    def kill_writer(self, writer: SimWriter) -> None:
        if writer.alive:
            writer.alive = False
            self.world.log(f"KILL writer{writer.no}")

    def run_stream(self, writer: SimWriter, actions: list[StreamAction]) -> None:
        for action in actions:
            self.stream_action(writer, action)

    def step_stream(self, writer: SimWriter, event: StreamEvent) -> None:
        if writer.alive:
            self.run_stream(writer, writer.machine.step(event))

    def replace(self, writer: SimWriter) -> None:
        """The driver's next append asks the broken writer to replace its ledger."""
        if writer.alive:
            self.run_stream(writer, writer.machine.replace())

    def stream_action(self, w: SimWriter, action: StreamAction) -> None:
        world = self.world
        name = f"writer{w.no}"
        if isinstance(action, ReadList):
            if w.machine.op is Op.TAKEOVER:
                w.takeover_at = world.now
            world.metadata_op(
                lambda: (self.list.spans, self.list.version),
                lambda got: self.step_stream(w, ListRead(list(got[0]), got[1], False)),  # type: ignore[index]
            )
        elif isinstance(action, WriteList):

            def cas() -> object:
                if self.list.version != action.expected_version:
                    return None
                self.list = SimList(action.ledgers, self.list.version + 1)
                return self.list.version

            def cas_reply(version: object) -> None:
                if version is None:
                    world.log(f"{name} list CAS conflict")
                    self.step_stream(w, ListConflict())
                else:
                    assert isinstance(version, int)
                    world.log(f"{name} list = {[s.ledger_id for s in action.ledgers]}")
                    self.step_stream(w, ListWritten(version))

            world.metadata_op(cas, cas_reply)
        elif isinstance(action, RecoverLedger):
            self.recover(w, action.ledger_id, attempt=0)
        elif isinstance(action, CreateLedger):
            world.at(1, lambda: self.create_ledger(w))
        elif isinstance(action, CloseLedger):
            writer = w.ledgers[action.ledger_id]
            self.run_ledger(w, writer, writer.close())
        elif isinstance(action, Serve):
            world.log(f"{name} serves ledger {action.ledger_id}")
            w.served_at = world.now
            w.in_current = 0
            world.at(1, lambda: self.append(w))
        elif isinstance(action, GiveUp):
            world.log(f"{name} gives up: {action.error!r}")
            self.check_fenced_by_a_writer(w)
        elif isinstance(action, ReplaceFailed):
            world.log(f"{name} replace failed: {action.error!r}")
            world.at(world.rnd.randint(20, 60), lambda: self.replace(w))
        elif isinstance(action, DiscardLedger | RecordSize | Rolled):
            pass  # bookkeeping: leaks and sizes do not change what readers see
        elif isinstance(action, TakeOverLedger):  # pragma: no cover - bounded streams here
            raise AssertionError("an unbounded action in a bounded stream")

    def create_ledger(self, w: SimWriter) -> None:
        alive = sorted(b for b, bk in self.world.bookies.items() if bk.alive)
        if len(alive) < 3:
            self.step_stream(w, LedgerCreateFailed(NotEnoughBookiesError("too few bookies")))
            return
        ledger_id = self.next_ledger_id
        self.next_ledger_id += 1
        qw, qa = self.quorums
        ensemble = tuple(self.world.rnd.sample(alive, 3))
        md = LedgerMetadata(
            ledger_id, 3, qw, qa, (Fragment(0, ensemble),), password_hash=PASSWORD_HASH
        )
        self.world.metadata.create(md)
        w.ledgers[ledger_id] = LedgerWriter(
            md, 0, master_key=MASTER_KEY, digest=self.digest_of(ledger_id)
        )
        self.world.log(f"writer{w.no} created ledger {ledger_id} on {ensemble}")
        self.step_stream(w, LedgerCreated(ledger_id))

    def recover(self, w: SimWriter, ledger_id: int, attempt: int) -> None:
        metadata, version = self.world.metadata.read(ledger_id)
        recovery = LedgerRecovery(
            metadata, version, master_key=MASTER_KEY, digest=self.digest_of(ledger_id)
        )

        def outcome(action: Action) -> None:
            if not w.alive:
                return
            if isinstance(action, RecoveryDone):
                md = action.metadata
                self.step_stream(w, LedgerRecovered(ledger_id, md.last_entry_id + 1, md.length))
            elif isinstance(action, RecoveryFailed):
                retry = isinstance(action.error, RecoveryAbortedError | NotEnoughBookiesError)
                if retry and attempt < 30:  # (the manager retries a while)
                    self.world.at(
                        self.world.rnd.randint(20, 80),
                        lambda: self.recover(w, ledger_id, attempt + 1),
                    )
                else:
                    self.step_stream(w, LedgerRecoveryFailed(ledger_id, action.error))

        self.io.execute(f"writer{w.no}-recovery{ledger_id}", recovery, recovery.start(), outcome)

    def run_ledger(self, w: SimWriter, writer: LedgerWriter, actions: list[Action]) -> None:
        self.io.execute(
            f"writer{w.no}-L{writer.ledger_id}",
            writer,
            actions,
            lambda a: self.ledger_outcome(w, writer, a),
        )

    def ledger_outcome(self, w: SimWriter, writer: LedgerWriter, action: Action) -> None:
        if not w.alive:
            return
        ledger_id = writer.ledger_id
        if isinstance(action, CompleteAdds):
            for entry_id in range(action.first_entry_id, action.last_entry_id + 1):
                w.acked.append(w.sent[(ledger_id, entry_id)])
        elif isinstance(action, FailAdds):
            fenced = isinstance(action.error, LedgerFencedError | InvalidTermError)
            self.step_stream(w, LedgerFailed(ledger_id, action.error, fenced))
            if w.machine.state is State.BROKEN:  # the driver's next append replaces it
                self.world.log(f"writer{w.no} is broken: {action.error!r}")
                self.world.at(self.world.rnd.randint(5, 30), lambda: self.replace(w))
        elif isinstance(action, Closed):
            md = action.metadata
            self.step_stream(w, LedgerClosed(ledger_id, md.last_entry_id + 1, md.length))
        elif isinstance(action, CloseFailed):
            fenced = isinstance(action.error, LedgerFencedError | InvalidTermError)
            self.step_stream(w, LedgerCloseFailed(ledger_id, action.error, fenced))

    def append(self, w: SimWriter) -> None:
        if not w.alive or self.quiet or w.machine.state is not State.SERVING:
            return
        current = w.machine.current
        assert current is not None
        writer = w.ledgers[current]
        if writer.state.value == "writing":
            payload = f"w{w.no}-m{w.next_message}".encode()
            w.next_message += 1
            w.sent[(current, writer.tracker.next_entry_id)] = payload
            w.appended.append(payload)
            _, actions = writer.append([payload])
            self.run_ledger(w, writer, actions)
            w.in_current += 1
            if w.in_current >= self.max_entries:
                self.run_stream(w, w.machine.roll())
        self.world.at(self.world.rnd.randint(1, 15), lambda: self.append(w))

    # -- readers --------------------------------------------------------------------------

    def reader_tick(self, r: SimReader) -> None:
        if r.done:
            return
        self.world.at(self.world.rnd.randint(5, 25), lambda: self.reader_tick(r))
        spans = self.list.spans
        if r.index >= len(spans):
            r.done = self.final_closed  # drained: the final writer closed its ledger
            return
        ledger_id = spans[r.index].ledger_id
        md, _ = self.world.metadata.read(ledger_id)
        closed = md.state is LedgerState.CLOSED
        end = md.last_entry_id if closed else r.lac.get(ledger_id, -1)
        if r.next_entry <= end:
            self.reader_read(r, md, r.next_entry)
            return
        if not closed:
            self.reader_poll_lac(r, md)
        is_last = r.index == len(spans) - 1
        if self.reader_fences and not closed and not is_last:
            self.reader_recovers(r, md)  # the unsafe variant
            return
        if reader_step(closed, tail=True) is ReaderStep.MOVE_ON:
            r.index += 1
            r.next_entry = 0

    def reader_poll_lac(self, r: SimReader, md: LedgerMetadata) -> None:
        for bookie in md.last_fragment.ensemble:

            def reply(result: object | None, ledger_id: int = md.ledger_id) -> None:
                if result is not None:
                    status, lac = result  # type: ignore[misc]
                    if status == StatusCode.OK:
                        r.lac[ledger_id] = max(r.lac.get(ledger_id, -1), lac)

            self.world.rpc(
                bookie, lambda b, lid=md.ledger_id: b.read_lac(lid, False, b"", 0), reply
            )

    def reader_read(self, r: SimReader, md: LedgerMetadata, entry_id: int) -> None:
        bookie = self.world.rnd.choice(md.write_set_bookies(entry_id))
        ledger_id, index = md.ledger_id, r.index

        def reply(result: object | None) -> None:
            if result is None or r.index != index or r.next_entry != entry_id:
                return
            status, entry = result  # type: ignore[misc]
            if status != StatusCode.OK or entry is None:
                return  # another replica on a later tick
            if not self.digest_of(ledger_id).is_valid(
                entry.entry_id, entry.last_add_confirmed, entry.length, entry.payload, entry.digest
            ):
                return
            if not is_noop(entry.flags):
                r.read.append(entry.payload)
            r.next_entry += 1

        self.world.rpc(bookie, lambda b: b.read(ledger_id, entry_id, False, b"", 0), reply)

    def reader_recovers(self, r: SimReader, md: LedgerMetadata) -> None:
        metadata, version = self.world.metadata.read(md.ledger_id)
        if metadata.state is LedgerState.CLOSED:
            return
        self.world.log(f"reader{r.no} recovers ledger {md.ledger_id} (unsafe)")
        recovery = LedgerRecovery(
            metadata, version, master_key=MASTER_KEY, digest=self.digest_of(md.ledger_id)
        )
        self.io.execute(f"reader{r.no}-recovery", recovery, recovery.start(), lambda a: None)

    # -- invariants -----------------------------------------------------------------------

    def fail(self, message: str) -> None:
        raise InvariantViolation(message)

    def check_fenced_by_a_writer(self, w: SimWriter) -> None:
        others = [o for o in self.writers if o is not w]
        if not any(o.takeover_at >= min(w.served_at, w.takeover_at) for o in others):
            self.fail(f"writer{w.no} lost the stream although no writer took over after it")

    def serving(self) -> SimWriter | None:
        """The writer that serves now (the last to begin, if a duel left two thinking so)."""
        live = [w for w in self.writers if w.alive and w.machine.state is State.SERVING]
        return max(live, key=lambda w: w.served_at, default=None)

    def check_final(self) -> None:
        final = self.final
        if final is None:
            states = [(w.no, w.machine.state.value, w.machine.error) for w in self.writers]
            self.fail(f"no writer serves after healing: {states}")
        assert final is not None
        if final.appended[-1] not in final.acked:
            self.fail(f"writer{final.no}'s append after healing was never acknowledged")
        sequences = [r.read for r in self.readers]
        for r in self.readers:
            if len(set(r.read)) != len(r.read):
                self.fail(f"reader{r.no} read a message twice: {r.read}")
            position = {payload: i for i, payload in enumerate(r.read)}
            for w in self.writers:
                missing = [p for p in w.acked if p not in position]
                if missing:
                    self.fail(f"reader{r.no} never read acknowledged {missing[:5]}")
                # (acknowledged in append order: the driver resolves them that way)
                acked = set(w.acked)
                order = [position[p] for p in w.appended if p in acked]
                if order != sorted(order):
                    self.fail(f"reader{r.no} read writer{w.no}'s messages out of order")
        if any(s != sequences[0] for s in sequences):
            self.fail("readers read different sequences")

    # -- the run --------------------------------------------------------------------------

    def run(self, max_steps: int = 400_000) -> None:
        world, rnd = self.world, self.world.rnd
        world.at(1, self.start_writer)
        for _ in range(rnd.choice([0, 1, 1, 2])):  # duels: later writers take over
            world.at(rnd.randint(50, 600), self.start_writer)
        if rnd.random() < 0.3:
            world.at(rnd.randint(100, 500), lambda: self.kill_writer(self.writers[0]))
            world.at(rnd.randint(550, 800), self.start_writer)
        when = rnd.randint(20, 200)
        for _ in range(rnd.choice([0, 1, 2, 3])):  # one bookie down at a time
            down_for = rnd.randint(30, 200)
            victim = rnd.choice(sorted(world.bookies))
            world.at(when, lambda v=victim, d=down_for: world.crash(v, d))
            when += down_for + rnd.randint(20, 150)
        if rnd.random() < 0.3:  # an outage: too few bookies for any ledger, for a while
            down_for = rnd.randint(100, 300)
            for victim in rnd.sample(sorted(world.bookies), 3):
                world.at(when, lambda v=victim, d=down_for: world.crash(v, d))
            when += down_for + rnd.randint(20, 150)
        for r in self.readers:
            world.at(rnd.randint(1, 100), lambda r=r: self.reader_tick(r))
        world.at(max(when, 900), self.heal)
        steps = 0
        while world.step():
            steps += 1
            if steps > max_steps:
                self.fail("the simulation did not settle (livelock?)")
        self.check_final()

    def heal(self) -> None:
        """Every bookie back, no drops; appends stop; a last writer takes over (it closes
        every ledger before its own) and must be served; readers then drain."""
        world = self.world
        for bookie in world.bookies.values():
            bookie.alive = True
        world.net.drop_rate = 0.0
        self.quiet = True
        world.log("HEAL: a final writer takes over")
        self.start_writer()

        def when_settled(then: Callable[[], None]) -> None:
            """Once no writer has a takeover, roll or replacement going (duels that were
            under way at the heal end: their takeovers are bounded)."""
            if any(w.alive and w.machine.op is not None for w in self.writers):
                world.at(50, lambda: when_settled(then))
            else:
                then()

        def last_append() -> None:
            final = self.final = self.serving()
            if final is not None:
                self.quiet = False
                self.append(final)
                self.quiet = True
            world.at(300, lambda: when_settled(close_final))

        def close_final() -> None:  # what a producer's close does; readers then drain
            final = self.serving()
            if final is not None and final.machine.current is not None:
                writer = final.ledgers[final.machine.current]
                self.run_ledger(final, writer, writer.close())
                world.at(300, lambda: setattr(self, "final_closed", True))
            else:
                self.final_closed = True

        world.at(400, lambda: when_settled(last_append))


def run_stream_seed(seed: int, *, reader_fences: bool = False) -> StreamScenario:
    flags = " --reader-fences" if reader_fences else ""
    return run_replayable(
        StreamScenario(seed, reader_fences=reader_fences), f"streams{flags}", f"--streams{flags}"
    )
