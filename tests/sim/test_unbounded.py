"""Term mode (unbounded ledgers) in the simulator: takeovers by term, the TRUNCATE no-op,
and the log-divergence counterexample of unbounded-ledgers.txt."""

import os

import pytest

from streamlib.protocol.actions import EntryData
from streamlib.protocol.errors import StatusCode
from tests.sim.cluster import NetworkConfig
from tests.sim.scenario import LEDGER_ID, MASTER_KEY, InvariantViolation
from tests.sim.unbounded import UnboundedScenario, run_unbounded_seed

SEEDS = int(os.environ.get("SIM_UNBOUNDED_SEEDS", "1000"))
CHUNK = 250


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
def test_takeovers_by_term_keep_every_acknowledged_entry(first):
    for seed in range(first, min(first + CHUNK, SEEDS)):
        run_unbounded_seed(seed)


def test_simulator_finds_the_divergence_without_the_truncate_step():
    for seed in range(SEEDS):
        try:
            run_unbounded_seed(seed, skip_truncate=True)
        except InvariantViolation as violation:
            assert "diverge" in str(violation) or "lost or changed" in str(violation)
            return
    pytest.fail(f"no divergence found in {SEEDS} seeds with the truncate step off")


QUIET = NetworkConfig(min_delay=1, max_delay=1, drop_rate=0.0, timeout=50)


def divergence_scenario(skip_truncate):
    """The seed's counterexample: c1 wrote entries 0 and 1; entry 1 reached only b0 (the
    seed's b1). c2 takes over while b0 is unreachable, recovers to 0, and writes."""
    s = UnboundedScenario(
        0, skip_truncate=skip_truncate, net=QUIET, quorums=(3, 2), ensemble=("b0", "b1", "b2")
    )
    for entry_id, holders in ((0, ("b0", "b1", "b2")), (1, ("b0",))):
        payload = b"c1-entry-%d" % entry_id
        length = len(payload) * (entry_id + 1)
        entry = EntryData(
            entry_id, entry_id - 1, length, payload,
            s.digest.compute(entry_id, entry_id - 1, length, payload),
        )  # fmt: skip
        for bookie in holders:
            assert s.world.bookies[bookie].add(LEDGER_ID, entry, MASTER_KEY, 0, 1) == StatusCode.OK
    s.max_takeovers = 1
    s.crash("b0", 120)  # unreachable for a while, then back with its dirty entry 1
    s.start_recovery()
    while s.world.step():
        pass
    return s


def test_divergence_counterexample_does_not_diverge_with_truncate():
    s = divergence_scenario(skip_truncate=False)
    recovery = s.recoveries[-1]
    assert recovery.last_entry_id == 0  # entry 1 was unrecoverable (b1, b2: no such entry)
    assert recovery.next_entry_id == 2  # the no-op holds id 1
    assert s.acked and min(s.acked) == 2  # c2's entries come after the no-op
    for bookie in ("b0", "b1", "b2"):
        stored = s.world.bookies[bookie].ledgers[LEDGER_ID].entries[1]
        assert stored.payload == b"" and stored.flags  # the TRUNCATE no-op, everywhere
    s.check_final()


def test_divergence_counterexample_diverges_without_truncate():
    s = divergence_scenario(skip_truncate=True)
    assert 1 in s.acked and s.acked[1].startswith(b"seed0-w1")  # c2's own entry 1
    copies = {b: s.world.bookies[b].ledgers[LEDGER_ID].entries[1].payload for b in ("b0", "b1")}
    assert copies["b0"] == b"c1-entry-1" != copies["b1"]  # two committed versions of entry 1
