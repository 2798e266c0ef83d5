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
            # Divergence, or (readers and recoveries reject copies older than their
            # fragment's term) the old term's dirty entries leave the end undecidable.
            found = str(violation)
            assert any(
                what in found for what in ("diverge", "lost or changed", "past the recovered end")
            ), found
            return
    pytest.fail(f"no divergence found in {SEEDS} seeds with the truncate step off")


QUIET = NetworkConfig(min_delay=1, max_delay=1, drop_rate=0.0, timeout=50)


def divergence_scenario(skip_truncate):
    """The seed's counterexample: c1 wrote entries 0 and 1; entry 1 reached only b0 (the
    seed's b1). c2 takes over while b0 is unreachable, recovers to 0, and writes; we look
    at the bookies once c2 has had entries acknowledged, b0 still unreachable."""
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
    s.crash("b0", 100_000)  # unreachable (its dirty entry 1 is still on its disk)
    s.start_recovery()
    for _ in range(20_000):
        if len(s.acked) >= 3 or not s.world.step():
            break
    assert len(s.acked) >= 3, "c2 got nothing acknowledged"
    return s


def copies_of(s, entry_id, bookies):
    stored = {}
    for b in bookies:
        entry = s.world.bookies[b].ledgers[LEDGER_ID].entries.get(entry_id)
        stored[b] = entry.payload if entry is not None else None
    return stored


def test_divergence_counterexample_does_not_diverge_with_truncate():
    s = divergence_scenario(skip_truncate=False)
    recovery = s.recoveries[-1]
    assert recovery.last_entry_id == 0  # entry 1 was unrecoverable (b1, b2: no such entry)
    assert recovery.next_entry_id == 2  # the no-op holds id 1
    assert min(s.acked) == 2  # c2's entries come after the no-op
    metadata, _ = s.world.metadata.read(LEDGER_ID)
    assert "b0" not in metadata.write_set_bookies(1)  # unreachable: replaced for the no-op
    for entry_id in range(max(s.acked) + 1):  # every write set agrees on every entry
        held = copies_of(s, entry_id, metadata.write_set_bookies(entry_id))
        assert len(set(held.values())) == 1, (entry_id, held)
    assert set(copies_of(s, 1, metadata.write_set_bookies(1)).values()) == {b""}  # the no-op


def test_divergence_counterexample_diverges_without_truncate():
    s = divergence_scenario(skip_truncate=True)
    assert s.acked[1].startswith(b"seed0-w1")  # c2's own entry 1, acknowledged (b1, b2)
    copies = copies_of(s, 1, ("b0", "b1", "b2"))
    assert copies["b0"] == b"c1-entry-1"  # ... while b0 holds another entry 1
    assert copies["b1"] == copies["b2"] == s.acked[1]


def test_term_scenarios_exercise_what_they_claim():
    seen = {"takes over": 0, "CAS fragment_roll ok": 0, "CRASH": 0, "CAS reopen ok": 0}
    for seed in range(150):
        trace = "\n".join(run_unbounded_seed(seed).world.trace)
        for key in seen:
            seen[key] += key in trace
    assert all(count > 0 for count in seen.values()), seen
