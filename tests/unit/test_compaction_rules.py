"""The rules of compaction (streamlib/protocol/compaction.py) and of retention of a
compacted stream (stream_rules.retention_plan / fragment_retention_plan with
RetentionPolicy.compacted), as tables (pure)."""

import pytest

from streamlib.protocol.compaction import (
    KeptMessages,
    LatestByKey,
    Run,
    backlog_bytes,
    first_index_after,
    fragment_retention_marks,
    horizon_of,
    kept_indexes,
    kept_runs,
    may_install,
    reads_view,
    retention_marks,
    should_compact,
)
from streamlib.protocol.stream_rules import (
    FragmentSpan,
    LedgerSpan,
    RetentionPolicy,
    fragment_retention_plan,
    retention_plan,
)

EARLIEST = (-1, -1, -1)
COMPACTED = RetentionPolicy(compacted=True)

# -- phase one: LatestByKey --------------------------------------------------------------

# Observations: ("set", key, position) / ("del", key, position) / ("chunk", key, entries)
# / ("del-chunk", key, entries), in stream order.
LATEST_CASES = {
    "the latest message of a key wins": (
        [("set", "k", (1, 0, 0)), ("set", "k", (1, 0, 1)), ("set", "k", (2, 0, 0))],
        {(2, 0, 0)}, set(), 1,
    ),
    "keys are kept apart": (
        [("set", "a", (1, 0, 0)), ("set", "b", (1, 0, 1)), ("set", "a", (1, 1, 0))],
        {(1, 0, 1), (1, 1, 0)}, set(), 2,
    ),
    "a tombstone removes its key": (
        [("set", "k", (1, 0, 0)), ("del", "k", (1, 1, 0))],
        set(), set(), 0,
    ),
    "a key set again after its tombstone is kept": (
        [("set", "k", (1, 0, 0)), ("del", "k", (1, 1, 0)), ("set", "k", (1, 2, 0))],
        {(1, 2, 0)}, set(), 1,
    ),
    "a tombstone of a key never set removes nothing else": (
        [("set", "a", (1, 0, 0)), ("del", "b", (1, 1, 0))],
        {(1, 0, 0)}, set(), 1,
    ),
    "a message without a key is not kept": (
        [("set", None, (1, 0, 0)), ("del", None, (1, 1, 0))],
        set(), set(), 0,
    ),
    "a chunked message is kept with all its pieces": (
        [("chunk", "k", [(1, 2), (1, 3), (2, 0)])],
        {(2, 0, 0)}, {(1, 2), (1, 3), (2, 0)}, 1,
    ),
    "a chunked message superseded leaves no pieces": (
        [("chunk", "k", [(1, 2), (1, 3)]), ("set", "k", (1, 4, 0))],
        {(1, 4, 0)}, set(), 1,
    ),
    "a message superseded by a chunked one": (
        [("set", "k", (1, 0, 0)), ("chunk", "k", [(1, 1), (1, 2)])],
        {(1, 2, 0)}, {(1, 1), (1, 2)}, 1,
    ),
    "a tombstoned chunked key is gone, pieces and all": (
        [("chunk", "k", [(1, 2), (1, 3)]), ("del", "k", (1, 4, 0))],
        set(), set(), 0,
    ),
    "a chunked tombstone removes its key": (
        [("set", "k", (1, 0, 0)), ("del-chunk", "k", [(1, 1), (1, 2)])],
        set(), set(), 0,
    ),
    "a chunked message without a key is not kept": (
        [("chunk", None, [(1, 1), (1, 2)])],
        set(), set(), 0,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("observed", "positions", "piece_entries", "keys"),
    list(LATEST_CASES.values()),
    ids=list(LATEST_CASES),
)
def test_phase_one_keeps_the_latest_message_of_every_key(observed, positions, piece_entries, keys):
    latest = LatestByKey()
    for kind, key, where in observed:
        if kind in ("set", "del"):
            latest.observe(key, where, tombstone=kind == "del")
        else:
            latest.observe_chunked(key, where, tombstone=kind == "del-chunk")
    assert latest.kept() == KeptMessages(positions, piece_entries, keys)


# What LatestByKey.pieces holds after the observations: one entry per key whose latest is
# a chunked message -- a superseded chunked message's pieces are forgotten (memory grows
# with the keys, not with the updates), whatever supersedes it.
PIECES_CASES = {
    "a chunked message superseded by a message": (
        [("chunk", "k", [(1, 2), (1, 3)]), ("set", "k", (1, 4, 0))],
        {},
    ),
    "a chunked message superseded by another": (
        [("chunk", "k", [(1, 1), (1, 2)]), ("chunk", "k", [(1, 5), (2, 0)])],
        {(2, 0, 0): [(1, 5), (2, 0)]},
    ),
    "a chunked message superseded by a tombstone": (
        [("chunk", "k", [(1, 1), (1, 2)]), ("del", "k", (1, 3, 0))],
        {},
    ),
    "... and by a chunked tombstone": (
        [("chunk", "k", [(1, 1), (1, 2)]), ("del-chunk", "k", [(1, 3), (1, 4)])],
        {},
    ),
    "another key's update leaves the pieces": (
        [("chunk", "k", [(1, 1), (1, 2)]), ("set", "j", (1, 3, 0)), ("del", "j", (1, 4, 0))],
        {(1, 2, 0): [(1, 1), (1, 2)]},
    ),
    "a key set again after its tombstone": (
        [("chunk", "k", [(1, 1), (1, 2)]), ("del", "k", (1, 3, 0)),
         ("chunk", "k", [(1, 4), (1, 5)])],
        {(1, 5, 0): [(1, 4), (1, 5)]},
    ),
    "many updates of a chunked key: one entry": (
        [("chunk", "k", [(1, 2 * i), (1, 2 * i + 1)]) for i in range(50)],
        {(1, 99, 0): [(1, 98), (1, 99)]},
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("observed", "pieces"), list(PIECES_CASES.values()), ids=list(PIECES_CASES)
)
def test_phase_one_forgets_the_pieces_of_a_superseded_chunked_message(observed, pieces):
    latest = LatestByKey()
    for kind, key, where in observed:
        if kind in ("set", "del"):
            latest.observe(key, where, tombstone=kind == "del")
        else:
            latest.observe_chunked(key, where, tombstone=kind == "del-chunk")
    assert latest.pieces == pieces


# -- phase two: kept_indexes, kept_runs ---------------------------------------------------

KEPT = KeptMessages({(1, 0, 0), (1, 0, 2), (1, 0, 3), (1, 5, 0)}, {(1, 6), (1, 7)}, 3)


@pytest.mark.parametrize(
    ("ledger_id", "entry_id", "count", "piece", "expected"),
    [
        (1, 0, 4, False, [0, 2, 3]),  # the kept indexes of a batch
        (1, 1, 4, False, []),  # nothing of it kept
        (2, 0, 4, False, []),  # the same entry id in another ledger
        (1, 0, 2, False, [0]),  # (only indexes below count)
        (1, 6, 1, True, [0]),  # a piece of a kept chunked message
        (1, 5, 1, True, []),  # a piece whose entry holds no kept piece
        (1, 7, 1, True, [0]),
    ],
)
def test_kept_indexes_of_an_entry(ledger_id, entry_id, count, piece, expected):
    assert kept_indexes(KEPT, ledger_id, entry_id, count, piece) == expected


@pytest.mark.parametrize(
    ("indexes", "runs"),
    [
        ([], []),
        ([4], [Run(4, 4)]),
        ([0, 1, 2], [Run(0, 2)]),
        ([0, 2, 3, 5], [Run(0, 0), Run(2, 3), Run(5, 5)]),
        ([5, 0, 3, 2], [Run(0, 0), Run(2, 3), Run(5, 5)]),  # unsorted
        (iter([2, 1]), [Run(1, 2)]),  # any iterable (the compactor passes a generator)
    ],
)
def test_kept_runs_are_the_runs_of_consecutive_indexes(indexes, runs):
    assert kept_runs(indexes) == runs


# -- the horizon, installing, reading -----------------------------------------------------


def test_the_horizon_is_the_end_read_unless_a_chunked_message_is_unfinished():
    assert horizon_of((3, 4, 1), None) == (3, 4, 1)
    assert horizon_of((3, 4, 0), (3, 1, 2)) == (3, 1, 2)  # before the first piece


@pytest.mark.parametrize(
    ("installed", "started_from", "allowed"),
    [
        (None, None, True),  # the first view
        (7, 7, True),  # the view it was built from is still installed
        (9, 7, False),  # another compactor installed one meanwhile
        (9, None, False),  # another's first view came first
        (None, 7, False),  # (a view removed meanwhile)
    ],
)
def test_a_view_is_installed_only_over_the_one_it_was_built_from(installed, started_from, allowed):
    assert may_install(installed, started_from) is allowed


H = (5, 3, 1)  # a horizon


@pytest.mark.parametrize(
    ("start_after", "horizon", "in_view"),
    [
        (EARLIEST, None, False),  # never compacted: the stream
        (EARLIEST, H, True),
        ((5, 3, 0), H, True),  # before the horizon, in its entry
        ((2, 9, 9), H, True),
        (H, H, False),  # at the horizon: the stream after it
        ((5, 3, 2), H, False),
        ((6, 0, -1), H, False),
    ],
)
def test_a_compacted_reader_starts_in_the_view_only_before_the_horizon(
    start_after, horizon, in_view
):
    assert reads_view(start_after, horizon) is in_view


@pytest.mark.parametrize(
    ("entry", "first_index", "start_after", "expected"),
    [
        ((3, 4), 0, (3, 5, 0), None),  # the entry is before the start
        ((3, 4), 2, (4, 0, 0), None),  # the start is in a later ledger
        ((3, 4), 0, (3, 4, 1), 2),  # the start inside the entry: after its index
        ((3, 4), 3, (3, 4, 1), 3),  # the run begins after the start's index
        ((3, 4), 0, (3, 4, 5), 6),  # (past the run's end: the caller compares)
        ((3, 4), 2, (3, 4, -1), 2),  # the start before the entry (batch index -1)
        ((3, 4), 0, (3, 4, -1), 0),
        ((3, 4), 2, (3, 3, 7), 2),  # the entry after the start: all of the run
        ((3, 4), 1, EARLIEST, 1),
    ],
)
def test_the_first_index_of_a_compacted_entry_a_reader_reads(
    entry, first_index, start_after, expected
):
    ledger_id, entry_id = entry
    assert first_index_after(ledger_id, entry_id, first_index, start_after) == expected


# -- retention of a compacted stream ------------------------------------------------------


@pytest.mark.parametrize(
    ("cursors", "horizon", "marks"),
    [
        ([], None, []),  # nothing holds the stream
        ([], (4, 2, 0), [4]),  # the horizon holds what is not compacted yet
        ([((1, 0, 0), True)], (4, 2, 0), [4, 4]),  # compacted cursor below: the horizon
        ([((6, 1, 0), True)], (4, 2, 0), [6, 4]),  # compacted cursor above: its own
        ([(EARLIEST, True)], (4, 2, 0), [4, 4]),
        ([((1, 0, 0), False)], (4, 2, 0), [1, 4]),  # an uncompacted cursor holds
        ([(EARLIEST, False)], (4, 2, 0), [-1, 4]),
        ([((1, 0, 0), True), ((2, 0, 0), False)], None, [1, 2]),  # no horizon: their own
    ],
)
def test_retention_marks(cursors, horizon, marks):
    assert retention_marks(cursors, horizon) == marks


@pytest.mark.parametrize(
    ("cursors", "horizon", "marks"),
    [
        ([], None, []),
        ([], (7, 10, 0), [10]),
        ([((7, 3, 0), True)], (7, 10, 0), [10, 10]),  # compacted cursor below the horizon
        ([((7, 12, 0), True)], (7, 10, 0), [12, 10]),  # ... above it
        ([((7, 3, 0), False)], (7, 10, 0), [3, 10]),  # an uncompacted cursor holds
        ([((7, 3, 0), True)], None, [3]),  # no horizon
        ([(EARLIEST, False)], (7, 10, 0), [-1, 10]),  # at the start: everything
        ([((5, 3, 0), False)], (7, 10, 0), [-1, 10]),  # on another ledger: everything
        ([((7, 3, 0), True)], (5, 1, 0), [3, -1]),  # a horizon on an earlier ledger
    ],
)
def test_fragment_retention_marks(cursors, horizon, marks):
    assert fragment_retention_marks(cursors, horizon, 7) == marks


@pytest.mark.parametrize(
    ("horizon", "bytes_"),
    [
        (None, 600),  # every rolled ledger; never the last (open) one
        ((2, 5, 0), 300),  # those after the horizon's ledger
        ((1, 0, 0), 500),
        ((4, 0, 0), 0),
    ],
)
def test_the_compaction_backlog_is_the_rolled_ledgers_after_the_horizon(horizon, bytes_):
    assert backlog_bytes([(1, 100), (2, 200), (3, 300), (4, 999)], horizon) == bytes_
    assert backlog_bytes([(1, 100)], horizon) == 0


@pytest.mark.parametrize(
    ("threshold", "backlog", "compact"),
    [(0, 10**9, False), (100, 0, False), (100, 100, False), (100, 101, True)],
)
def test_compaction_by_policy_when_the_backlog_passes_the_threshold(threshold, backlog, compact):
    assert should_compact(threshold, backlog) is compact


def spans(*ids):
    return [LedgerSpan(i, 10, 100, i * 1000) for i in ids]


@pytest.mark.parametrize(
    ("marks", "horizon_ledger", "policy", "expected"),
    [
        # below the horizon's ledger everything goes, however young and small
        ([3], 3, COMPACTED, [1, 2]),
        ([], 3, COMPACTED, [1, 2]),  # (the horizon bounds it even without its mark)
        # never compacted: nothing goes
        ([], None, COMPACTED, []),
        # an uncompacted cursor at an older ledger holds it
        ([2, 3], 3, COMPACTED, [1]),
        ([-1, 3], 3, COMPACTED, []),
        # a cursor past the horizon does not move the bound past it
        ([4, 3], 3, COMPACTED, [1, 2]),
        # the horizon in the current ledger: all but the current one
        ([4], 4, COMPACTED, [1, 2, 3]),
        ([9], 9, COMPACTED, [1, 2, 3]),
        # not compacted, no time or size limit: unlimited, horizon or not
        ([3], 3, RetentionPolicy(), []),
        # time retention never passes the horizon of a compacted stream either
        ([], 2, RetentionPolicy(time_ms=1, compacted=True), [1]),
    ],
)
def test_retention_compacted_deletes_below_the_horizon_whatever_the_age(
    marks, horizon_ledger, policy, expected
):
    assert retention_plan(spans(1, 2, 3, 4), marks, policy, 0, horizon_ledger) == expected


def test_a_compacted_cursor_below_the_horizon_holds_nothing_an_uncompacted_one_does():
    horizon = (3, 0, 0)
    compacted = retention_marks([((1, 0, 0), True)], horizon)
    assert retention_plan(spans(1, 2, 3, 4), compacted, COMPACTED, 0, 3) == [1, 2]
    uncompacted = retention_marks([((2, 5, 0), False)], horizon)
    assert retention_plan(spans(1, 2, 3, 4), uncompacted, COMPACTED, 0, 3) == [1]


# Fragments of one unbounded ledger beginning at entries 0, 10, 20, 30 (the last: the
# writer's), young and small: only the horizon makes them go.
FRAGMENTS = [FragmentSpan(i * 10, (i + 1) * 1000, i * 100) for i in range(4)]


@pytest.mark.parametrize(
    ("marks", "horizon_entry", "expected"),
    [
        ([25], 25, 2),  # the fragments wholly before the horizon's entry
        ([20], 20, 2),
        ([19], 19, 1),  # the horizon's own entry is never counted as consumed
        ([], None, 0),  # never compacted
        ([5, 25], 25, 0),  # an uncompacted cursor in the first fragment holds it
        ([15, 25], 25, 1),
        ([35], 35, 3),  # never the last fragment
        ([-1], -1, 0),  # the horizon on another ledger
    ],
)
def test_fragment_retention_compacted_drops_below_the_horizon(marks, horizon_entry, expected):
    assert fragment_retention_plan(FRAGMENTS, marks, COMPACTED, 0, horizon_entry) == expected
