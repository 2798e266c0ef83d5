"""Compaction in the simulator (tests/sim/compaction.py): compactors racing and dying at
every step, retention `compacted` with durable cursors, and compacted readers starting
anywhere keep the view right, lose nothing a cursor needs, and read every key's latest
value; each unsafe variant is caught."""

import pytest

from tests.sim.compaction import MUTATIONS, run_compaction_seed
from tests.sim.scenario import InvariantViolation
from tests.sim.test_simulation import CHUNK, SEEDS, first_violation

COMPACTION_SEEDS = SEEDS // 8  # (about 17 ms a seed)


@pytest.mark.parametrize("first", range(0, COMPACTION_SEEDS, CHUNK))
def test_no_invariant_breaks_as_compactors_race_and_die(first):
    for seed in range(first, min(first + CHUNK, COMPACTION_SEEDS)):
        run_compaction_seed(seed)


@pytest.mark.parametrize("mutation", [m for m in MUTATIONS if m != "none"])
def test_the_simulator_catches_each_unsafe_compaction_variant(mutation):
    found = first_violation(lambda seed: run_compaction_seed(seed, mutation), mutation)
    assert f"--compaction --compaction-mutation {mutation}" in found


def test_a_compaction_seed_replays_exactly():
    first = run_compaction_seed(77).trace
    assert first == run_compaction_seed(77).trace
    assert len(first) > 100


def test_compaction_scenarios_exercise_what_they_claim():
    # Compactors die at every step, lose the install race, retention deletes below the
    # horizon, readers are passed by a new view (at a ledger move, or at a ledger that
    # went) or lose the view they read, durable readers come back, chunked messages are
    # given up and unfinished ones move the horizon back.
    claims = [f"dies after {step}" for step in ("scanned", "created", "written", "closed")]
    claims += ["dies after installed", "superseded by view", "a new view passed",
               "went; a new view passed", "went while read", "reconnects after",
               "gives chunked message"]  # fmt: skip
    seen = dict.fromkeys(claims, 0)
    moved_back = trimmed = missed = 0
    for seed in range(50):
        scenario = run_compaction_seed(seed)
        trace = "\n".join(scenario.trace)
        for claim in seen:
            seen[claim] += claim in trace
        for line in scenario.trace:
            if ": scanned up to " in line:
                end, horizon = line.split(": scanned up to ")[1].split(", horizon ")
                moved_back += end != horizon
            trimmed += "retention: marks" in line and "deletes []" not in line
        missed += scenario.missed_deletions
    assert all(count > 0 for count in seen.values()), seen
    assert moved_back > 0 and trimmed > 50 and missed > 0


@pytest.mark.xfail(
    strict=True,
    raises=InvariantViolation,
    reason="a compaction slower than the sweeper's grace has its ledger swept (not "
    "installed yet); a sweep between its close and its install leaves the installed view "
    "naming a deleted ledger: Compactor does not protect its ledger from StreamAdmin.sweep",
)
def test_a_compaction_slower_than_the_sweepers_grace_installs_a_ledger_that_exists():
    run_compaction_seed(37, sweep_grace=100)
