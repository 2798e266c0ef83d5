"""Entries whole through the stream service, on real processes (bookies, a `streamlib
broker`, clients of streamlib://): the broker hands out each entry as stored --
compressed as its producer sent it -- and acknowledgements go by message (batch-index
acks): what comes again after a consumer leaves, or after a negative acknowledgement, is
only what was not acknowledged; key_shared splits an entry of several keys and never a
key; permits count messages."""

from __future__ import annotations

import asyncio
import collections

import grpc
import pytest

from streamlib.service.subscription import IncompatibleBrokerError
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.positions import MessageId
from streamlib.wire import broker_pb2 as pb
from streamlib.wire import broker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(180)


async def publish_batches(client, stream: str, count: int, **options) -> list[MessageId]:
    """count messages sent together: they go in few entries (batched)."""
    producer = await client.create_producer(stream, batching_max_publish_delay_ms=50, **options)
    futures = [await producer.send_async(b"m%03d" % i, key=f"k{i % 5}") for i in range(count)]
    await producer.flush()
    ids = [await f for f in futures]
    await producer.close()
    assert len({(i.ledger_id, i.entry_id) for i in ids}) < count // 4  # batched
    return ids


async def test_a_consumer_gets_whole_entries_and_only_what_was_not_acknowledged_again(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    ids = await publish_batches(client, "entries", 60, compression_type="zstd")
    first = await client.subscribe("entries", "s", "earliest", consumer_type="shared")
    got = [await first.receive(timeout=30) for _ in range(60)]
    assert [m.data for m in got] == [b"m%03d" % i for i in range(60)]
    assert [m.message_id for m in got] == ids
    assert [m.key for m in got] == [f"k{i % 5}" for i in range(60)]
    acked = {m.message_id for m in got if m.message_id.batch_index % 3 != 1}
    for message in got:
        if message.message_id in acked:
            first.acknowledge(message)
    again = await client.subscribe("entries", "s", consumer_type="shared")
    await first.close()  # (its acks go out first; what it held goes to the other)
    redelivered = [await again.receive(timeout=30) for _ in range(60 - len(acked))]
    assert sorted(m.message_id for m in redelivered) == sorted(set(ids) - acked)
    assert all(m.redelivery_count == 1 for m in redelivered)
    # A negative ack of one message of an entry: that one again, its entry's others not.
    again.negative_acknowledge(redelivered[0])
    for message in redelivered[1:]:
        again.acknowledge(message)
    back = await again.receive(timeout=30)
    assert back.message_id == redelivered[0].message_id and back.redelivery_count == 2
    again.acknowledge(back)
    with pytest.raises(TimeoutError):
        await again.receive(timeout=1)
    await again.close()
    await client.close()


async def test_key_shared_splits_an_entry_by_key_and_never_a_key(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    await (await client.create_producer("keyed")).close()  # (the stream)
    consumers = [
        await client.subscribe(
            "keyed", "ks", "earliest", consumer_type="key_shared", consumer_name=f"c{i}"
        )
        for i in range(3)
    ]
    await publish_batches(client, "keyed", 200)
    holders: dict[str | None, set[int]] = collections.defaultdict(set)
    entries: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    seen: list[bytes] = []

    async def take(i: int) -> None:
        while True:
            message = await consumers[i].receive()
            holders[message.key].add(i)
            entries[(message.message_id.ledger_id, message.message_id.entry_id)].add(i)
            seen.append(message.data)
            consumers[i].acknowledge(message)

    takers = [asyncio.ensure_future(take(i)) for i in range(3)]
    try:
        async with asyncio.timeout(60):
            while len(seen) < 200:
                await asyncio.wait(takers, timeout=0.2)  # (until all 200 came, bounded)
    finally:
        for taker in takers:
            taker.cancel()
    assert sorted(seen) == [b"m%03d" % i for i in range(200)]
    assert all(len(who) == 1 for who in holders.values()), holders  # a key: one consumer
    assert any(len(who) > 1 for who in entries.values())  # an entry: split between them
    for consumer in consumers:
        await consumer.close()
    await client.close()


async def test_the_broker_sends_entries_as_stored_and_counts_permits_in_messages(cluster):
    """On the wire: a consumer with one permit gets one whole entry of many messages,
    compressed as it was produced, and then nothing until it gives permits back. (The
    first entry holds the first message alone: nothing was in flight.)"""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    client = await cluster.service_client()
    ids = await publish_batches(
        client, "wire", 40, compression_type="lz4", batching_max_messages=10
    )
    entries = sorted({(i.ledger_id, i.entry_id) for i in ids})
    second = [i for i in ids if (i.ledger_id, i.entry_id) == entries[1]]
    assert len(second) > 1
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        requests: asyncio.Queue[pb.ConsumeRequest] = asyncio.Queue()
        opened = pb.ConsumerOpen(
            stream="wire",
            subscription="raw",
            consumer_type="shared",
            initial_position="earliest",
            protocol_version=2,
        )
        await requests.put(pb.ConsumeRequest(open=opened))
        await requests.put(pb.ConsumeRequest(flow=pb.Flow(permits=1)))

        async def gen():
            while True:
                yield await requests.get()

        call = stub.Consume(gen())
        answers = call.__aiter__()
        assert (await asyncio.wait_for(answers.__anext__(), 30)).WhichOneof("kind") == "ready"

        async def next_entries() -> list[pb.DeliveredEntry]:
            answer = await asyncio.wait_for(answers.__anext__(), 30)
            assert answer.WhichOneof("kind") == "entries"
            return list(answer.entries.entries)

        [entry] = await next_entries()
        assert (entry.ledger_id, entry.entry_id) == entries[0]
        await requests.put(pb.ConsumeRequest(flow=pb.Flow(permits=1)))
        [entry] = await next_entries()
        assert (entry.ledger_id, entry.entry_id) == entries[1]
        assert list(entry.indexes) == []  # (all of its messages)
        assert envelope.Batch.FromString(entry.entry).compression == 1  # LZ4, as produced
        nothing = asyncio.ensure_future(answers.__anext__())
        done, _ = await asyncio.wait({nothing}, timeout=1)
        assert not done  # (its one permit bought a whole entry: it owes the rest)
        # (It owes len - 1 permits: len more leave it one.)
        await requests.put(pb.ConsumeRequest(flow=pb.Flow(permits=len(second))))
        answer = await asyncio.wait_for(nothing, 30)
        assert answer.WhichOneof("kind") == "entries"
        assert (answer.entries.entries[0].ledger_id, answer.entries.entries[0].entry_id) == (
            entries[2]
        )
        call.cancel()
    await client.close()


async def test_a_client_and_a_broker_of_other_versions_say_so(cluster):
    """A client from before entries came whole is refused by the broker; a broker's answer
    the client does not know is an error, not messages dropped unseen."""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    client = await cluster.service_client()
    await (await client.create_producer("versions")).close()
    async with grpc.aio.insecure_channel(broker.address) as channel:
        call = pb_grpc.BrokerStub(channel).Consume()
        await call.write(
            pb.ConsumeRequest(open=pb.ConsumerOpen(stream="versions", subscription="s"))
        )
        answer = await asyncio.wait_for(call.read(), 30)
        assert answer.error.code == "BadRequestError" and "upgrade" in answer.error.message
        call.cancel()
    consumer = await client.subscribe("versions", "s")
    session = consumer.source
    with pytest.raises(IncompatibleBrokerError, match="upgrade brokers and clients"):
        session._answer(pb.ConsumeResponse())  # (what an older broker's messages read as)
    await consumer.close()
    await client.close()
