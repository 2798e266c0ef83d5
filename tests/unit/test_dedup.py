"""Producer deduplication state (streamlib/broker/dedup.py)."""

import asyncio
import json

import pytest

from streamlib.broker.dedup import (
    MAX_NAME_CHARS,
    MAX_PRODUCERS,
    MIN_RECENT_IDS,
    RECENT_IDS,
    Dedup,
    RecentBudget,
)
from streamlib.stream import snapshots
from streamlib.stream.positions import EARLIEST, MessageId


async def test_a_new_sequence_id_is_to_write():
    dedup = Dedup()
    assert dedup.last("p") == -1
    assert dedup.check("p", 0) is None
    assert dedup.check("p", 7) is None  # gaps are fine: only "not above the last" repeats
    assert dedup.last("p") == -1  # checking takes nothing


async def test_a_repeat_of_an_in_flight_message_gets_its_future():
    dedup = Dedup()
    future = asyncio.get_running_loop().create_future()
    assert dedup.check("p", 3) is None
    dedup.taken("p", 3, future)
    assert dedup.last("p") == 3
    assert dedup.check("p", 3) is future
    assert dedup.check("p", 4) is None
    assert dedup.check("q", 3) is None  # names are independent
    # a lower id that was never taken is a duplicate too, too old to place
    assert dedup.check("p", 2) == EARLIEST


async def test_a_durable_message_answers_repeats_with_its_position():
    dedup = Dedup()
    future = asyncio.get_running_loop().create_future()
    dedup.taken("p", 0, future)
    where = MessageId(5, 2, 0)
    dedup.durable("p", 0, where)
    assert dedup.check("p", 0) == where
    assert dedup.position == where
    assert dedup.since_snapshot == 1
    assert dedup.last("p") == 0
    assert dedup.check("p", 1) is None


async def test_a_failed_write_is_no_longer_in_flight():
    dedup = Dedup()
    future = asyncio.get_running_loop().create_future()
    dedup.taken("p", 0, future)
    dedup.durable("p", 0, None)
    assert dedup.check("p", 0) is not future
    assert dedup.position == EARLIEST
    assert dedup.since_snapshot == 0


async def test_durable_of_an_unknown_name_is_ignored():
    dedup = Dedup()
    dedup.durable("nobody", 4, MessageId(1, 1, 0))
    assert dedup.last("nobody") == -1
    assert dedup.position == EARLIEST
    assert dedup.since_snapshot == 0


async def test_several_in_flight_then_durable_in_turn():
    dedup = Dedup()
    loop = asyncio.get_running_loop()
    futures = {i: loop.create_future() for i in range(3)}
    for i, future in futures.items():
        assert dedup.check("p", i) is None
        dedup.taken("p", i, future)
    dedup.durable("p", 0, MessageId(1, 0, 0))
    assert dedup.check("p", 0) == MessageId(1, 0, 0)
    assert dedup.check("p", 1) is futures[1]
    assert dedup.check("p", 2) is futures[2]
    dedup.durable("p", 1, MessageId(1, 1, 0))
    dedup.durable("p", 2, MessageId(1, 2, 0))
    assert [dedup.check("p", i) for i in range(3)] == [MessageId(1, i, 0) for i in range(3)]
    assert dedup.position == MessageId(1, 2, 0)
    assert dedup.since_snapshot == 3


def test_observe_keeps_the_highest_position_and_sequence_id():
    dedup = Dedup()
    dedup.observe("p", 5, MessageId(2, 0, 0))
    dedup.observe("p", 3, MessageId(1, 0, 0))  # (out of order: a recovery scan)
    assert dedup.last("p") == 5
    assert dedup.position == MessageId(2, 0, 0)
    assert dedup.check("p", 3) == MessageId(1, 0, 0)
    assert dedup.check("p", 5) == MessageId(2, 0, 0)
    assert dedup.check("p", 4) == EARLIEST  # not seen, below the last


def test_only_the_recent_ids_positions_are_remembered():
    dedup = Dedup()
    for i in range(RECENT_IDS + 2):
        dedup.observe("p", i, MessageId(1, i, 0))
    assert dedup.check("p", 0) == EARLIEST  # too old to place
    assert dedup.check("p", 1) == EARLIEST
    assert dedup.check("p", 2) == MessageId(1, 2, 0)
    assert dedup.check("p", RECENT_IDS + 1) == MessageId(1, RECENT_IDS + 1, 0)
    assert dedup.check("p", RECENT_IDS + 2) is None


