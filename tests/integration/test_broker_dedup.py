"""The stream service's deduplication state at scale, on real processes: its snapshot
lives in a ledger of its own (the metadata node holds a small pointer to it), so
thousands of long producer names neither outgrow the metadata store's 1 MiB node limit
nor slow the stream down; and it survives the broker's crash."""

from __future__ import annotations

import asyncio
import collections
import json
import time

import pytest

from metadata.errors import NoNodeError
from metadata.services.brokers import BrokerRegistry
from streamlib.broker.owned import SNAPSHOT_EVERY
from streamlib.client import Client
from streamlib.stream import snapshots
from streamlib.stream.positions import EARLIEST, MessageId
from tests.integration.test_broker import open_raw_producer, raw_entries, read_all

pytestmark = pytest.mark.timeout(240)

PRODUCERS = 5000
NAME_CHARS = 250
AT_ONCE = 100  # producers open at a time (each closed after its one send)
# A snapshot every SNAPSHOT_EVERY messages, however soon after the last (the tests count
# messages, not seconds).
EVERY_SNAPSHOT = ["--dedup-snapshot-interval", "0"]


def long_name(i: int) -> str:
    return f"{i:05d}-".ljust(NAME_CHARS, "n")


async def dedup_node(direct: Client, stream: str) -> bytes | None:
    try:
        return (await direct.store.get(f"{direct.streams.registry.stream_path(stream)}/dedup")).data
    except NoNodeError:
        return None


def covers(pointer: bytes, position: MessageId) -> bool:
    return MessageId(*json.loads(pointer)["position"]) >= position


async def snapshot_covering(direct: Client, stream: str, position: MessageId) -> dict:
    """The dedup pointer, once a snapshot covers `position` (bounded wait: a snapshot is
    written every SNAPSHOT_EVERY durable messages, in the background)."""
    async with asyncio.timeout(30):
        while True:
            data = await dedup_node(direct, stream)
            if data is not None:
                assert len(data) < 64 * 1024, f"the dedup node holds {len(data)} bytes"
                if covers(data, position):
                    return json.loads(data)
            await asyncio.sleep(0.1)


async def test_five_thousand_long_producer_names_keep_the_broker_and_survive_its_crash(
    zk_cluster,
):
    # (On ZooKeeper: its 1 MiB node limit is what the snapshot ledger keeps the state from.)
    cluster = zk_cluster
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=EVERY_SNAPSHOT)
    client = await cluster.service_client()
    direct = await cluster.client()
    names = [long_name(i) for i in range(PRODUCERS)]
    ids: dict[str, MessageId] = {}

    async def publish_once(name: str) -> None:
        producer = await client.create_producer("many", producer_name=name)
        ids[name] = await producer.send(name.encode())
        await producer.close()

    started = time.monotonic()
    for first in range(0, PRODUCERS, AT_ONCE):
        await asyncio.gather(*(publish_once(n) for n in names[first : first + AT_ONCE]))
    published_s = time.monotonic() - started
    # The snapshot of these messages is written in the background, after each
    # SNAPSHOT_EVERY; a producer of its own publishes on until one covers them all.
    last = max(ids.values())
    filler = await client.create_producer("many", producer_name="filler")
    for _ in range(20):
        for _ in range(200):
            await filler.send_async(b"filler")
        await filler.flush()
        data = await dedup_node(direct, "many")
        if data is not None and (len(data) >= 64 * 1024 or covers(data, last)):
            break  # (a node too large fails just below)
    await filler.close()
    pointer = await snapshot_covering(direct, "many", last)
    snapshot = await direct.ledgers.metadata(pointer["ledger_id"])
    assert snapshot.is_closed
    assert snapshot.length == pointer["bytes"] > 1 << 20  # (more than one node could hold)
    assert snapshot.last_entry_id + 1 == pointer["entries"] >= 2

    tagged = [i for i in await direct.ledgers.list()
              if snapshots.SNAPSHOT_OF in (await direct.ledgers.metadata(i)).custom_metadata]  # fmt: skip
    assert pointer["ledger_id"] in tagged
    assert [i for i in tagged if i < pointer["ledger_id"]] == []  # the replaced ones: deleted

    owner = await BrokerRegistry(direct.store).owner("many")
    assert owner is not None and owner.broker_id == broker.broker_id
    log = broker.stderr_tail(1 << 30)
    assert "lost its metadata session" not in log
    assert "dedup snapshot failed" not in log

    broker.kill()  # SIGKILL: the next owner starts from the snapshot ledger
    [successor] = cluster.start_brokers(1, extra=EVERY_SNAPSHOT)
    after = await Client.connect("streamlib://" + successor.address)
    cluster.clients.append(after)
    again = await after.create_producer("many", producer_name=names[0])
    assert again.last_sequence_id == 0
    await again.close()
    assert f"from snapshot ledger {pointer['ledger_id']}" in successor.stderr_tail(1 << 30)
    channel, call, ready = await open_raw_producer(successor.address, "many", names[0])
    try:
        assert ready.ready.last_sequence_id == 0
        await call.write(raw_entries(names[0], (0, b"again")))
        answer = await call.read()
        [receipt] = answer.receipts.receipts
        assert receipt.duplicate
        where = receipt.message_id
        assert (where.ledger_id, where.entry_id, where.batch_index) == tuple(ids[names[0]])
    finally:
        call.cancel()
        await channel.close()

    reader = await direct.create_reader("many", EARLIEST)
    stored: collections.Counter[str] = collections.Counter()
    while await reader.has_message_available():
        message = await reader.read_next(timeout=30)
        if message.producer_name != "filler":
            assert message.data == message.producer_name.encode()
            stored[message.producer_name] += 1
    assert stored == collections.Counter(names)  # every message once, the resend not at all
    print(f"{PRODUCERS} producers published in {published_s:.1f}s; snapshot "
          f"{pointer['bytes']} bytes in {pointer['entries']} entries")  # fmt: skip


