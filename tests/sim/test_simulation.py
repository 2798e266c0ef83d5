"""The deterministic simulation: the real protocol state machines against seeded faults.

CI runs SIM_SEEDS seeds (default 2,000); `python -m tests.sim --seeds 20000` is the long
run. Each known-unsafe variant must be caught within the same budget: a simulator that
cannot catch them has no teeth.
"""

import os
from collections.abc import Callable

import pytest

from tests.sim.placement import run_placement_seed
from tests.sim.scenario import InvariantViolation, run_seed
from tests.sim.streams import run_stream_seed

SEEDS = int(os.environ.get("SIM_SEEDS", "2000"))
CHUNK = 250


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
def test_no_invariant_breaks_under_faults(first):
    for seed in range(first, min(first + CHUNK, SEEDS)):
        run_seed(seed)


def first_violation(run: Callable[[int], object], what: str) -> str:
    """The report of the first seed whose run breaks an invariant (the test fails if no
    seed of the budget does: a simulator that cannot catch a variant has no teeth)."""
    for seed in range(SEEDS):
        try:
            run(seed)
        except InvariantViolation as violation:
            assert f"seed {seed}" in str(violation)
            return str(violation)
    pytest.fail(f"the simulator did not catch {what} in {SEEDS} seeds")


@pytest.mark.parametrize("mutation", ["skip_fencing", "unknown_as_negative", "skip_write_back"])
def test_simulator_catches_each_known_unsafe_variant(mutation):
    found = first_violation(lambda seed: run_seed(seed, mutation), mutation)
    assert "replay: python -m tests.sim" in found


def test_a_seed_replays_exactly():
    first = run_seed(1234).world.trace
    again = run_seed(1234).world.trace
    assert first == again
    assert len(first) > 10


def test_scenarios_exercise_the_faults_they_claim():
    # Across a few hundred seeds the simulator must really produce crashes, ensemble
    # changes, recoveries that abort and retry, and concurrent recoveries.
    seen = {
        "CRASH": 0,
        "ensemble_change ok": 0,
        "failed: RecoveryAbortedError": 0,
        "recovery1": 0,
        "CAS recovery_close conflict": 0,
    }
    for seed in range(400):
        trace = "\n".join(run_seed(seed).world.trace)
        for key in seen:
            seen[key] += key in trace
    assert all(count > 0 for count in seen.values()), seen


@pytest.mark.parametrize("first", range(0, SEEDS // 4, CHUNK))
def test_a_writer_outlives_repeated_bookie_failures(first):
    for seed in range(first, min(first + CHUNK, SEEDS // 4)):
        run_placement_seed(seed)


def test_simulator_catches_a_writer_that_never_forgets_failed_bookies():
    found = first_violation(
        lambda seed: run_placement_seed(seed, keep_failed=True), "a writer banning bookies"
    )
    assert "never recovers" in found
    assert "replay: python -m tests.sim --placement" in found


@pytest.mark.parametrize("first", range(0, SEEDS // 4, CHUNK))
def test_streams_keep_every_acknowledged_message_under_duels_and_outages(first):
    for seed in range(first, min(first + CHUNK, SEEDS // 4)):
        run_stream_seed(seed)


def test_simulator_catches_a_reader_that_fences():
    found = first_violation(
        lambda seed: run_stream_seed(seed, reader_fences=True), "a reader that fences"
    )
    assert "no writer took over after it" in found
    assert "replay: python -m tests.sim --streams" in found


def test_stream_scenarios_exercise_the_faults_they_claim():
    # Duels, crashed writers, outages that break a writer's ledger (and replacements
    # that fail until bookies return), list CAS conflicts and rolls must all happen.
    seen = dict.fromkeys(
        ["gives up", "is broken", "replace failed", "KILL writer", "list CAS conflict"], 0
    )
    rolls = 0
    for seed in range(150):
        scenario = run_stream_seed(seed)
        trace = "\n".join(scenario.world.trace)
        for key in seen:
            seen[key] += key in trace
        rolls += sum(w.machine.rolls for w in scenario.writers)
    assert all(count > 0 for count in seen.values()), seen
    assert rolls > 150
