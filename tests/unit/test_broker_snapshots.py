"""When a stream's owner writes its dedup snapshot (streamlib/broker/owned.py): every
SNAPSHOT_EVERY durable messages -- and after a failed one, not before another
SNAPSHOT_EVERY. Before, a failed snapshot was tried again on every message: with a state
too large for its metadata node, the broker spent itself serializing it, 77 msgs/s.
And how the next owner reads it (dedup_store.load): whatever cannot be read is no
snapshot (the tail scan then starts at the stream's start); the older inline node is read."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from metadata.errors import ValueTooLargeError
from streamlib.broker import dedup_store
from streamlib.broker.dedup import RecentBudget
from streamlib.broker.owned import SNAPSHOT_EVERY, OwnedStream
from streamlib.client import Client
from streamlib.stream import snapshots
from streamlib.stream.positions import MessageId


class RefusingClient:
    """A client whose metadata store refuses every call (a value over its limit)."""

    def __getattr__(self, name: str) -> Any:
        return self

    def stream_path(self, stream: str) -> str:
        return f"/streamlib/streams/{stream}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._refuse()

    async def _refuse(self) -> None:
        raise ValueTooLargeError("value of 2000000 bytes exceeds the 1048576-byte limit")


async def write_durable(owned: OwnedStream, first: int, count: int) -> None:
    """Messages of producer "p" made durable one by one, each followed by whatever tasks it
    started (the snapshots) run to their end."""
    loop = asyncio.get_running_loop()
    started: list[asyncio.Task[Any]] = []

    def recording(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        started.append(task)
        return task

    loop.set_task_factory(recording)
    try:
        for sequence_id in range(first, first + count):
            written = loop.create_future()
            owned.dedup.taken("p", sequence_id, written)
            written.set_result(MessageId(1, sequence_id, 0))
            owned._written("p", sequence_id, written, 1)
            while started:
                running = started[:]
                started.clear()
                await asyncio.gather(*running, return_exceptions=True)
    finally:
        loop.set_task_factory(None)


async def test_a_failed_dedup_snapshot_is_tried_again_only_after_another_snapshot_every(caplog):
    broker = SimpleNamespace(
        client=RefusingClient(),
        broker_id="b",
        give_up=None,
        dedup_snapshot_interval_s=0.0,
        recent_ids=RecentBudget(),
    )
    owned = OwnedStream(broker, "s")
    owned.writer = SimpleNamespace()  # type: ignore[assignment]  # (it took the stream over)
    caplog.set_level(logging.WARNING, logger="streamlib.broker.owned")

    def failures() -> int:
        return sum("dedup snapshot failed" in r.getMessage() for r in caplog.records)

    await write_durable(owned, 0, SNAPSHOT_EVERY - 1)
    assert failures() == 0
    await write_durable(owned, SNAPSHOT_EVERY - 1, 1)
    assert failures() == 1
    await write_durable(owned, SNAPSHOT_EVERY, SNAPSHOT_EVERY - 1)
    assert failures() == 1  # not on every message after it
    await write_durable(owned, 2 * SNAPSHOT_EVERY - 1, 1)
    assert failures() == 2


# -- reading the snapshot at a takeover (dedup_store.load) ------------------------------


@pytest.fixture
async def client():
    client = await Client.connect(f"memory://snapshots-{uuid.uuid4().hex}")
    await client.streams.create("s")
    try:
        yield client
    finally:
        await client.close()


async def put_node(client: Client, data: bytes) -> None:
    await client.store.create(f"{client.streams.registry.stream_path('s')}/dedup", data)


async def test_an_older_node_holding_the_snapshot_itself_is_still_read(client):
    await put_node(client, json.dumps({"position": [3, 7, 1],
                                       "names": {"p": [41, 3, 7, 1]}}).encode())  # fmt: skip
    dedup = await dedup_store.load(client, "s", 60.0)
    assert dedup is not None and dedup.inactivity_timeout_s == 60.0
    assert dedup.last("p") == 41
    assert dedup.check("p", 41) == MessageId(3, 7, 1)
    assert dedup.position == MessageId(3, 7, 1)


@pytest.mark.parametrize(
    "node",
    [
        snapshots.Pointer(999, 1, 10, MessageId(1, 0, 0)).encode(),  # its ledger is gone
        b'{"ledger_id": 5, "entries": "x"}',  # a malformed pointer
    ],
)
async def test_a_pointer_that_leads_nowhere_reads_as_no_snapshot(client, node):
    await put_node(client, node)
    assert await dedup_store.load(client, "s") is None  # the tail scan starts at the start


async def test_no_node_is_no_snapshot(client):
    assert await dedup_store.load(client, "s") is None
