"""Ledger recovery and ensemble changes on real bookie processes, with real faults:
SIGKILL, SIGSTOP, partial writes, concurrent recoveries, wrong passwords."""

import asyncio
import os
import signal

import grpc
import pytest

from bookie.wire import add_results
from bookie.wire import bookie_pb2 as pb
from bookie.wire import bookie_pb2_grpc as pb_grpc
from streamlib.errors import LedgerFencedError, UnauthorizedError
from streamlib.protocol import DigestManager
from streamlib.protocol.digest import master_key


def raw_stub(bookie):
    return pb_grpc.BookieStub(grpc.insecure_channel(bookie.address))


def add_directly(bookie, ledger, entry_id, lac, length, payload, key):
    """Write one entry to ONE bookie, as a writer that crashed mid-add would have."""
    digest = DigestManager(ledger.ledger_id, ledger.digest_type, ledger.key_material(b"pw"))
    entry = pb.AddEntry(
        ledger_id=ledger.ledger_id,
        entry_id=entry_id,
        last_add_confirmed=lac,
        length=length,
        payload=payload,
        digest=digest.compute(entry_id, lac, length, payload),
        master_key=key,
    )
    stub = raw_stub(bookie)
    results = [
        r
        for resp in stub.AddStream(iter([pb.AddRequest(entries=[entry])]), timeout=30)
        for r in add_results(resp)
    ]
    assert [r.status for r in results] == [pb.OK]


def has_entry(bookie, ledger_id, entry_id):
    response = raw_stub(bookie).ReadEntries(
        pb.ReadRequest(ledger_id=ledger_id, first_entry_id=entry_id, last_entry_id=entry_id),
        timeout=30,
    )
    return response.status == pb.OK and response.results[0].status == pb.OK


async def test_fencing_txt_seed_scenario(any_cluster):
    cluster = any_cluster
    cluster.start_bookies(3)
    writer_client = await cluster.client()
    # E=3, Qw=2 (Qa=1: entry 12 may have been acknowledged, so it MUST be recovered).
    writer = await writer_client.ledgers.create(3, 2, 1, password=b"pw")
    datas = [b"entry-%d" % i for i in range(12)]
    for data in datas:  # one by one, so the bookies' LAC reaches 10
        await writer.append(data)
    assert writer.last_add_confirmed == 11
    md = writer.metadata
    key = master_key(md.key_material(b"pw"))
    holder = cluster.by_id(md.write_set_bookies(12)[0])
    length = sum(map(len, datas)) + len(b"entry-12")
    add_directly(holder, md, 12, 11, length, b"entry-12", key)

    reader_client = await cluster.client()
    reader = await reader_client.ledgers.open(writer.ledger_id, password=b"pw")
    assert reader.is_closed and reader.last_entry_id == 12
    assert reader.metadata.length == length
    assert await reader.read(0, 12) == [*datas, b"entry-12"]
    for bookie_id in md.write_set_bookies(12):  # written back to its whole write set
        assert has_entry(cluster.by_id(bookie_id), writer.ledger_id, 12)
    with pytest.raises(LedgerFencedError):
        await writer.append(b"entry-13")


async def test_ten_concurrent_recoveries_agree_on_the_last_entry(cluster):
    cluster.start_bookies(3)
    writer_client = await cluster.client()
    writer = await writer_client.ledgers.create(3, 3, 2, password=b"pw")
    for i in range(20):
        await writer.append(b"%d" % i)
    md = writer.metadata
    key = master_key(md.key_material(b"pw"))
    length = sum(len(b"%d" % i) for i in range(21))
    add_directly(cluster.by_id(md.last_fragment.ensemble[0]), md, 20, 19, length, b"20", key)
    clients = [await cluster.client() for _ in range(10)]
    handles = await asyncio.gather(
        *(c.ledgers.open(writer.ledger_id, password=b"pw") for c in clients)
    )
    lasts = {h.last_entry_id for h in handles}
    assert len(lasts) == 1, lasts
    final = await clients[0].ledgers.metadata(writer.ledger_id)
    assert lasts == {final.last_entry_id}
    assert final.last_entry_id in (19, 20)  # 20 is on one bookie of three (Qa=2)


async def test_sigkill_a_bookie_mid_stream_changes_the_ensemble(cluster):
    cluster.start_bookies(4)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 2, 2)
    datas = [b"payload-%05d" % i for i in range(600)]
    futures = []
    for i, data in enumerate(datas):
        futures += writer.append_nowait([data])
        if i == 200:
            # Once the first entries are acknowledged (so the change starts a NEW
            # fragment rather than replacing the first), kill a bookie mid-stream.
            await asyncio.gather(*futures[:100])
            victim = cluster.by_id(writer.metadata.last_fragment.ensemble[1])
            victim.kill()
        if i % 50 == 0:
            await asyncio.sleep(0)  # let the stream flow while we keep appending
    ids = await asyncio.gather(*futures)
    assert ids == list(range(600))
    # (On the bookies' framed add ports, the default where they register one.)
    assert sum(c.stats.extra.get("framed_streams", 0) for c in client.pool._clients.values()) >= 3
    closed = await writer.close()
    assert len(closed.fragments) >= 2
    assert victim.bookie_id not in closed.last_fragment.ensemble
    reader = await (await cluster.client()).ledgers.open(writer.ledger_id)
    assert await reader.read(0, 599) == datas


async def test_sigstop_a_bookie_fencing_completes_at_coverage(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 3, 2)
    for i in range(10):
        await writer.append(b"%d" % i)
    frozen = cluster.by_id(writer.metadata.last_fragment.ensemble[2])
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        reader = await (await cluster.client()).ledgers.open(writer.ledger_id)
        assert reader.last_entry_id == 9
        assert await reader.read(0, 9) == [b"%d" % i for i in range(10)]
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    with pytest.raises(LedgerFencedError):
        await writer.append(b"late")


async def test_wrong_password_can_neither_write_nor_fence(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 2, 2, password=b"right")
    # Three entries, so every bookie of the ensemble holds the ledger and its master key.
    # (A bookie that never saw a ledger takes the first key it is shown, as in
    # BookKeeper; the client refuses a wrong password before it reaches any bookie.)
    await writer.append_many([b"first", b"second", b"third"])
    with pytest.raises(UnauthorizedError):
        await (await cluster.client()).ledgers.open(writer.ledger_id, password=b"wrong")
    wrong_key = master_key(b"not the hash of the password")
    for bookie_id in writer.metadata.last_fragment.ensemble:
        stub = raw_stub(cluster.by_id(bookie_id))
        fence = stub.ReadLac(
            pb.ReadLacRequest(ledger_id=writer.ledger_id, flags=pb.FENCE, master_key=wrong_key),
            timeout=30,
        )
        assert fence.status == pb.UNAUTHORIZED
        add = pb.AddEntry(
            ledger_id=writer.ledger_id,
            entry_id=1,
            payload=b"evil",
            master_key=wrong_key,
            last_add_confirmed=0,
            length=9,
            digest=b"x",
        )
        results = [
            r
            for resp in stub.AddStream(iter([pb.AddRequest(entries=[add])]), timeout=30)
            for r in add_results(resp)
        ]
        assert [r.status for r in results] == [pb.UNAUTHORIZED]
    # Nothing was fenced or overwritten: the writer goes on.
    assert await writer.append(b"fourth") == 3
    closed = await writer.close()
    reader = await client.ledgers.open(writer.ledger_id, password=b"right")
    assert closed.last_entry_id == 3
    assert await reader.read(0, 3) == [b"first", b"second", b"third", b"fourth"]