async def test_a_producer_name_idle_past_the_brokers_timeout_is_forgotten(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1, extra=["--dedup-inactivity-timeout", "0.5", *EVERY_SNAPSHOT])
    client = await cluster.service_client()
    gone = await client.create_producer("idle", producer_name="gone")
    await gone.send(b"once")
    await gone.close()
    back = await client.create_producer("idle", producer_name="gone")
    assert back.last_sequence_id == 0  # remembered
    await back.close()
    busy = await client.create_producer("idle", producer_name="busy")
    remembered = []
    for _ in range(200):  # idle names are forgotten when a snapshot is written (bounded)
        for _ in range(SNAPSHOT_EVERY):
            await busy.send_async(b"busy")
        await busy.flush()
        # (One more round trip: a snapshot its last entry started has begun -- and
        # forgotten the idle names -- before "gone" connects again and is kept.)
        await busy.send(b"busy")
        back = await client.create_producer("idle", producer_name="gone")
        remembered.append(back.last_sequence_id)
        await back.close()
        if remembered[-1] == -1:
            break
    assert remembered[-1] == -1  # forgotten: a producer of that name starts anew
    await busy.close()
    again = await client.create_producer("idle", producer_name="busy")  # active: remembered
    assert again.last_sequence_id == busy.last_sequence_id > 0


async def test_the_sweeper_deletes_leaked_snapshot_ledgers_and_keeps_the_current_one(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1, extra=EVERY_SNAPSHOT)
    client = await cluster.service_client()
    producer = await client.create_producer("swept")
    direct = await cluster.client()
    assert await dedup_node(direct, "swept") is None  # (a new stream's empty state: none)
    sends = [producer.send_async(b"one")] + [producer.send_async(b"x") for _ in range(999)]
    last = (await asyncio.gather(*[await s for s in sends]))[-1]
    current = snapshots.Pointer.parse(
        json.dumps(await snapshot_covering(direct, "swept", last)).encode()
    )
    assert current is not None
    # What a broker killed between its new snapshot's pointer and the old one's delete
    # (or before its pointer) leaves: a snapshot ledger no pointer names.
    leaked = await direct.ledgers.create(
        3, 2, 2, password=b"pw", custom_metadata={snapshots.SNAPSHOT_OF: b"swept/dedup"}
    )
    await leaked.append(b"{}")
    await leaked.close()
    assert await direct.streams.sweep(grace_s=0) == [leaked.ledger_id]
    assert (await direct.ledgers.metadata(current.ledger_id)).is_closed  # still there
    await producer.send(b"two")
    read = [m.data for m in await read_all(cluster, "swept", 1001)]
    assert read == [b"one"] + [b"x"] * 999 + [b"two"]
