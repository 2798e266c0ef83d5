"""The stream service on real processes: bookies, `streamlib broker` processes, and
clients of streamlib://. Many producers on one stream, shared and key_shared
subscriptions, access modes, deduplication, and brokers that die, stop or unload."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import sys

import grpc
import pytest

import streamlib
import streamlib.errors as errors
from metadata.services.brokers import BrokerRegistry
from streamlib.broker.dedup import MIN_RECENT_IDS
from streamlib.schema import IncompatibleSchemaError, JsonSchema
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import BatchBuilder
from streamlib.stream.positions import EARLIEST
from streamlib.stream.producer import ProducerQueueIsFullError
from streamlib.wire import broker_pb2 as pb
from streamlib.wire import broker_pb2_grpc as pb_grpc
from tests.integration.conftest import script_process

pytestmark = pytest.mark.timeout(180)

PRODUCER_SCRIPT = """
import sys, streamlib
client = streamlib.connect(sys.argv[1])
producer = client.create_producer(sys.argv[2], producer_name=sys.argv[3])
for i in range(int(sys.argv[4])):
    producer.send_async(b"%s-%d" % (sys.argv[3].encode(), i), key=sys.argv[3])
producer.flush()
print("done", flush=True)
client.close()
"""


async def read_all(cluster, stream: str, count: int) -> list:
    """Every message of the stream, read straight from the bookies (direct mode)."""
    client = await cluster.client()
    reader = await client.create_reader(stream, EARLIEST)
    return [await reader.read_next(timeout=30) for _ in range(count)]


async def test_two_producer_processes_share_one_stream_without_fencing_each_other(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    url = cluster.service_url
    async with (
        script_process(PRODUCER_SCRIPT, url, "shared", "A", "300", ready="done"),
        script_process(PRODUCER_SCRIPT, url, "shared", "B", "300", ready="done"),
    ):
        pass
    messages = await read_all(cluster, "shared", 600)
    by_producer = collections.defaultdict(list)
    for message in messages:
        by_producer[message.producer_name].append((message.sequence_id, message.data))
    assert sorted(by_producer) == ["A", "B"]
    for name, sent in by_producer.items():  # each in its own order, every one once
        assert sent == [(i, b"%s-%d" % (name.encode(), i)) for i in range(300)]


async def test_a_shared_subscription_splits_the_messages_and_redelivers_a_closed_consumers(
    cluster,
):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    # (An entry a message: a shared consumer takes whole entries, and a batch of 99 would
    # leave the first consumer of this test waiting for messages the second one holds.)
    producer = await client.create_producer("work", batching_max_messages=1)
    for i in range(100):
        await producer.send_async(b"%d" % i)
    await producer.flush()
    first = await client.subscribe("work", "jobs", "earliest", consumer_type="shared",
                                   receiver_queue_size=10)  # fmt: skip
    second = await client.subscribe("work", "jobs", "earliest", consumer_type="shared",
                                    receiver_queue_size=10)  # fmt: skip
    # The first takes ten and dies with them unacknowledged: they go to the second.
    held = [await first.receive(timeout=30) for _ in range(10)]
    await first.close()
    done: dict[bytes, int] = collections.Counter()
    while sum(done.values()) < 100 or len(done) < 100:
        message = await second.receive(timeout=30)
        done[message.data] += 1
        second.acknowledge(message)
    assert set(done) == {b"%d" % i for i in range(100)}
    assert {m.data for m in held} <= set(done)
    await second.close()
    # Everything was acknowledged: the subscription has nothing more.
    again = await client.subscribe("work", "jobs", consumer_type="shared")
    with pytest.raises(errors.TimeoutError):
        await again.receive(timeout=1.5)


async def test_shared_consumers_take_turns(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    await client.streams.create("turns")
    consumers = [
        await client.subscribe(
            "turns", "s", "earliest", consumer_type="shared", receiver_queue_size=5
        )
        for _ in range(2)
    ]
    producer = await client.create_producer("turns")
    for i in range(40):
        await producer.send_async(b"%d" % i)
    await producer.flush()
    got: dict[int, list[bytes]] = {0: [], 1: []}
    while len(got[0]) + len(got[1]) < 40:
        for index, consumer in enumerate(consumers):
            with_timeout = await consumer.batch_receive(10, 200)
            for message in with_timeout:
                got[index].append(message.data)
                consumer.acknowledge(message)
    assert sorted(got[0] + got[1], key=int) == [b"%d" % i for i in range(40)]
    assert got[0] and got[1]  # both did some of the work


async def test_key_shared_keeps_each_keys_order_when_a_consumer_joins(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    producer = await client.create_producer("keys")
    keys = [f"k{i}" for i in range(12)]
    sent = 0

    async def publish(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            await producer.send_async(b"%d" % sent, key=keys[sent % len(keys)])
            sent += 1
        await producer.flush()

    await publish(120)
    first = await client.subscribe("keys", "k", "earliest", consumer_type="key_shared",
                                   consumer_name="first")  # fmt: skip
    early = [await first.receive(timeout=30) for _ in range(120)]  # all of them, none acked
    second = await client.subscribe("keys", "k", consumer_type="key_shared", consumer_name="second")
    await publish(120)
    # Keys that moved to the second wait while the first holds their earlier messages;
    # the first goes on receiving the keys it kept.
    kept = []
    while True:
        try:
            kept.append(await first.receive(timeout=1.5))
        except errors.TimeoutError:
            break
    with pytest.raises(errors.TimeoutError):
        await second.receive(timeout=1.5)
    kept_keys = {m.key for m in kept}
    for message in early + kept:
        first.acknowledge(message)
    moved = [await second.receive(timeout=30) for _ in range(120 - len(kept))]
    assert kept and moved  # (the ring split the keys)
    assert not kept_keys & {m.key for m in moved}
    order: dict[str, list[int]] = collections.defaultdict(list)
    for message in early + kept + moved:
        order[message.key].append(int(message.data))
    for key, values in order.items():
        assert values == sorted(values), key
    assert sorted(v for vs in order.values() for v in vs) == list(range(240))


async def test_exclusive_and_failover_through_the_service(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    producer = await client.create_producer("fo")
    for i in range(6):
        await producer.send_async(b"%d" % i)
    await producer.flush()
    only = await client.subscribe("fo", "ex", "earliest")
    with pytest.raises(errors.ConsumerBusyError):
        await client.subscribe("fo", "ex")
    with pytest.raises(errors.ConsumerBusyError):  # another type while it has consumers
        await client.subscribe("fo", "ex", consumer_type="shared")
    assert (await only.receive(timeout=30)).data == b"0"

    active = await client.subscribe("fo", "fo", "earliest", consumer_type="failover")
    standby = await client.subscribe("fo", "fo", consumer_type="failover")
    assert active.is_active and not standby.is_active
    for i in range(3):
        message = await active.receive(timeout=30)
        assert message.data == b"%d" % i
        active.acknowledge(message)
    await active.close()
    # The standby takes over from the first unacknowledged message.
    assert (await standby.receive(timeout=30)).data == b"3"
    assert standby.is_active


async def test_access_modes(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    shared = await client.create_producer("modes", producer_name="shared-one")
    with pytest.raises(errors.ProducerBusyError):  # the name is taken
        await client.create_producer("modes", producer_name="shared-one")
    with pytest.raises(errors.ProducerBusyError):  # exclusive needs nobody else
        await client.create_producer("modes", access_mode="exclusive")
    with pytest.raises(errors.BadRequestError):
        await client.create_producer("modes", access_mode="sometimes")
    await shared.send(b"before")

    fencing = await client.create_producer("modes", access_mode="exclusive_with_fencing")
    with pytest.raises(errors.ProducerFencedError):
        await shared.send(b"after")
    with pytest.raises(errors.ProducerBusyError):
        await client.create_producer("modes")  # shared, while an exclusive one holds it
    waiting = asyncio.get_running_loop().create_task(
        client.create_producer("modes", access_mode="wait_for_exclusive")
    )
    await fencing.send(b"fenced the shared one")
    assert not waiting.done()  # (it waits while the exclusive one publishes)
    await fencing.close()
    waited = await asyncio.wait_for(waiting, 30)
    await waited.send(b"waited")
    data = [m.data for m in await read_all(cluster, "modes", 3)]
    assert data == [b"before", b"fenced the shared one", b"waited"]


async def open_raw_producer(address: str, stream: str, name: str):
    channel = grpc.aio.insecure_channel(address)
    call = pb_grpc.BrokerStub(channel).Produce()
    await call.write(pb.ProduceRequest(open=pb.ProducerOpen(stream=stream, producer_name=name)))
    ready = await call.read()
    return channel, call, ready


def raw_entries(producer: str, *messages: tuple[int, bytes]) -> pb.ProduceRequest:
    """A request of one entry per message, as a producer builds them."""
    request = pb.ProduceRequest(entries=pb.EntryBatch())
    for sequence_id, payload in messages:
        batch = BatchBuilder()
        batch.add(payload, 1, sequence_id=sequence_id, producer=producer)
        request.entries.entries.add(entry=batch.encode(), first_sequence_id=sequence_id,
                                    last_sequence_id=sequence_id, messages=1)  # fmt: skip
    return request


async def test_the_broker_drops_a_resent_sequence_id_and_says_where_the_original_went(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    client = await cluster.service_client()
    producer = await client.create_producer("dedup", producer_name="p")
    ids = [await producer.send(b"%d" % i) for i in range(10)]
    await producer.close()

    again = await client.create_producer("dedup", producer_name="p")
    assert again.last_sequence_id == 9  # a producer of that name goes on from there
    await again.close()
    channel, call, ready = await open_raw_producer(broker.address, "dedup", "p")
    try:
        assert ready.ready.last_sequence_id == 9
        await call.write(raw_entries("p", (5, b"5 again"), (10, b"10")))
        answer = await call.read()
        receipts = {r.sequence_id: r for r in answer.receipts.receipts}
        assert receipts[5].duplicate
        where = receipts[5].message_id
        assert (where.ledger_id, where.entry_id, where.batch_index) == tuple(ids[5])
        assert not receipts[10].duplicate
    finally:
        call.cancel()
        await channel.close()
    data = [m.data for m in await read_all(cluster, "dedup", 11)]
    assert data == [b"%d" % i for i in range(11)]


async def test_a_duplicate_older_than_the_recent_ids_budget_is_still_dropped(cluster):
    """The broker keeps the positions of each producer name's last sequence ids within a
    broker-wide budget (--max-dedup-recent-ids; at least 16 a name): a duplicate older
    than those is still dropped, answered with EARLIEST (as Pulsar answers every
    duplicate), and a recent one with where the original went."""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=["--max-dedup-recent-ids", "1"])
    client = await cluster.service_client()
    producer = await client.create_producer("budget", producer_name="p")
    ids = [await producer.send(b"%d" % i) for i in range(100)]
    await producer.close()
    channel, call, ready = await open_raw_producer(broker.address, "budget", "p")
    try:
        assert ready.ready.last_sequence_id == 99
        assert len(ready.ready.recent) == MIN_RECENT_IDS  # (not 100: its share)
        await call.write(raw_entries("p", (5, b"5 again"), (95, b"95 again"), (100, b"100")))
        answer = await call.read()
        receipts = {r.sequence_id: r for r in answer.receipts.receipts}
        assert receipts[5].duplicate and receipts[95].duplicate and not receipts[100].duplicate
        old, recent = receipts[5].message_id, receipts[95].message_id
        assert (old.ledger_id, old.entry_id, old.batch_index) == tuple(EARLIEST)
        assert (recent.ledger_id, recent.entry_id, recent.batch_index) == tuple(ids[95])
    finally:
        call.cancel()
        await channel.close()
    data = [m.data for m in await read_all(cluster, "budget", 101)]
    assert data == [b"%d" % i for i in range(101)]


async def test_bad_requests_get_clear_errors(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        call = stub.Produce()
        await call.write(pb.ProduceRequest(entries=pb.EntryBatch()))
        answer = await call.read()
        assert answer.error.code == "BadRequestError"
        call = stub.Produce()
        await call.write(pb.ProduceRequest(open=pb.ProducerOpen(stream="bad/name")))
        answer = await call.read()
        assert answer.WhichOneof("kind") == "error"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Lookup(pb.LookupRequest(stream="bad/name"))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        call = stub.Consume()
        await call.write(pb.ConsumeRequest(open=pb.ConsumerOpen(stream="x", subscription="s",
                                                                consumer_type="sometimes",
                                                                protocol_version=2)))  # fmt: skip
        answer = await call.read()
        assert answer.error.code == "BadRequestError"
    client = await cluster.service_client()
    with pytest.raises(errors.BadRequestError):
        await client.subscribe("x", "s", consumer_type="sometimes")
    with pytest.raises(errors.TooLargeError):
        producer = await client.create_producer("x")
        await producer.send(b"x" * (6 << 20))


async def test_the_broker_refuses_an_entry_that_is_not_the_producers_own(cluster):
    """An entry must hold the producer's own messages with the sequence ids it claims:
    one naming another producer would, read back after a failover, make that one's
    sends look like duplicates. Each bad entry fails alone; the good one is stored."""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    channel, call, _ = await open_raw_producer(broker.address, "own", "p")
    try:
        good = raw_entries("p", (0, b"mine")).entries.entries[0]
        forged = raw_entries("q", (1, b"as q")).entries.entries[0]
        claimed = raw_entries("p", (2, b"claims 3")).entries.entries[0]
        claimed.last_sequence_id = 3
        junk = pb.EntrySend(entry=b"not a batch", first_sequence_id=4, last_sequence_id=4,
                            messages=1)  # fmt: skip
        # A compressed entry claiming 64 MiB: refused before a byte is decompressed.
        bomb = envelope.Batch(format_version=3, compression=1, uncompressed_size=64 << 20,
                              compressed=b"x" * 100).SerializeToString()  # fmt: skip
        bombed = pb.EntrySend(entry=bomb, first_sequence_id=5, last_sequence_id=5, messages=1)
        piece = BatchBuilder()
        piece.add(b"p", 1, sequence_id=6, producer="p")
        huge = pb.EntrySend(entry=piece.encode_chunk("u", 0, 10_000, 1),
                            first_sequence_id=6, last_sequence_id=6, messages=1)  # fmt: skip
        request = pb.ProduceRequest(
            entries=pb.EntryBatch(entries=[forged, claimed, junk, bombed, huge, good])
        )
        await call.write(request)
        answers = [await call.read() for _ in range(6)]
    finally:
        call.cancel()
        await channel.close()
    failed = [a.failed for a in answers if a.WhichOneof("kind") == "failed"]
    assert [f.sequence_ids[0] for f in failed] == [1, 3, 4, 5, 6]
    assert {f.error.code for f in failed} == {"BadRequestError", "MessageDecodeError"}
    [stored] = [a.receipts for a in answers if a.WhichOneof("kind") == "receipts"]
    assert [r.sequence_id for r in stored.receipts] == [0]
    assert [m.data for m in await read_all(cluster, "own", 1)] == [b"mine"]


async def test_streams_spread_over_brokers_and_move_when_unloaded(cluster):
    cluster.start_bookies(3)
    brokers = cluster.start_brokers(2)
    client = await cluster.service_client()
    producers = [await client.create_producer(f"spread-{i}") for i in range(4)]
    registry = BrokerRegistry((await cluster.client()).store)
    owners = [await registry.owner(f"spread-{i}") for i in range(4)]
    assert collections.Counter(o.broker_id for o in owners).most_common(1)[0][1] == 2
    # Unloading a stream moves it; its producer follows on its own.
    moved = owners[0]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamlib", "admin", "broker", "unload", "spread-0",
        "--metadata", cluster.metadata_uri,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0 and b"unloaded" in out
    await producers[0].send(b"after the unload")
    assert (await registry.owner("spread-0")) is not None
    assert {b.broker_id for b in brokers} >= {moved.broker_id}
    assert (await read_all(cluster, "spread-0", 1))[0].data == b"after the unload"


async def test_a_partitioned_stream_through_the_service(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(2)
    direct = await cluster.client()
    await direct.streams.create("parts", partitions=3)
    client = await cluster.service_client()
    producer = await client.create_producer("parts")
    consumer = await client.subscribe("parts", "all", "earliest", consumer_type="shared")
    for i in range(90):
        await producer.send_async(b"%d" % i, key=f"key{i % 9}")
    await producer.flush()
    got: dict[str, list[int]] = collections.defaultdict(list)
    for _ in range(90):
        message = await consumer.receive(timeout=30)
        got[message.key].append(int(message.data))
        consumer.acknowledge(message)
    assert sorted(v for vs in got.values() for v in vs) == list(range(90))
    for key, values in got.items():  # a key's messages stay in one partition, in order
        assert values == sorted(values), key
    registry = BrokerRegistry(direct.store)
    owners = {(await registry.owner(f"parts-partition-{i}")).broker_id for i in range(3)}
    assert len(owners) == 2  # the partitions are spread over the brokers


@dataclasses.dataclass
class Order:
    id: int
    item: str


@dataclasses.dataclass
class OrderV2:  # compatible: a new field with a default
    id: int
    item: str
    gift: bool = False


@dataclasses.dataclass
class OrderRenamed:  # incompatible: a new required field
    id: int
    customer: str


async def test_schemas_through_the_service(cluster):
    """The stream keeps the first producer's schema; the broker cannot judge one, so
    the client checks a different one against it, and only a compatible one is stored."""
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    first = await client.create_producer("orders", schema=JsonSchema(Order), producer_name="v1")
    await first.send(Order(1, "book"))
    with pytest.raises(IncompatibleSchemaError):
        await client.create_producer("orders", schema=JsonSchema(OrderRenamed))
    newer = await client.create_producer("orders", schema=JsonSchema(OrderV2), producer_name="v2")
    await newer.send(OrderV2(2, "pen", gift=True))
    stored = (await (await cluster.client()).streams.read("orders"))[0].properties
    assert json.loads(stored["schema.definition"]) == json.loads(JsonSchema(OrderV2).definition())
    # The first schema is no longer the stream's: checked, and compatible (v2 reads v1).
    again = await client.create_producer("orders", schema=JsonSchema(Order), producer_name="v1b")
    await again.send(Order(3, "ink"))
    consumer = await client.subscribe("orders", "o", "earliest", schema=JsonSchema(OrderV2))
    values = [(await consumer.receive(timeout=30)).value() for _ in range(3)]
    assert values == [OrderV2(1, "book"), OrderV2(2, "pen", True), OrderV2(3, "ink")]


async def test_seek_and_unsubscribe_through_the_service(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    producer = await client.create_producer("rewind")
    ids = [await producer.send(b"%d" % i) for i in range(10)]
    consumer = await client.subscribe("rewind", "s", "earliest", consumer_type="shared")
    other = await client.subscribe("rewind", "s", consumer_type="shared")
    for _ in range(10):  # everything acknowledged, by whichever got it
        for c in (consumer, other):
            for message in await c.batch_receive(10, 100):
                c.acknowledge(message)
    await consumer.seek(ids[4])  # message 4 comes next, to one of the two
    again = set()
    async with asyncio.timeout(60):  # (bounded: a message lost to the seek fails here)
        while len(again) < 6:
            for c in (consumer, other):
                for message in await c.batch_receive(10, 200):
                    again.add(message.data)
                    c.acknowledge(message)
    assert again == {b"%d" % i for i in range(4, 10)}
    with pytest.raises(errors.ConsumerBusyError):  # another consumer is connected
        await consumer.unsubscribe()
    await other.close()
    await consumer.unsubscribe()
    fresh = await client.subscribe("rewind", "s", "earliest", consumer_type="shared")
    assert (await fresh.receive(timeout=30)).data == b"0"  # a new subscription from earliest


async def test_a_producer_flooding_a_stopped_broker_meets_its_pending_limit(cluster):
    """Backpressure, never unbounded memory: with the owner stopped, sends pile up only
    to max_pending_messages; once it runs again every one of them is published."""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    client = await cluster.service_client()
    producer = await client.create_producer(
        "flood", max_pending_messages=50, block_if_queue_full=False
    )
    await producer.send(b"first")
    broker.pause()
    try:
        pending = [await producer.send_async(b"%d" % i) for i in range(50)]
        with pytest.raises(ProducerQueueIsFullError):
            await producer.send_async(b"one too many")
    finally:
        broker.resume()
    ids = await asyncio.wait_for(asyncio.gather(*pending), 60)
    assert len(set(ids)) == 50
    assert [m.data for m in await read_all(cluster, "flood", 51)][1:] == [
        b"%d" % i for i in range(50)
    ]


async def test_sends_in_flight_when_the_owners_writer_is_fenced_are_resent_not_failed(cluster):
    """A direct-mode producer takes the stream over (fencing the broker's ledger) while
    service sends are in flight: the broker gives the stream up, the client resends
    with the same sequence ids, the broker takes the stream back -- and not one send
    fails or is stored twice."""
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    producer = await client.create_producer("contested", producer_name="svc")
    futures = []
    direct = await cluster.client()
    for i in range(600):
        futures.append(await producer.send_async(b"%d" % i))
        if i == 300:
            taker = await direct.create_producer("contested")  # fences the broker's writer
            await taker.close()
        if i % 50 == 0:
            await asyncio.sleep(0)  # (let the broker's answers in)
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 120)
    assert [r for r in results if isinstance(r, BaseException)] == []
    stored = [m.data for m in await read_all(cluster, "contested", 600)]
    assert stored == [b"%d" % i for i in range(600)]


async def test_a_reopened_producer_replaces_its_lingering_session_only_when_resuming(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    channel, first, ready = await open_raw_producer(broker.address, "linger", "p")
    try:
        assert ready.WhichOneof("kind") == "ready"  # and it is never closed
        async with grpc.aio.insecure_channel(broker.address) as other:
            stub = pb_grpc.BrokerStub(other)
            call = stub.Produce()
            await call.write(pb.ProduceRequest(open=pb.ProducerOpen(stream="linger",
                                                                    producer_name="p")))  # fmt: skip
            assert (await call.read()).error.code == "ProducerBusyError"
            call = stub.Produce()
            await call.write(pb.ProduceRequest(open=pb.ProducerOpen(
                stream="linger", producer_name="p", resume=True)))  # fmt: skip
            assert (await call.read()).WhichOneof("kind") == "ready"
            # The lingering one was cut off.
            while (answer := await first.read()).WhichOneof("kind") == "heartbeat":
                pass
            assert answer.error.code == "StreamGone"
            call.cancel()
    finally:
        first.cancel()
        await channel.close()


async def test_a_malformed_ack_ends_the_consumer_with_a_typed_error(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    await (await cluster.service_client()).streams.create("acks")
    async with grpc.aio.insecure_channel(broker.address) as channel:
        call = pb_grpc.BrokerStub(channel).Consume()
        await call.write(pb.ConsumeRequest(open=pb.ConsumerOpen(stream="acks", subscription="s",
                                                                protocol_version=2)))  # fmt: skip
        assert (await call.read()).WhichOneof("kind") == "ready"
        bad = pb.MessageIdPb(ledger_id=-5, entry_id=0, batch_index=0)
        await call.write(pb.ConsumeRequest(ack=pb.AckRequest(ids=[bad])))
        while (answer := await call.read()).WhichOneof("kind") == "heartbeat":
            pass
        assert answer.error.code == "InvalidPositionError"


async def test_dead_letters_and_ack_timeouts_through_the_service(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    producer = await client.create_producer("poison")
    await producer.send(b"poison", key="k", properties={"p": "1"})
    await producer.send(b"fine")
    consumer = await client.subscribe(
        "poison", "s", "earliest", consumer_type="shared",
        negative_ack_redelivery_delay_ms=50,
        dead_letter_policy=streamlib.DeadLetterPolicy(max_redeliver_count=2),
    )  # fmt: skip
    deliveries = []
    while not (consumer.dead_lettered and (b"fine", 0) in deliveries):
        try:  # (the fourth delivery of the poison goes to the dead letters inside)
            message = await consumer.receive(timeout=2)
        except errors.TimeoutError:
            continue
        deliveries.append((message.data, message.redelivery_count))
        if message.data == b"fine":
            consumer.acknowledge(message)
        else:
            consumer.negative_acknowledge(message)  # poison: never handled
    assert [d for d in deliveries if d[0] == b"poison"] == [(b"poison", n) for n in range(3)]
    dead = await client.subscribe("poison-s-DLQ", "audit", "earliest")
    letter = await dead.receive(timeout=30)
    assert (letter.data, letter.key) == (b"poison", "k")
    assert letter.properties["REAL_TOPIC"] == "poison" and letter.properties["p"] == "1"

    # An ack timeout gives an unacknowledged message back: it comes again.
    timed = await client.subscribe("poison", "t", "earliest", ack_timeout_ms=200,
                                   negative_ack_redelivery_delay_ms=50)  # fmt: skip
    first = await timed.receive(timeout=30)
    again = await timed.receive(timeout=30)
    while again.message_id != first.message_id:  # (the other message meanwhile)
        timed.acknowledge(again)
        again = await timed.receive(timeout=30)
    assert again.redelivery_count == 1
