"""Write sets and quorum coverage (protocol.txt; closing-ledgers-safely.txt)."""

from itertools import chain, combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamlib.protocol import (
    EnsembleCoverage,
    covers_by_count,
    covers_every_ack_quorum,
    ensemble_write_sets,
    negative_read_threshold,
    validate_quorums,
    write_set,
)
from streamlib.protocol.errors import InvalidLedgerConfigError


def subsets(items):
    items = list(items)
    return chain.from_iterable(combinations(items, n) for n in range(len(items) + 1))


def test_write_quorums_of_protocol_txt_table():
    # protocol.txt: E=4, Qw=3, Qa=2, ensemble B1..B4, the write quorums of entries 0-5.
    ensemble = ["B1", "B2", "B3", "B4"]
    expected = {
        0: ["B1", "B2", "B3"],
        1: ["B2", "B3", "B4"],
        2: ["B3", "B4", "B1"],
        3: ["B4", "B1", "B2"],
        4: ["B1", "B2", "B3"],
        5: ["B2", "B3", "B4"],
    }
    for entry_id, bookies in expected.items():
        assert [ensemble[i] for i in write_set(entry_id, 4, 3)] == bookies


def test_write_quorum_equal_to_ensemble_means_no_striping():
    assert {write_set(e, 3, 3) for e in range(10)} == {(0, 1, 2), (1, 2, 0), (2, 0, 1)}
    assert all(sorted(ws) == [0, 1, 2] for ws in ensemble_write_sets(3, 3))


@pytest.mark.parametrize(
    ("wq", "aq", "negatives_required"),
    [(2, 1, 2), (2, 2, 1), (3, 1, 3), (3, 2, 2), (3, 3, 1), (4, 2, 3), (4, 3, 2), (4, 4, 1)],
)
def test_negative_read_threshold_table(wq, aq, negatives_required):
    # closing-ledgers-safely.txt, "Neg Responses Required".
    assert negative_read_threshold(wq, aq) == negatives_required


@pytest.mark.parametrize(
    ("e", "qw", "qa"), [(2, 3, 1), (3, 2, 3), (3, 3, 0), (0, 0, 0), (3, 2, -1), (2.0, 2, 1)]
)
def test_creation_rule_rejects_bad_quorums(e, qw, qa):
    with pytest.raises(InvalidLedgerConfigError):
        validate_quorums(e, qw, qa)


def test_both_coverage_formulations_agree_for_every_cohort_up_to_six():
    # "at least one of every ack quorum" == "(cohort - AQ) + 1 satisfy it", exhaustively.
    checked = 0
    for size in range(1, 7):
        cohort = range(size)
        for aq in range(1, size + 1):
            for satisfied in subsets(cohort):
                assert covers_every_ack_quorum(cohort, satisfied, aq) == covers_by_count(
                    cohort, satisfied, aq
                ), (size, aq, satisfied)
                checked += 1
    assert checked == sum(n * 2**n for n in range(1, 7))


def every_ack_quorum_of_the_ensemble_touched(e, qw, qa, satisfied):
    """The definition over an ensemble: every ack quorum (a Qa-subset of any write set)
    contains a satisfying bookie."""
    return all(covers_every_ack_quorum(ws, satisfied, qa) for ws in ensemble_write_sets(e, qw))


def test_ensemble_coverage_equals_definition_for_every_ensemble_up_to_six():
    for e in range(1, 7):
        for qw in range(1, e + 1):
            for qa in range(1, qw + 1):
                for satisfied in subsets(range(e)):
                    coverage = EnsembleCoverage(e, qw, qa)
                    coverage.add_all(satisfied)
                    assert coverage.is_covered() == every_ack_quorum_of_the_ensemble_touched(
                        e, qw, qa, satisfied
                    ), (e, qw, qa, satisfied)


def test_fencing_e3_qw2_qa2_needs_two_bookies():
    # fencing.txt's example ensemble: E=3, Qw=2 (Qa=2). One fenced bookie leaves the
    # write set of the other two unfenced; any two cover every write set.
    coverage = EnsembleCoverage(3, 2, 2)
    assert not coverage.add(0)
    assert coverage.add(1)


def test_fencing_with_ack_quorum_one_needs_every_bookie():
    coverage = EnsembleCoverage(3, 3, 1)
    assert not coverage.add_all([0, 1])
    assert coverage.add(2)


@given(
    st.integers(1, 6).flatmap(
        lambda e: st.tuples(
            st.just(e),
            st.integers(1, e).flatmap(lambda qw: st.tuples(st.just(qw), st.integers(1, qw))),
            st.sets(st.integers(0, e - 1)),
        )
    )
)
def test_coverage_formulations_agree_property(args):
    e, (qw, qa), satisfied = args
    for ws in ensemble_write_sets(e, qw):
        assert covers_every_ack_quorum(ws, satisfied, qa) == covers_by_count(ws, satisfied, qa)
    coverage = EnsembleCoverage(e, qw, qa)
    coverage.add_all(satisfied)
    assert coverage.is_covered() == every_ack_quorum_of_the_ensemble_touched(e, qw, qa, satisfied)
