"""Term mode in the simulator: writers of an unbounded ledger take it over from each other
(term + 1 by CAS, recovery with the term, the TRUNCATE no-op, reopen) while the old one
may still be writing, over the same faulty network and bookies as the bounded scenario.

Invariants, in addition to the bounded ones that apply:
- an entry id is never acknowledged with two different payloads (no divergence of what
  writers were told is committed);
- at the end, every acknowledged entry is on every bookie of its write set (per the
  final metadata) with exactly its payload, and no two bookies of a write set hold
  different payloads for any entry up to the final LAC.
"""

from __future__ import annotations

from streamlib.protocol import Fragment, LedgerMetadata
from streamlib.protocol.actions import Action, RecoveryDone, RecoveryFailed, is_noop
from streamlib.protocol.errors import InvalidTermError, NotEnoughBookiesError, RecoveryAbortedError
from streamlib.protocol.term_recovery import TermRecovery
from streamlib.protocol.writer import LedgerWriter
from tests.sim.cluster import NetworkConfig
from tests.sim.scenario import (
    LEDGER_ID,
    MASTER_KEY,
    PASSWORD_HASH,
    InvariantViolation,
    Scenario,
    run_replayable,
)


class UnboundedScenario(Scenario):
    def __init__(
        self,
        seed: int,
        *,
        skip_truncate: bool = False,
        net: NetworkConfig | None = None,
        quorums: tuple[int, int] | None = None,
        ensemble: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(seed, net=net, quorums=quorums, ensemble=ensemble)
        self.skip_truncate = skip_truncate
        md = self.initial
        self.initial = LedgerMetadata(
            LEDGER_ID,
            md.ensemble_size,
            md.write_quorum,
            md.ack_quorum,
            (Fragment(0, md.last_fragment.ensemble),),
            password_hash=PASSWORD_HASH,
            term=1,
            unbounded=True,
        )
        self.world.metadata.ledgers.clear()
        self.world.metadata.create(self.initial)
        self.writer = LedgerWriter(
            self.initial, 0, master_key=MASTER_KEY, digest=self.digest, term=1
        )
        self.writer_no = 0
        self.takeovers = 0
        self.max_takeovers = self.world.rnd.randint(1, 4)
        self.may_close = False  # an unbounded ledger lives on: writers hand it over
        self.final = False
        self.schedule_fragment_roll()

    def schedule_fragment_roll(self) -> None:
        """Writers also roll fragments (planned ensemble changes) now and then."""
        self.world.at(self.world.rnd.randint(20, 150), self.roll_fragment)

    def roll_fragment(self) -> None:
        if self.final:
            return
        self.world.log("writer rolls its fragment")
        self.execute("writer", self.writer, self.writer.roll_fragment())

    def payload(self, entry_id: int) -> bytes:
        return f"seed{self.world.seed}-w{self.writer_no}-e{entry_id}".encode()

    def start_recovery(self, attempt: int = 0) -> None:
        metadata, version = self.world.metadata.read(LEDGER_ID)
        recovery = TermRecovery(
            metadata,
            version,
            master_key=MASTER_KEY,
            digest=self.digest,
            unsafe_skip_truncate=self.skip_truncate,
        )
        name = f"takeover{len(self.recoveries)}.{attempt}"
        self.world.log(f"{name} starts (term {metadata.term}, v{version})")
        self.attempts[id(recovery)] = attempt
        self.recoveries.append(recovery)
        self.execute(name, recovery, recovery.start())

    def on_outcome(self, name: str, machine: object, action: Action) -> None:
        if isinstance(action, RecoveryDone) and isinstance(machine, TermRecovery):
            self._new_writer(machine, action)
            return
        if isinstance(action, RecoveryFailed) and isinstance(action.error, InvalidTermError):
            self.world.log(f"{name} lost to a newer term")
            return
        if isinstance(action, RecoveryFailed) and isinstance(
            action.error, RecoveryAbortedError | NotEnoughBookiesError
        ):
            self.world.log(f"{name} failed: {action.error!r}")
            attempt = self.attempts.get(id(machine), 0)
            if attempt < 20:
                self.world.at(
                    self.world.rnd.randint(20, 80), lambda: self.start_recovery(attempt + 1)
                )
            return
        super().on_outcome(name, machine, action)

    def _new_writer(self, recovery: TermRecovery, done: RecoveryDone) -> None:
        self.writer_no += 1
        self.world.log(
            f"writer{self.writer_no} takes over at term {done.metadata.term}: entries continue "
            f"at {recovery.next_entry_id} (recovered up to {recovery.last_entry_id})"
        )
        self.writer = LedgerWriter(
            done.metadata,
            done.version,
            master_key=MASTER_KEY,
            digest=self.digest,
            term=done.metadata.term,
            last_add_confirmed=recovery.last_add_confirmed,
            length=recovery.length,
        )
        if self.final:
            return  # the closing check: nothing more is written
        self.written = 0
        # 0 now and then: back-to-back takeovers (recovery reads the last one's no-op).
        self.entries_to_write = self.world.rnd.choice([0, *range(3, 16)])
        self.world.at(1, self.writer_append)
        self.schedule_fragment_roll()
        self.takeovers += 1
        if self.takeovers < self.max_takeovers:
            self.world.at(self.world.rnd.randint(10, 200), self.start_recovery)

    def record_ack(self, entry_id: int, payload: bytes) -> None:
        known = self.acked.get(entry_id)
        if known is not None and known != payload:
            raise InvariantViolation(
                f"entry {entry_id} acknowledged twice with different payloads: "
                f"{known!r} then {payload!r} (the log diverged)"
            )
        self.acked[entry_id] = payload

    def check_final(self) -> None:
        metadata, _ = self.world.metadata.read(LEDGER_ID)
        final = self.recoveries[-1]
        assert isinstance(final, TermRecovery)
        end = final.last_entry_id if final.last_entry_id is not None else -1
        for entry_id in self.acked:
            if entry_id > end:
                self.fail(f"acknowledged entry {entry_id} is past the recovered end {end}")
        for entry_id in range(metadata.first_entry_id, end + 1):
            copies = {}
            for bookie_id in metadata.write_set_bookies(entry_id):
                state = self.world.bookies[bookie_id].ledgers.get(LEDGER_ID)
                entry = state.entries.get(entry_id) if state else None
                copies[bookie_id] = entry.payload if entry is not None else None
            held = {p for p in copies.values() if p is not None}
            for bookie_id in metadata.write_set_bookies(entry_id):
                state = self.world.bookies[bookie_id].ledgers.get(LEDGER_ID)
                entry = state.entries.get(entry_id) if state else None
                if entry is not None and entry.payload == b"" and not is_noop(entry.flags):
                    self.fail(f"the no-op {entry_id} on {bookie_id} reads as data (b'')")
            if len(held) > 1:
                self.fail(f"entry {entry_id} differs between bookies: {copies} (divergence)")
            if entry_id in self.acked and held != {self.acked[entry_id]}:
                self.fail(f"acknowledged entry {entry_id} lost or changed: {copies}")

    def schedule_more_recoveries(self) -> None:
        pass  # takeovers chain themselves (see _new_writer)

    def finish_quietly(self) -> None:
        self.world.log("final takeover in a quiet world")
        self.final = True
        self.start_recovery(attempt=100)


def run_unbounded_seed(seed: int, *, skip_truncate: bool = False) -> UnboundedScenario:
    flags = " --skip-truncate" if skip_truncate else ""
    return run_replayable(
        UnboundedScenario(seed, skip_truncate=skip_truncate),
        f"unbounded{flags}",
        f"--unbounded{flags}",
    )