def test_snapshot_restore_round_trip():
    dedup = Dedup()
    for i in range(10):
        dedup.observe("a", i, MessageId(3, i, 0))
    dedup.observe("b", 41, MessageId(3, 20, 2))
    dedup.observe("b", 42, MessageId(3, 20, 3))
    data = dedup.snapshot()
    assert dedup.since_snapshot == 0
    again = Dedup.restore(data)
    assert again.position == dedup.position == MessageId(3, 20, 3)
    assert again.last("a") == 9 and again.last("b") == 42
    assert again.check("a", 9) == MessageId(3, 9, 0)
    assert again.check("b", 42) == MessageId(3, 20, 3)
    assert again.check("a", 8) == EARLIEST  # only the last id's position is kept
    assert again.check("a", 10) is None
    assert again.check("b", 43) is None
    assert again.since_snapshot == 0
    assert Dedup.restore(again.snapshot()).snapshot() == data


async def test_snapshot_holds_only_durable_messages():
    dedup = Dedup()
    loop = asyncio.get_running_loop()
    dedup.observe("a", 1, MessageId(1, 1, 0))
    dedup.taken("a", 2, loop.create_future())  # still being written
    dedup.taken("fresh", 0, loop.create_future())  # nothing durable yet
    again = Dedup.restore(dedup.snapshot())
    assert again.last("a") == 1
    assert again.check("a", 2) is None  # the next owner writes it (or finds it in the tail)
    assert again.last("fresh") == -1
    assert again.position == MessageId(1, 1, 0)


def test_restore_keeps_the_snapshots_position():
    data = json.dumps({"position": [7, 8, 9], "names": {"p": [3, 1, 2, 0]}}).encode()
    again = Dedup.restore(data)
    assert again.position == MessageId(7, 8, 9)  # not just the names' highest
    assert again.check("p", 3) == MessageId(1, 2, 0)
    assert again.last("p") == 3


@pytest.mark.parametrize(
    "data",
    [
        None,
        b"",
        b"not json",
        b"\xff\xfe\x00",
        b"[]",
        b"null",
        b"3",
        b'{"names": {}}',
        b'{"position": [1, 2, 3]}',
        b'{"position": "x", "names": {}}',
        b'{"position": [1, 2, 3], "names": []}',
        b'{"position": [1, 2, 3], "names": {"p": 5}}',
        b'{"position": [1, 2, 3], "names": {"p": ["x", 1, 2, 3]}}',
        # well-formed JSON, malformed name entries: unreadable too
        b'{"position": [1, 2, 3], "names": {"p": []}}',
        b'{"position": [1, 2, 3], "names": {"p": [3, 1]}}',
        b'{"position": [1, 2, 3], "names": {"p": [3, 1, 2, 3, 4, 5]}}',
        b'{"position": [1, 2, 3], "names": {"p": [3, 1, 2, 3, "idle"]}}',
        b'{"position": [1, 2, 3], "names": {"p": [3, 1, 2, 3, -1]}}',
    ],
)
def test_restore_of_nothing_or_garbage_is_an_empty_state(data):
    dedup = Dedup.restore(data)
    assert dedup.position == EARLIEST
    assert dedup.last("p") == -1
    assert dedup.check("p", 0) is None
    assert json.loads(dedup.snapshot()) == {"position": list(EARLIEST), "names": {}}


def test_the_least_recently_used_name_goes_first():
    dedup = Dedup()
    for i in range(MAX_PRODUCERS):
        dedup.observe(f"p{i}", 5, MessageId(1, i, 0))
    assert dedup.check("p0", 5) == MessageId(1, 0, 0)  # p0 used again: p1 is now the oldest
    dedup.observe("newcomer", 0, MessageId(2, 0, 0))
    assert dedup.last("p1") == -1  # forgotten
    assert dedup.last("p0") == 5
    assert dedup.last("p2") == 5
    assert dedup.last("newcomer") == 0
    assert dedup.check("p1", 5) is None  # a forgotten name's message is new again
    assert dedup.last("p2") == -1  # ... and the check made room by forgetting the next
    snapshot = json.loads(dedup.snapshot())
    assert len(snapshot["names"]) == MAX_PRODUCERS - 1  # p1 is known, nothing durable


