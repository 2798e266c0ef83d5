"""Ledger state transitions and the writer-close CAS-conflict table (protocol.txt)."""

import pytest

from streamlib.protocol import (
    CloseConflictOutcome,
    EnsembleChangeConflictOutcome,
    LedgerEvent,
    LedgerState,
    next_state,
    on_ensemble_change_conflict,
    on_writer_close_conflict,
)
from streamlib.protocol.errors import IllegalTransitionError

OPEN, REC, CLOSED = LedgerState.OPEN, LedgerState.IN_RECOVERY, LedgerState.CLOSED
E = LedgerEvent

BOUNDED_LEGAL = {
    (OPEN, E.START_RECOVERY): REC,
    (REC, E.START_RECOVERY): REC,  # concurrent recoveries
    (OPEN, E.WRITER_CLOSE): CLOSED,
    (REC, E.RECOVERY_CLOSE): CLOSED,
    (OPEN, E.ENSEMBLE_CHANGE): OPEN,
    (CLOSED, E.ENSEMBLE_CHANGE): CLOSED,  # re-replication of a closed ledger
}


@pytest.mark.parametrize("state", list(LedgerState))
@pytest.mark.parametrize("event", list(LedgerEvent))
def test_bounded_ledger_transition_table(state, event):
    if (state, event) in BOUNDED_LEGAL:
        assert next_state(state, event) is BOUNDED_LEGAL[(state, event)]
    else:
        with pytest.raises(IllegalTransitionError):
            next_state(state, event)


def test_closed_bounded_ledger_never_reopens():
    for event in (E.START_RECOVERY, E.WRITER_CLOSE, E.RECOVERY_CLOSE, E.REOPEN_NEW_TERM):
        with pytest.raises(IllegalTransitionError):
            next_state(CLOSED, event)


def test_writer_cannot_change_ensemble_during_recovery():
    with pytest.raises(IllegalTransitionError):
        next_state(REC, E.ENSEMBLE_CHANGE)


def test_unbounded_ledger_reopens_after_recovery_of_a_term():
    assert next_state(OPEN, E.START_RECOVERY, unbounded=True) is REC
    assert next_state(REC, E.REOPEN_NEW_TERM, unbounded=True) is OPEN
    with pytest.raises(IllegalTransitionError):
        next_state(REC, E.REOPEN_NEW_TERM, unbounded=False)


@pytest.mark.parametrize(
    ("state", "last_entry", "lac", "outcome"),
    [
        (OPEN, -1, 10, CloseConflictOutcome.RETRY),
        (REC, -1, 10, CloseConflictOutcome.FAIL_IN_RECOVERY),
        (CLOSED, 10, 10, CloseConflictOutcome.SUCCESS),
        (CLOSED, 12, 10, CloseConflictOutcome.FAIL_CLOSED_ELSEWHERE),
        (CLOSED, 9, 10, CloseConflictOutcome.FAIL_CLOSED_ELSEWHERE),
    ],
)
def test_writer_close_conflict_table(state, last_entry, lac, outcome):
    assert on_writer_close_conflict(state, last_entry, lac) is outcome


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        (OPEN, EnsembleChangeConflictOutcome.RETRY),
        (REC, EnsembleChangeConflictOutcome.FAIL_ADDS),
        (CLOSED, EnsembleChangeConflictOutcome.FAIL_ADDS),
    ],
)
def test_ensemble_change_conflict_table(state, outcome):
    assert on_ensemble_change_conflict(state) is outcome


@pytest.mark.parametrize("state", list(LedgerState))
def test_a_new_term_fails_the_old_writer_whatever_the_state(state):
    # Term mode: a takeover may have REOPENED the ledger (OPEN again, higher term).
    assert (
        on_ensemble_change_conflict(state, same_term=False)
        is EnsembleChangeConflictOutcome.FAIL_ADDS
    )
    assert (
        on_writer_close_conflict(state, 10, 10, same_term=False)
        is CloseConflictOutcome.FAIL_IN_RECOVERY
    )
