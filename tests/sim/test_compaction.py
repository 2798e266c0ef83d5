"""Compaction in the simulator (tests/sim/compaction.py): compactors racing, dying and
stopped at every step -- one at a time, by the compactor node -- the sweeper of leaked
ledgers, retention `compacted` (or none) with durable cursors, and compacted readers
starting anywhere keep the view right, lose nothing a cursor needs, and read every key's
latest value; each unsafe variant is caught, and so is each bug the model found in
streamlib's first compaction code (compaction.FIXES: fixed since, each pinned to a seed
where the code as it was breaks an invariant)."""

import pytest

from tests.sim.compaction import FIXES, MUTATIONS, run_compaction_seed
from tests.sim.scenario import InvariantViolation
from tests.sim.test_simulation import CHUNK, SEEDS, first_violation

COMPACTION_SEEDS = SEEDS // 8  # (about 15 ms a seed)


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
    # Compactors die at every step, are refused while another holds the node, outlive
    # their sessions (stopped) and lose their node, lose the install race; the sweeper
    # collects leaks and leaves a live compactor's ledger alone; retention deletes below
    # the horizon; readers are passed by a new view (ledgers they knew went, or one went
    # while read) or lose the view they read, durable readers come back, chunked messages
    # are given up and unfinished ones move the horizon back, new writers leave empty
    # ledgers.
    claims = [f"dies after {step}" for step in ("scanned", "created", "written", "closed")]
    claims += ["dies after installed", "superseded by view", "ledgers it knew went",
               "went; a new view passed", "went while read", "reconnects after",
               "gives chunked message", "refused, the stream is being compacted",
               "is stopped for", "expires, its node goes", "its node is gone",
               "the sweeper collects a leak", "the sweeper leaves ledger",
               "closed with 0 entries"]  # fmt: skip
    seen = dict.fromkeys(claims, 0)
    moved_back = trimmed = 0
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
    assert all(count > 0 for count in seen.values()), seen
    assert moved_back > 0 and trimmed > 30


def test_a_compacted_reader_sees_every_tombstone_unless_retention_deleted_its_ledgers():
    """A reader a compaction passes while it reads the stream stays in the stream while
    its ledgers are there, so it reads every update, tombstones included: with retention
    that deletes nothing, every seed holds it to that (an invariant, from where it began
    reading the stream). With retention `compacted`, the ledgers below the new horizon go,
    and a reader behind it reads the new view -- which has no tombstones -- and can miss
    a deletion: counted, not a violation. That is Pulsar's behaviour (a compacted reader
    behind the compaction horizon reads the compacted ledger; Kafka's
    delete.retention.ms bounds how long a lagging consumer can still see a tombstone)."""
    passed = {True: 0, False: 0}
    missed = {True: 0, False: 0}
    for seed in range(40):
        scenario = run_compaction_seed(seed)
        passed[scenario.compacted_retention] += scenario.passed
        missed[scenario.compacted_retention] += scenario.missed_deletions
    assert passed[False] > 50  # lagging readers, retention none: held to every tombstone
    assert passed[True] > 50 and missed[True] > 0  # retention compacted: misses possible


def test_a_compaction_slower_than_the_sweepers_grace_installs_a_ledger_that_exists():
    # The sweeper's grace shorter than many compactions: it leaves the ledger a live
    # compactor's node names alone; one that outlived its session may lose its ledger,
    # and then installs nothing (the install's check of the ledger).
    swept = kept = 0
    for seed in range(300):
        scenario = run_compaction_seed(seed, sweep_grace=100)
        swept += scenario.swept
        kept += "the sweeper leaves ledger" in "\n".join(scenario.trace)
    assert kept > 0 and swept > 0


# Seeds where each bug the model found (compaction.FIXES, fixed since) breaks an invariant
# when the model takes the code as it was: python -m tests.sim --compaction
# --compaction-as-is BUG --seed N
AS_IS = [
    ("own_node", 3),  # two compactors at once
    ("sweep_checks_stream", 100),  # the installed view's ledger swept
    ("skipped_unlisted", 263),  # past an empty ledger: a tombstone missed, retention none
    ("last_ledger_listed", 123),  # a tailing reader's later ledgers: a latest value missed
    ("last_ledger_listed", 715),  # its own ledger gone at the view's end: the same
]


def test_each_bug_of_streamlib_has_a_seed():
    assert {bug for bug, _ in AS_IS} == set(FIXES)


@pytest.mark.parametrize(("bug", "seed"), AS_IS)
def test_the_simulator_catches_each_bug_the_code_had(bug, seed):
    with pytest.raises(InvariantViolation):
        run_compaction_seed(seed, as_is=[bug])
