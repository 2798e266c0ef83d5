"""A consumer's cursor writes never race each other: an explicit persist() while the
background persist's write is in flight (the unbounded retention test's rare failure)
must neither lose acknowledgements in memory nor leave the stored cursor behind."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.timeout(120)


async def test_persist_during_the_background_persist_keeps_every_acknowledgement(
    cluster, monkeypatch
):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("persisted")
    for i in range(3):
        await producer.send(b"%d" % i)
    consumer = await client.subscribe("persisted", "s", "earliest", cursor_persist_interval_ms=0)
    first, second, third = [await consumer.receive(timeout=30) for _ in range(3)]

    registry = client.streams.registry
    write_cursor = registry.write_cursor
    started = asyncio.Event()
    release = [asyncio.Event(), asyncio.Event()]
    finished = asyncio.Event()
    calls = 0

    async def held_write(*args, **kwargs):
        """The first two writes wait until the test lets them go: the first, then,
        once it is stored, the second."""
        nonlocal calls
        index, calls = calls, calls + 1
        if index == 0:
            started.set()
        if index < 2:
            await release[index].wait()
        try:
            return await write_cursor(*args, **kwargs)
        finally:
            if index == 0:
                finished.set()

    monkeypatch.setattr(registry, "write_cursor", held_write)
    consumer.acknowledge(first)  # the background persist starts and is held
    await asyncio.wait_for(started.wait(), 10)
    consumer.acknowledge(second)
    # An explicit persist while that write is in flight (a second write beside it was
    # the bug: written with the same version, it lost, and the consumer took the older
    # stored cursor for an admin's reset -- forgetting the second acknowledgement).
    explicit = asyncio.get_running_loop().create_task(consumer.persist())
    release[0].set()
    await asyncio.wait_for(finished.wait(), 10)
    release[1].set()
    await asyncio.wait_for(explicit, 10)
    assert consumer.mark_delete_position == second.message_id
    stored = (await client.streams.cursors("persisted"))["s"]
    assert stored == second.message_id
    consumer.acknowledge(third)
    await consumer.persist()
    assert (await client.streams.cursors("persisted"))["s"] == third.message_id