# -- names idle past the inactivity timeout (Pulsar's
# brokerDeduplicationProducerInactivityTimeoutMinutes), long names, large snapshots --


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_name_idle_past_the_timeout_is_forgotten_unless_busy_or_connected():
    clock = Clock()
    dedup = Dedup(inactivity_timeout_s=60, clock=clock)
    dedup.observe("idle", 4, MessageId(1, 0, 0))
    dedup.observe("connected", 2, MessageId(1, 1, 0))
    dedup.taken("in-flight", 0, asyncio.get_running_loop().create_future())
    clock.now += 30
    dedup.observe("recent", 7, MessageId(1, 2, 0))
    clock.now += 31  # the first three are idle 61 s, "recent" 31 s
    dedup.forget_idle(keep={"connected"})
    assert dedup.last("idle") == -1  # forgotten: its next message is new
    assert dedup.check("idle", 0) is None
    assert dedup.last("connected") == 2  # its producer is connected: kept
    assert dedup.last("in-flight") == 0  # a message of it is being written: kept
    assert dedup.last("recent") == 7
    assert "idle" not in json.loads(dedup.snapshot())["names"]
    assert dedup.position == MessageId(1, 2, 0)  # (what the state covers is unchanged)


def test_a_check_counts_as_activity():
    clock = Clock()
    dedup = Dedup(inactivity_timeout_s=60, clock=clock)
    dedup.observe("p", 4, MessageId(1, 0, 0))
    clock.now += 50
    assert dedup.check("p", 4) == MessageId(1, 0, 0)  # a resend: the producer is there
    clock.now += 50
    dedup.forget_idle()
    assert dedup.last("p") == 4


def test_idleness_carries_over_a_snapshot_to_the_next_owner():
    clock = Clock()
    dedup = Dedup(inactivity_timeout_s=60, clock=clock)
    dedup.observe("old", 1, MessageId(1, 0, 0))
    clock.now += 40
    dedup.observe("new", 1, MessageId(1, 1, 0))
    data = dedup.snapshot()
    other = Clock()  # another process: another monotonic clock
    again = Dedup.restore(data, inactivity_timeout_s=60, clock=other)
    other.now += 25  # "old" has now been idle 65 s, "new" 25 s
    again.forget_idle()
    assert again.last("old") == -1
    assert again.last("new") == 1
    assert again.check("new", 1) == MessageId(1, 1, 0)


def test_the_inactivity_timeout_must_be_positive():
    with pytest.raises(ValueError):
        Dedup(inactivity_timeout_s=0)


def test_names_over_the_limit_are_never_remembered():
    # A producer of such a name cannot connect (the broker refuses it); one in the
    # stream (an older writer, a direct-mode producer) moves the position, nothing else.
    assert MAX_NAME_CHARS == 256
    dedup = Dedup()
    dedup.observe("x" * (MAX_NAME_CHARS + 1), 3, MessageId(1, 0, 0))
    dedup.observe("y" * MAX_NAME_CHARS, 3, MessageId(1, 1, 0))
    assert dedup.position == MessageId(1, 1, 0)
    assert dedup.last("x" * (MAX_NAME_CHARS + 1)) == -1
    assert dedup.last("y" * MAX_NAME_CHARS) == 3
    assert list(json.loads(dedup.snapshot())["names"]) == ["y" * MAX_NAME_CHARS]
    data = json.dumps({"position": [1, 1, 0],
                       "names": {"z" * 5000: [9, 1, 0, 0], "ok": [2, 1, 1, 0]}}).encode()  # fmt: skip
    again = Dedup.restore(data)
    assert again.last("z" * 5000) == -1
    assert again.last("ok") == 2


def test_a_snapshot_of_5000_names_of_250_chars_round_trips_through_ledger_entries():
    dedup = Dedup()
    names = [f"{i:05d}-".ljust(250, "n") for i in range(5000)]
    for i, name in enumerate(names):
        dedup.observe(name, i % 7, MessageId(3, i, i % 5))
    data = dedup.snapshot()
    assert len(data) > 1 << 20  # more than one metadata node may hold
    entries = snapshots.entries_of(data)
    assert len(entries) >= 2 and all(len(e) <= snapshots.ENTRY_BYTES for e in entries)
    again = Dedup.restore(b"".join(entries))
    assert again.position == MessageId(3, 4999, 4)
    for i, name in enumerate(names):
        assert again.last(name) == i % 7
        assert again.check(name, i % 7) == MessageId(3, i, i % 5)
    pointer = snapshots.Pointer(12, len(entries), len(data), again.position)
    assert len(pointer.encode()) < 200  # what the metadata node holds
    assert snapshots.Pointer.parse(pointer.encode()) == pointer
    assert snapshots.Pointer.parse(data) is None  # a node of the older format: the state itself


