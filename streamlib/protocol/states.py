"""Ledger states and every metadata state transition, as tables (protocol.txt "Ledger
metadata", "Closing a ledger as a writer", "Closing a ledger as a reader";
fencing.txt "Fencing internals"; unbounded-ledgers.txt Fig. 2).

Rule 1 (after h11): every decision about ledger state lives in this file. The I/O
layers ask; they do not re-decide.

Theory of operation. A bounded ledger goes OPEN -> (IN_RECOVERY ->) CLOSED and never
back. Recovery marks IN_RECOVERY first so the old writer's ensemble change fails its
CAS and, on re-reading, sees it must stop. Several recoveries may run at once: each
re-marks IN_RECOVERY (a no-op transition) and they converge on one CLOSED metadata
through CAS. An unbounded ledger (term mode) instead returns from IN_RECOVERY to OPEN
under a higher term: recovery happens at the start of every term.
"""

from __future__ import annotations

import enum

from streamlib.protocol.errors import IllegalTransitionError


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class LedgerEvent(enum.Enum):
    START_RECOVERY = "start_recovery"  # a reader fences: CAS to IN_RECOVERY
    WRITER_CLOSE = "writer_close"  # the writer closes at its LAC
    RECOVERY_CLOSE = "recovery_close"  # recovery closes at the last recoverable entry
    ENSEMBLE_CHANGE = "ensemble_change"  # the writer (or re-replication) adds a fragment
    REOPEN_NEW_TERM = "reopen_new_term"  # unbounded: recovery of a term done, writable again


# (state, event, unbounded) -> next state. Absent = illegal.
TRANSITIONS: dict[tuple[LedgerState, LedgerEvent, bool], LedgerState] = {}
for _unbounded in (False, True):
    TRANSITIONS.update(
        {
            (LedgerState.OPEN, LedgerEvent.START_RECOVERY, _unbounded): LedgerState.IN_RECOVERY,
            (
                LedgerState.IN_RECOVERY,
                LedgerEvent.START_RECOVERY,
                _unbounded,
            ): LedgerState.IN_RECOVERY,
            (LedgerState.OPEN, LedgerEvent.WRITER_CLOSE, _unbounded): LedgerState.CLOSED,
            (LedgerState.IN_RECOVERY, LedgerEvent.RECOVERY_CLOSE, _unbounded): LedgerState.CLOSED,
            (LedgerState.OPEN, LedgerEvent.ENSEMBLE_CHANGE, _unbounded): LedgerState.OPEN,
        }
    )
TRANSITIONS[(LedgerState.IN_RECOVERY, LedgerEvent.REOPEN_NEW_TERM, True)] = LedgerState.OPEN
# Re-replication (autorecovery) may swap bookies of a CLOSED ledger's fragments.
TRANSITIONS[(LedgerState.CLOSED, LedgerEvent.ENSEMBLE_CHANGE, False)] = LedgerState.CLOSED
TRANSITIONS[(LedgerState.CLOSED, LedgerEvent.ENSEMBLE_CHANGE, True)] = LedgerState.CLOSED


def next_state(state: LedgerState, event: LedgerEvent, *, unbounded: bool = False) -> LedgerState:
    try:
        return TRANSITIONS[(state, event, unbounded)]
    except KeyError:
        kind = "unbounded" if unbounded else "bounded"
        raise IllegalTransitionError(
            f"{kind} ledger in state {state.value} cannot take {event.value}"
        ) from None


class CloseConflictOutcome(enum.Enum):
    RETRY = "retry"  # still OPEN (someone changed something else): close again
    SUCCESS = "success"  # already CLOSED at exactly our LAC
    FAIL_IN_RECOVERY = "fail_in_recovery"  # a recovery is closing it: LedgerFencedError
    FAIL_CLOSED_ELSEWHERE = "fail_closed_elsewhere"  # CLOSED at another entry: error


def on_writer_close_conflict(
    state: LedgerState, last_entry_id: int, writer_lac: int, *, same_term: bool = True
) -> CloseConflictOutcome:
    """What a writer does when its CLOSE CAS failed and it re-read the metadata
    (protocol.txt "Closing a ledger as a writer"):

    | re-read state | re-read last entry | outcome               |
    |---------------|--------------------|-----------------------|
    | OPEN          | -                  | RETRY                 |
    | IN_RECOVERY   | -                  | FAIL_IN_RECOVERY      |
    | CLOSED        | == writer's LAC    | SUCCESS               |
    | CLOSED        | != writer's LAC    | FAIL_CLOSED_ELSEWHERE |

    Term mode adds one row first: a term other than the writer's means another writer
    took over (and may have reopened the ledger): FAIL_IN_RECOVERY, whatever the state.
    """
    if not same_term:
        return CloseConflictOutcome.FAIL_IN_RECOVERY
    if state is LedgerState.OPEN:
        return CloseConflictOutcome.RETRY
    if state is LedgerState.IN_RECOVERY:
        return CloseConflictOutcome.FAIL_IN_RECOVERY
    if last_entry_id == writer_lac:
        return CloseConflictOutcome.SUCCESS
    return CloseConflictOutcome.FAIL_CLOSED_ELSEWHERE


class EnsembleChangeConflictOutcome(enum.Enum):
    RETRY = "retry"  # still OPEN: re-apply the replacement to the fresh metadata
    FAIL_ADDS = "fail_adds"  # no longer OPEN: fail every outstanding add


def on_ensemble_change_conflict(
    state: LedgerState, *, same_term: bool = True
) -> EnsembleChangeConflictOutcome:
    """protocol.txt: "If the CAS write fails ... We reread the metadata. If the state of
    the ledger is no longer OPEN, we send an error to the client for any outstanding
    writes. Otherwise, we try to replace the failed node again."

    | re-read state        | re-read term       | outcome   |
    |----------------------|--------------------|-----------|
    | any                  | not the writer's   | FAIL_ADDS |
    | OPEN                 | the writer's       | RETRY     |
    | IN_RECOVERY, CLOSED  | the writer's       | FAIL_ADDS |

    The term row is term mode's: a takeover may already have REOPENED the ledger under
    a higher term, so "still OPEN" no longer means "still mine" (the simulator found an
    old writer landing its ensemble change on the new term's metadata and completing
    adds through a bookie that had not seen the new term).
    """
    if same_term and state is LedgerState.OPEN:
        return EnsembleChangeConflictOutcome.RETRY
    return EnsembleChangeConflictOutcome.FAIL_ADDS
