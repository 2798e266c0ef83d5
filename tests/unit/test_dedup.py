"""Producer deduplication state (streamlib/broker/dedup.py)."""

import asyncio
import json

import pytest

from streamlib.broker.dedup import MAX_PRODUCERS, RECENT_IDS, Dedup
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
        b'{"position": [1, 2, 3], "names": {"p": [3, 1, 2, 3, 4]}}',
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
