"""Recovery-read decisions (closing-ledgers-safely.txt, Figs. 7-10c), checked exhaustively."""

from itertools import combinations, permutations, product

import pytest

from streamlib.protocol import (
    EntryRecoveryRead,
    ReadOutcome,
    RecoveryDecision,
    classify_read_status,
)
from streamlib.protocol.errors import StatusCode

P, N, U = ReadOutcome.POSITIVE, ReadOutcome.NEGATIVE, ReadOutcome.UNKNOWN
RECOVERABLE = RecoveryDecision.RECOVERABLE
UNRECOVERABLE = RecoveryDecision.UNRECOVERABLE
WAIT = RecoveryDecision.WAIT
ABORT = RecoveryDecision.ABORT


def run(outcomes, wq=3, aq=2, **kwargs):
    """Feed outcomes from bookies 0, 1, 2, ... and return the decision after each."""
    read = EntryRecoveryRead(12, tuple(range(wq)), aq, **kwargs)
    return [read.on_response(i, outcome) for i, outcome in enumerate(outcomes)]


# The blog's figures use WQ=3, AQ=2 (negative threshold 2).
@pytest.mark.parametrize(
    ("figure", "outcomes", "decisions"),
    [
        (
            "7: 2nd positive -> recoverable, rest ignored",
            [N, P, N],
            [WAIT, RECOVERABLE, RECOVERABLE],
        ),
        ("8: first two negative", [N, N], [WAIT, UNRECOVERABLE]),
        ("9: no explicit answer -> abort", [U, U, U], [WAIT, WAIT, ABORT]),
        ("10: neither threshold -> wait", [N, U], [WAIT, WAIT]),
        ("10a: last is positive", [N, U, P], [WAIT, WAIT, RECOVERABLE]),
        ("10b: last is negative", [N, U, N], [WAIT, WAIT, UNRECOVERABLE]),
        ("10c: last is unknown -> abort", [N, U, U], [WAIT, WAIT, ABORT]),
    ],
)
def test_blog_figures(figure, outcomes, decisions):
    assert run(outcomes) == decisions, figure


def might_be_committed(write_set, answered, aq):
    """Semantics: the entry may be committed if some ack quorum of the write set has no
    bookie that answered NEGATIVE (a negative is a bookie whose index lacks it)."""
    return any(
        all(answered.get(b) is not N for b in quorum) for quorum in combinations(write_set, aq)
    )


def expected(write_set, answered, aq):
    if any(o is P for o in answered.values()):
        return RECOVERABLE
    if not might_be_committed(write_set, answered, aq):
        return UNRECOVERABLE
    if len(answered) == len(write_set):
        return ABORT
    return WAIT


@pytest.mark.parametrize("wq", [1, 2, 3, 4])
def test_every_response_order_decides_like_the_semantics(wq):
    checked = 0
    for aq in range(1, wq + 1):
        write_set = tuple(range(wq))
        for order in permutations(write_set):
            for outcomes in product([P, N, U], repeat=wq):
                read = EntryRecoveryRead(7, write_set, aq)
                answered: dict[int, ReadOutcome] = {}
                sticky = WAIT
                for bookie, outcome in zip(order, outcomes, strict=True):
                    got = read.on_response(bookie, outcome)
                    answered[bookie] = outcome
                    if sticky is WAIT:
                        sticky = expected(write_set, answered, aq)
                    assert got is sticky, (wq, aq, order, outcomes)
                    checked += 1
                # A decision is final once all have answered: never left waiting.
                assert read.decision is not WAIT
    assert checked > 0


def test_unrecoverable_never_while_an_ack_quorum_might_hold_the_entry():
    # The safety property behind the threshold, over all orders for WQ <= 4.
    for wq in range(1, 5):
        for aq in range(1, wq + 1):
            for outcomes in product([N, U], repeat=wq):
                decisions = run(outcomes, wq=wq, aq=aq)
                for k, decision in enumerate(decisions, start=1):
                    answered = dict(enumerate(outcomes[:k]))
                    if decision is UNRECOVERABLE:
                        assert not might_be_committed(tuple(range(wq)), answered, aq)


def test_duplicate_answer_from_a_bookie_is_ignored():
    read = EntryRecoveryRead(3, (0, 1, 2), 2)
    assert read.on_response(0, N) is WAIT
    assert read.on_response(0, N) is WAIT  # the same bookie twice is not two negatives
    assert read.on_response(1, N) is UNRECOVERABLE


def test_answer_from_outside_the_write_set_is_rejected():
    read = EntryRecoveryRead(3, (0, 1), 2)
    with pytest.raises(ValueError):
        read.on_response(2, P)


def test_counting_unknown_as_negative_is_the_unsafe_variant():
    # Two timeouts (WQ=3, AQ=2) must not close the ledger: the entry may sit on exactly them.
    assert run([U, U]) == [WAIT, WAIT]
    assert run([U, U], unknown_counts_as_negative=True) == [WAIT, UNRECOVERABLE]


@pytest.mark.parametrize(
    ("status", "digest_ok", "outcome"),
    [
        (StatusCode.OK, True, P),
        (StatusCode.OK, False, U),  # a corrupt copy is "try another replica", not absent
        (StatusCode.NO_SUCH_ENTRY, True, N),
        (StatusCode.NO_SUCH_LEDGER, True, N),
        (StatusCode.IO_ERROR, True, U),
        (StatusCode.TOO_MANY_REQUESTS, True, U),
        (StatusCode.FENCED, True, U),
        (StatusCode.UNAUTHORIZED, True, U),
        (StatusCode.STATUS_UNSPECIFIED, True, U),
        (99, True, U),
    ],
)
def test_classification_of_read_statuses(status, digest_ok, outcome):
    assert classify_read_status(status, digest_ok=digest_ok) is outcome


def test_a_copy_older_than_its_fragment_is_a_negative_answer():
    # The bookie stored it before adopting any term of the fragment: it never held a copy
    # the fragment's writers could have had acknowledged.
    assert classify_read_status(StatusCode.OK, stale=True) is ReadOutcome.NEGATIVE
    assert classify_read_status(StatusCode.OK, digest_ok=False, stale=True) is ReadOutcome.UNKNOWN
    assert classify_read_status(StatusCode.OK) is ReadOutcome.POSITIVE
