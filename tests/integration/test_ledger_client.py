"""The ledger client on real bookie processes (ARCHITECTURE.md §3; issue: Ledger client)."""

import asyncio

import pytest

from streamlib.errors import (
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from streamlib.protocol import LedgerState


async def test_append_close_open_read_round_trip(any_cluster):
    any_cluster.start_bookies(3)
    client = await any_cluster.client()
    writer = await client.ledgers.create(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
    datas = [f"entry-{i}".encode() * (i + 1) for i in range(200)]
    ids = await writer.append_many(datas[:100])
    ids += [await writer.append(d) for d in datas[100:]]
    assert ids == list(range(200))
    assert writer.last_add_confirmed == 199
    closed = await writer.close()
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 199
    assert closed.length == sum(len(d) for d in datas)

    reader_client = await any_cluster.client()
    reader = await reader_client.ledgers.open(writer.ledger_id, password=b"pw")
    assert reader.is_closed and reader.last_entry_id == 199
    assert await reader.read(0, 199) == datas
    with pytest.raises(NoSuchEntryError):
        await reader.read(0, 200)
    assert writer.ledger_id in await reader_client.ledgers.list()


async def test_unknown_ledger_and_wrong_password_are_typed_errors(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    with pytest.raises(NoSuchLedgerError):
        await client.ledgers.open(987654)
    writer = await client.ledgers.create(password=b"right")
    await writer.append(b"x")
    with pytest.raises(UnauthorizedError):
        await client.ledgers.open(writer.ledger_id, password=b"wrong")
    await writer.append(b"y")  # the writer was not disturbed


async def test_delete_removes_the_ledger(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    writer = await client.ledgers.create()
    await writer.append(b"x")
    await writer.close()
    await client.ledgers.delete(writer.ledger_id)
    assert writer.ledger_id not in await client.ledgers.list()
    with pytest.raises(NoSuchLedgerError):
        await client.ledgers.metadata(writer.ledger_id)


async def test_recovery_fences_the_old_writer(cluster):
    cluster.start_bookies(3)
    writer_client, reader_client = await cluster.client(), await cluster.client()
    writer = await writer_client.ledgers.create(password=b"pw")
    await writer.append_many([b"a", b"b", b"c"])
    reader = await reader_client.ledgers.open(writer.ledger_id, password=b"pw")
    assert reader.is_closed and reader.last_entry_id == 2
    with pytest.raises(LedgerFencedError):
        await writer.append(b"d")
    assert await reader.read(0, 2) == [b"a", b"b", b"c"]


async def test_open_without_recovery_does_not_disturb_the_writer(cluster):
    cluster.start_bookies(3)
    writer_client, reader_client = await cluster.client(), await cluster.client()
    writer = await writer_client.ledgers.create()
    for i in range(10):  # one at a time: each later entry carries the LAC so far
        await writer.append(b"%d" % i)
    reader = await reader_client.ledgers.open(writer.ledger_id, recover=False)
    assert not reader.is_closed
    assert reader.last_add_confirmed >= 8  # the piggybacked LAC trails by at most one
    assert await reader.read(0, 8) == [b"%d" % i for i in range(9)]
    await writer.append_many([b"more"] * 5)  # still the writer
    assert (await writer_client.ledgers.metadata(writer.ledger_id)).state is LedgerState.OPEN
    await writer.close()


async def test_tailing_reader_waits_on_the_long_poll(cluster):
    cluster.start_bookies(3)
    writer_client, reader_client = await cluster.client(), await cluster.client()
    writer = await writer_client.ledgers.create()
    reader = await reader_client.ledgers.open(writer.ledger_id, recover=False)
    received: list[bytes] = []

    async def tail() -> None:
        async for _, payload in reader.tail(0, poll_timeout_s=5.0):
            received.append(payload)

    tailing = asyncio.ensure_future(tail())
    for i in range(5):
        await writer.append(b"msg-%d" % i)
    await writer.close()
    await asyncio.wait_for(tailing, timeout=30)
    assert received == [b"msg-%d" % i for i in range(5)]
    # It waited on the bookies' long poll, not a sleep loop: a handful of polls for 5
    # entries appended one by one (each poll returns when the LAC moves).
    assert 1 <= reader.long_polls <= 12
