"""Placement under repeated failures: one writer, no recovery, bookies of its ensemble
crash one after the other (each comes back before the next goes). With five bookies and
E = 3 there is always a replacement, so the writer must never fail for want of one:
the liveness invariant is that, once every fault has healed, it is still writing and a
last append is acknowledged. A writer that bans every bookie that ever failed on it
(the test-only ``unsafe_keep_failed`` switch) must be caught."""

from __future__ import annotations

from streamlib.protocol.writer import LedgerWriter, WriterState
from tests.sim.cluster import NetworkConfig
from tests.sim.scenario import MASTER_KEY, Scenario, run_replayable


class RepeatedFailures(Scenario):
    def __init__(self, seed: int, *, keep_failed: bool = False) -> None:
        super().__init__(seed, net=NetworkConfig(drop_rate=0.0))
        self.writer = LedgerWriter(
            self.initial,
            0,
            master_key=MASTER_KEY,
            digest=self.digest,
            unsafe_keep_failed=keep_failed,
        )
        self.entries_to_write = 10_000  # until the end: failures need pending entries
        self.may_close = False

    def run(self, max_steps: int = 200_000) -> None:
        world, rnd = self.world, self.world.rnd
        world.at(1, self.writer_append)
        when = 20
        for _ in range(rnd.randint(3, 5)):  # one at a time, each back before the next
            down_for = rnd.randint(30, 120)
            world.at(when, self.crash_one_of_the_ensemble(down_for))
            when += down_for + rnd.randint(80, 200)
        world.at(when, self.stop_writing)
        steps = 0
        while world.step():
            steps += 1
            if steps > max_steps:
                self.fail("the simulation did not settle (livelock?)")
        if self.writer.state is not WriterState.WRITING:
            self.fail(
                f"the writer is {self.writer.state.value} ({self.writer.error!r}) although "
                "every bookie is back: it never recovers"
            )
        last = self.writer.tracker.next_entry_id
        self.append([self.payload(last)])
        while world.step():
            pass
        if self.writer.last_add_confirmed < last:
            self.fail(f"a last append ({last}) after healing was never acknowledged")

    def crash_one_of_the_ensemble(self, down_for: int):  # type: ignore[no-untyped-def]
        def crash() -> None:
            victim = self.world.rnd.choice(self.writer.ensemble)
            self.crash(victim, down_for)

        return crash

    def stop_writing(self) -> None:
        self.entries_to_write = 0


def run_placement_seed(seed: int, *, keep_failed: bool = False) -> RepeatedFailures:
    flags = " --keep-failed" if keep_failed else ""
    return run_replayable(
        RepeatedFailures(seed, keep_failed=keep_failed),
        f"repeated failures{flags}",
        f"--placement{flags}",
    )
