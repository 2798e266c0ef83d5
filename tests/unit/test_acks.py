"""In-order add completion and LAC advance (protocol.txt "Writing to ledgers")."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlib.protocol import AckTracker, write_set


def test_entry_completes_only_after_lower_entries():
    tracker = AckTracker(ack_quorum=2)
    for e in range(3):
        tracker.add_pending(e, write_set(e, 3, 2))
    # entry 1 reaches Qa first: nothing completes, entry 0 is still short.
    assert tracker.on_ack(1, 1) == []
    assert tracker.on_ack(1, 2) == []
    assert tracker.last_add_confirmed == -1
    assert tracker.on_ack(0, 0) == []
    assert tracker.on_ack(0, 1) == [0, 1]
    assert tracker.last_add_confirmed == 1


def test_ack_from_outside_write_set_does_not_count():
    tracker = AckTracker(ack_quorum=2)
    tracker.add_pending(0, (0, 1))
    assert tracker.on_ack(0, 2) == []
    assert tracker.on_ack(0, 0) == []
    assert tracker.on_ack(0, 0) == []  # the same bookie twice is one ack
    assert tracker.on_ack(0, 1) == [0]


def test_entry_ids_must_be_consecutive():
    tracker = AckTracker(ack_quorum=1, last_add_confirmed=4)
    with pytest.raises(ValueError):
        tracker.add_pending(6, (0,))
    tracker.add_pending(5, (0,))
    assert tracker.on_ack(5, 0) == [5]


def test_replaced_bookie_loses_its_acks_on_pending_entries():
    tracker = AckTracker(ack_quorum=2)
    tracker.add_pending(0, (0, 1))
    tracker.add_pending(1, (1, 2))
    tracker.on_ack(1, 1)
    assert tracker.replace_bookie(1) == [0, 1]  # both wrote to index 1: resend both
    assert tracker.on_ack(1, 2) == []  # the old ack from index 1 no longer counts
    assert tracker.on_ack(0, 0) == []
    assert tracker.on_ack(0, 1) == [0]  # entry 0 completes; entry 1 still needs index 1
    assert tracker.last_add_confirmed == 0
    assert tracker.on_ack(1, 1) == [1]


def test_fail_all_drops_pending():
    tracker = AckTracker(ack_quorum=1)
    tracker.add_pending(0, (0,))
    tracker.add_pending(1, (0,))
    assert tracker.fail_all() == [0, 1]
    assert tracker.pending_count == 0


# (E, (Qw, Qa), entry count, rnd) for any valid E <= 5.
LEDGERS = st.integers(1, 5).flatmap(
    lambda e: st.tuples(
        st.just(e),
        st.integers(1, e).flatmap(lambda qw: st.tuples(st.just(qw), st.integers(1, qw))),
        st.integers(1, 12),
        st.randoms(use_true_random=False),
    )
)


@settings(max_examples=300)
@given(LEDGERS)
def test_completions_are_in_order_exactly_once_and_only_at_quorum(args):
    e, (qw, qa), count, rnd = args
    tracker = AckTracker(qa)
    acks = []
    for entry in range(count):
        ws = write_set(entry, e, qw)
        tracker.add_pending(entry, ws)
        acks += [(entry, b) for b in ws]
        acks += [(entry, rnd.randrange(e))]  # duplicates and stray acks too
    rnd.shuffle(acks)
    seen: dict[int, set[int]] = {}
    completed: list[int] = []
    for entry, bookie in acks:
        if bookie in write_set(entry, e, qw):
            seen.setdefault(entry, set()).add(bookie)
        done = tracker.on_ack(entry, bookie)
        for d in done:
            # acknowledged only with Qa acks from its write set, and all lower already done
            assert len(seen.get(d, ())) >= qa
        completed += done
        assert completed == list(range(len(completed)))
        assert tracker.last_add_confirmed == len(completed) - 1
    assert completed == list(range(count))  # every ack delivered: everything completes


@settings(max_examples=300)
@given(LEDGERS)
def test_bulk_acks_complete_exactly_what_single_acks_do(args):
    """on_acks (one bookie's answer for many entries, the hot path) ends in the same
    state and completes the same entries, in the same order, as one on_ack per entry."""
    e, (qw, qa), count, rnd = args
    single, bulk = AckTracker(qa), AckTracker(qa)
    for entry in range(count):
        single.add_pending(entry, write_set(entry, e, qw))
        bulk.add_pending(entry, write_set(entry, e, qw))
    answers = []  # (bookie, entries it answers in one response)
    for _ in range(rnd.randrange(1, 4 * e + 1)):
        ids = [i for i in range(count) if rnd.random() < 0.5]
        rnd.shuffle(ids)
        answers.append((rnd.randrange(e), ids))
    done_single: list[int] = []
    done_bulk: list[int] = []
    for bookie, ids in answers:
        for entry in ids:
            done_single += single.on_ack(entry, bookie)
        done_bulk += bulk.on_acks(ids, bookie)
        assert done_bulk == done_single
        assert bulk.last_add_confirmed == single.last_add_confirmed
    assert bulk.pending_entry_ids() == single.pending_entry_ids()