@pytest.mark.parametrize(
    "data",
    [
        b'{"ledger_id": "x", "entries": 1, "bytes": 5, "position": [1, 2, 3]}',
        b'{"ledger_id": -1, "entries": 1, "bytes": 5, "position": [1, 2, 3]}',
        b'{"ledger_id": 4, "entries": 0, "bytes": 5, "position": [1, 2, 3]}',
        b'{"ledger_id": 4, "entries": 1, "bytes": 1e99, "position": [1, 2, 3]}',
        b'{"ledger_id": 4, "entries": 1, "bytes": 5}',
        b'{"ledger_id": 4, "entries": 1, "bytes": 5, "position": [1, 2]}',
        b'{"ledger_id": 4, "entries": 9, "bytes": 5, "position": [1, 2, 3]}',
        b'{"ledger_id": 4, "entries": 1, "bytes": 1073741824, "position": [1, 2, 3]}',
        b'{"ledger_id": true, "entries": 1, "bytes": 5, "position": [1, 2, 3]}',
    ],
)
def test_a_malformed_snapshot_pointer_is_unreadable(data):
    with pytest.raises(ValueError):
        snapshots.Pointer.parse(data)


async def test_the_names_of_every_stream_share_one_budget_of_recent_ids():
    """Each name keeps its share of the broker's budget of recent ids (4,096 for each
    of 10,000 producers grew a broker by gigabytes an hour); an older duplicate is still
    dropped, answered with EARLIEST."""
    now = [0.0]
    budget = RecentBudget(total=1000, clock=lambda: now[0])
    streams = [Dedup() for _ in range(5)]
    for dedup in streams:
        dedup.share(budget)

    def write(dedup, name, count, start=0):
        for sequence_id in range(start, start + count):
            dedup.taken(name, sequence_id, asyncio.get_running_loop().create_future())
            dedup.durable(name, sequence_id, MessageId(1, sequence_id, 0))

    write(streams[0], "alone", 2000)  # one name: up to RECENT_IDS, but the budget is 1000
    assert len(streams[0].recent("alone", 5000)) == 1000
    for i, dedup in enumerate(streams):  # 50 names in all, over the streams
        for n in range(10):
            write(dedup, f"p{i}-{n}", 100)
    now[0] += 2  # (counted again)
    write(streams[1], "p1-0", 100, start=100)
    share = 1000 // 51
    assert len(streams[1].recent("p1-0", 5000)) == share
    # The share halved since "alone" filled up: every name was trimmed at once.
    assert len(streams[0].recent("alone", 5000)) == share
    total = sum(len(d.recent(f"p{i}-{n}", 5000)) for i, d in enumerate(streams) for n in range(10))
    assert total <= 2 * 1000
    assert streams[0].check("alone", 5) == EARLIEST  # (still a duplicate: dropped)
    assert streams[0].check("alone", 1999) == MessageId(1, 1999, 0)
    # Never below MIN_RECENT_IDS, however many names.
    crowd = Dedup()
    crowd.share(budget)
    for n in range(2000):
        write(crowd, f"c{n}", 1)
    now[0] += 2
    write(crowd, "c0", 40, start=1)
    assert len(crowd.recent("c0", 100)) == MIN_RECENT_IDS


async def test_a_stream_taken_over_keeps_only_its_share_once_it_joins():
    """A takeover's tail scan sees up to RECENT_IDS a name before the stream shares the
    broker's budget: joining trims it at once."""
    now = [0.0]
    budget = RecentBudget(total=100, clock=lambda: now[0])
    crowd = Dedup()
    crowd.share(budget)
    for n in range(50):  # 50 names: a share of 16 (the floor)
        crowd.observe(f"c{n}", 0, MessageId(1, n, 0))
    scanned = Dedup()
    for sequence_id in range(1000):
        scanned.observe("p", sequence_id, MessageId(2, sequence_id, 0))
    assert len(scanned.recent("p", 5000)) == 1000
    now[0] += 2  # (the share is counted again at most every RECOUNT_S)
    scanned.share(budget)
    assert len(scanned.recent("p", 5000)) == MIN_RECENT_IDS
    assert scanned.check("p", 999) == MessageId(2, 999, 0)
