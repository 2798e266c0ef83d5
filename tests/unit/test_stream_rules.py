"""Positions, cursor acknowledgement ranges, and the stream rules (pure)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlib.errors import InvalidPositionError
from streamlib.protocol.stream_rules import (
    READERS_MAY_RECOVER,
    FragmentSpan,
    LedgerEnd,
    LedgerSpan,
    ReaderStep,
    RetentionPolicy,
    RolloverPolicy,
    confirmed_end,
    fragment_retention_plan,
    ledgers_to_recover,
    reader_step,
    retention_plan,
    roll_deadline_ms,
    should_roll,
)
from streamlib.stream.ack_ranges import AckRanges
from streamlib.stream.positions import EARLIEST, LATEST, MessageId, parse_start, position_before


def test_message_ids_are_ordered_and_round_trip():
    ids = [MessageId(1, 0, 0), MessageId(1, 0, 1), MessageId(1, 1, 0), MessageId(2, 0, 0)]
    assert sorted(reversed(ids)) == ids
    assert ids[0] > EARLIEST and ids[-1] < LATEST
    for mid in ids:
        assert MessageId.from_bytes(mid.to_bytes()) == mid
        assert MessageId.parse(str(mid)) == mid
    assert parse_start("earliest") is EARLIEST and parse_start("latest") is LATEST


@pytest.mark.parametrize("bad", [b"", b"short", b"x" * 21, "not-bytes"])
def test_invalid_position_bytes_are_typed_errors(bad):
    with pytest.raises(InvalidPositionError):
        MessageId.from_bytes(bad)


@pytest.mark.parametrize("bad", ["", "1", "a:b", "1:2:3:4", "1:-5"])
def test_invalid_position_strings_are_typed_errors(bad):
    with pytest.raises(InvalidPositionError):
        MessageId.parse(bad)


def test_position_before_makes_the_position_next():
    assert position_before(MessageId(3, 4, 2)) == MessageId(3, 4, 1)
    assert position_before(MessageId(3, 4, 0)) == MessageId(3, 3, LATEST.batch_index)
    assert position_before(MessageId(3, 0, 0)) < MessageId(3, 0, 0)


def test_last_two_ledgers_are_recovered_on_takeover():
    assert ledgers_to_recover([1, 5, 9]) == [5, 9]
    assert ledgers_to_recover([4]) == [4]
    assert ledgers_to_recover([]) == []


def test_roll_triggers():
    policy = RolloverPolicy(max_entries=10, max_bytes=1000, max_age_ms=60_000)
    assert should_roll(10, 0, 0, None, policy)
    assert should_roll(1, 1000, 0, None, policy)
    assert not should_roll(9, 999, 0, None, policy)
    deadline = roll_deadline_ms(0, policy, random.Random(1))
    assert deadline is not None and 54_000 <= deadline <= 60_000  # up to 10% jitter
    assert should_roll(1, 0, deadline, deadline, policy)
    assert not should_roll(0, 0, deadline, deadline, policy)  # an empty ledger stays


def spans(*ids, size=100, created=None):
    return [LedgerSpan(i, 10, size, (created or {}).get(i, i * 1000)) for i in ids]


@pytest.mark.parametrize(
    ("marks", "policy", "now", "expected"),
    [
        # unlimited retention deletes nothing
        ([], RetentionPolicy(0, 0), 10**9, []),
        # no cursor: every ledger is consumed; the current one (4) never goes
        ([], RetentionPolicy(time_ms=1), 10**9, [1, 2, 3]),
        # the slowest cursor is in ledger 3: ledgers 1 and 2 are consumed
        ([3, 4], RetentionPolicy(time_ms=1), 10**9, [1, 2]),
        # a cursor that consumed nothing (-1) protects everything
        ([-1, 4], RetentionPolicy(time_ms=1), 10**9, []),
        # time: ledger 1 closed at 2000 (ledger 2's creation), ledger 2 at 3000
        ([], RetentionPolicy(time_ms=1000), 3500, [1]),
        # size: keep the newest ledgers within 250 bytes (100 each): 1 and 2 go
        ([], RetentionPolicy(size_bytes=250), 0, [1, 2]),
    ],
)
def test_retention_plan(marks, policy, now, expected):
    assert retention_plan(spans(1, 2, 3, 4), marks, policy, now) == expected


# Fragments of one unbounded ledger: they begin at entries 0, 10, 20, 30 (the last is
# the writer's), at 1000, 2000, 3000, 4000 ms, after 0, 100, 200, 300 bytes.
FRAGMENTS = [FragmentSpan(i * 10, (i + 1) * 1000, i * 100) for i in range(4)]


@pytest.mark.parametrize(
    ("marks", "policy", "now", "expected"),
    [
        ([], RetentionPolicy(0, 0), 10**9, 0),  # unlimited retention drops nothing
        ([], RetentionPolicy(time_ms=1), 10**9, 3),  # no cursor: all but the last
        ([25], RetentionPolicy(time_ms=1), 10**9, 2),  # entries 0..19 consumed
        ([19], RetentionPolicy(time_ms=1), 10**9, 1),  # entry 19's batch may be partial
        ([20], RetentionPolicy(time_ms=1), 10**9, 2),
        ([-1, 35], RetentionPolicy(time_ms=1), 10**9, 0),  # a cursor at EARLIEST
        ([], RetentionPolicy(time_ms=1000), 2999, 0),  # fragment 0 ended at 2000
        ([], RetentionPolicy(time_ms=1000), 3500, 1),
        ([], RetentionPolicy(time_ms=1000), 4000, 2),  # fragment 1 ended at 3000
        ([], RetentionPolicy(size_bytes=150), 0, 2),  # 300 - 100 bytes from fragment 1 on
        ([], RetentionPolicy(size_bytes=300), 0, 0),
    ],
)
def test_fragment_retention_plan(marks, policy, now, expected):
    assert fragment_retention_plan(FRAGMENTS, marks, policy, now) == expected


def test_fragment_retention_never_counts_unknowns_as_old_or_big():
    unknown_time = [FragmentSpan(0, 1000, 0), FragmentSpan(10, 0, 100), FragmentSpan(20, 3000, 200)]
    assert fragment_retention_plan(unknown_time, [], RetentionPolicy(time_ms=1), 10**9) == 0
    unknown_size = [FragmentSpan(0, 1000, None), FragmentSpan(10, 2000, 100), FragmentSpan(20)]
    assert fragment_retention_plan(unknown_size, [], RetentionPolicy(size_bytes=1), 10**9) == 0
    one = [FragmentSpan(0, 1, 0)]
    assert fragment_retention_plan(one, [], RetentionPolicy(time_ms=1), 10**9) == 0


@settings(max_examples=200)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_ack_ranges_mark_delete_advances_exactly_over_contiguous_acks(order, rnd):
    positions = [MessageId(1, i, 0) for i in range(31)]
    acks = AckRanges(EARLIEST)
    acked: set[int] = set()
    for i in order:
        previous = positions[i - 1] if i else EARLIEST
        acks.ack(previous, positions[i])
        acked.add(i)
        prefix = 0
        while prefix in acked:
            prefix += 1
        expected = positions[prefix - 1] if prefix else EARLIEST
        assert acks.mark_delete == expected
        for j, pos in enumerate(positions):
            assert acks.is_acked(pos) == (j in acked)
    # ranges survive a save/load round trip
    again = AckRanges(acks.mark_delete, acks.ranges)
    assert all(again.is_acked(p) == acks.is_acked(p) for p in positions)


def test_cumulative_ack_swallows_ranges_below_it():
    p = [MessageId(1, i, 0) for i in range(6)]
    acks = AckRanges(EARLIEST)
    acks.ack(p[2], p[3])
    acks.ack_cumulative(p[1])
    assert acks.mark_delete == p[1]
    acks.ack(p[1], p[2])
    assert acks.mark_delete == p[3]
    acks.ack_cumulative(p[5])
    assert acks.mark_delete == p[5] and acks.ranges == []


def test_readers_never_recover_and_wait_at_an_open_ledger():
    assert READERS_MAY_RECOVER is False
    assert reader_step(closed=True, tail=True) is ReaderStep.MOVE_ON
    assert reader_step(closed=True, tail=False) is ReaderStep.MOVE_ON
    assert reader_step(closed=False, tail=True) is ReaderStep.WAIT
    assert reader_step(closed=False, tail=False) is ReaderStep.STOP


@pytest.mark.parametrize(
    ("tail", "end"),
    [
        ([LedgerEnd(1, True, 9), LedgerEnd(2, False, 4)], (2, 4)),  # the writer's ledger
        ([LedgerEnd(1, True, 9), LedgerEnd(2, False, -1)], (1, 9)),  # nothing in it yet
        # A roll between its CAS and its close: nothing of the next ledger counts yet.
        ([LedgerEnd(1, False, 9), LedgerEnd(2, False, 4)], (1, 9)),
        ([LedgerEnd(1, False, -1), LedgerEnd(2, False, 4)], None),  # look further back
        ([LedgerEnd(1, True, -1), LedgerEnd(2, True, -1)], None),
        ([LedgerEnd(1, True, 9, first_entry_id=10), LedgerEnd(2, False, -1)], None),
    ],
)
def test_the_confirmed_end_stops_at_the_first_open_ledger(tail, end):
    assert confirmed_end(tail) == end
