"""The load manager's records in the store, on every backend: one leader at a time,
move requests (asked once, marked done, forgotten only as read), and pins."""

from __future__ import annotations

import asyncio

from metadata.services.broker_moves import LoadManagerElection, MoveRequest, StreamMoves
from metadata.services.broker_pins import BrokerPins

WAIT_S = 10.0


async def test_one_load_manager_at_a_time_and_the_next_when_its_broker_goes(connect_store):
    first_store = await connect_store()
    first = LoadManagerElection(first_store, "broker-1")
    second = LoadManagerElection(await connect_store(), "broker-2")
    await asyncio.wait_for(first.campaign(), WAIT_S)
    waiting = asyncio.create_task(second.campaign())
    assert await second.leader() == "broker-1"
    await first_store.close()  # (its session goes: so does its leadership)
    await asyncio.wait_for(waiting, WAIT_S)
    assert second.is_leader and await second.leader() == "broker-2"
    await second.resign()


async def test_a_move_is_asked_once_marked_done_and_forgotten_as_read(connect_store):
    moves = StreamMoves(await connect_store())
    assert await moves.all() == []
    asked = MoveRequest("orders", "b1", "b3", 100.0)
    assert await moves.request(asked)
    assert not await moves.request(MoveRequest("orders", "b2", "b3", 101.0))  # (one stands)
    found = await moves.get("orders")
    assert found is not None and found[0] == asked
    await moves.mark_done(found[0], found[1], 102.0)
    done, version = (await moves.get("orders")) or (None, -1)
    assert done is not None and done.done and done.done_at == 102.0
    await moves.forget(asked, found[1])  # (an older read: kept)
    assert await moves.get("orders") is not None
    await moves.forget(done, version)
    assert await moves.get("orders") is None


async def test_pins(connect_store):
    pins = BrokerPins(await connect_store())
    assert await pins.pins() == {} and await pins.pinned_to("orders") is None
    await pins.pin("orders", "b1")
    await pins.pin("orders", "b2")  # (pinned again: elsewhere)
    await pins.pin("audit", "b1")
    assert await pins.pins() == {"orders": "b2", "audit": "b1"}
    assert await pins.unpin("orders")
    assert not await pins.unpin("orders")
    assert await pins.pinned_to("orders") is None
