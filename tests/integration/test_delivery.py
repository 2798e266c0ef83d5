"""Delivery as a pulsar-client user expects it, with real bookie processes: dead-letter
policies, delayed delivery (held by consumers, never skipped by the cursor),
batch_receive, message listeners (asyncio and blocking), negative acknowledgement by id,
and readers that start inclusively or seek by time."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest

import streamlib
from streamlib.errors import BadRequestError
from streamlib.stream.consumer import DeadLetterPolicy
from streamlib.stream.writer import now_ms

pytestmark = pytest.mark.timeout(120)


async def test_a_poison_message_goes_to_the_dead_letter_stream(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("jobs")
    await producer.send(b"poison", key="k", properties={"kind": "bad"})
    await producer.send(b"fine")
    consumer = await client.subscribe(
        "jobs", "workers", "earliest",
        negative_ack_redelivery_delay_ms=10,
        dead_letter_policy=DeadLetterPolicy(max_redeliver_count=2),
    )  # fmt: skip
    deliveries = []
    for _ in range(4):  # "fine" once, "poison" three times
        message = await consumer.receive(timeout=30)
        deliveries.append((message.data, message.redelivery_count))
        if message.data == b"fine":
            consumer.acknowledge(message)
        else:
            poison_id = message.message_id
            consumer.negative_acknowledge(message.message_id)  # by id, as Pulsar allows
    # Delivered once and redelivered twice (max_redeliver_count), then dead-lettered.
    assert [n for data, n in deliveries if data == b"poison"] == [0, 1, 2]
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.5)
    assert consumer.dead_lettered == 1
    dlq = await client.create_reader("jobs-workers-DLQ")
    dead = await dlq.read_next(timeout=30)
    assert (dead.data, dead.key) == (b"poison", "k")
    assert dead.properties["kind"] == "bad" and dead.properties["REAL_TOPIC"] == "jobs"
    assert dead.properties["ORIGIN_MESSAGE_ID"] == str(poison_id)
    await consumer.close()
    # Acknowledged here: the subscription does not see it again.
    again = await client.subscribe("jobs", "workers")
    with pytest.raises(TimeoutError):
        await again.receive(timeout=0.5)


async def test_delayed_messages_are_held_until_due_and_never_skipped(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("later")
    soon = await producer.send(b"soon", deliver_after=dt.timedelta(milliseconds=300))
    late = await producer.send(b"late", deliver_at=now_ms() + 1500)
    await producer.send(b"now")
    consumer = await client.subscribe("later", "sub", "earliest")
    first = await consumer.receive(timeout=30)
    assert first.data == b"now" and first.deliver_at_ms == 0  # not held back by the others
    consumer.acknowledge(first)
    held = await consumer.receive(timeout=30)
    assert held.data == b"soon" and held.message_id == soon
    assert now_ms() >= held.deliver_at_ms  # held until due
    consumer.acknowledge(held)
    await consumer.close()  # before "late" is due: the cursor must not pass it

    again = await client.subscribe("later", "sub")
    message = await again.receive(timeout=30)
    assert message.data == b"late" and message.message_id == late
    assert now_ms() >= message.deliver_at_ms
    # Readers are not subscriptions: they see every message at once, in order.
    reader = await client.create_reader("later")
    assert [(await reader.read_next(timeout=30)).data for _ in range(3)] == [
        b"soon",
        b"late",
        b"now",
    ]
    with pytest.raises(BadRequestError, match="not both"):
        await producer.send(b"x", deliver_after=1, deliver_at=now_ms())
    batch_1 = await client.create_producer("later-format-1", batch_format=1)
    with pytest.raises(BadRequestError, match="batch_format 2"):
        await batch_1.send(b"x", deliver_after=10)


async def test_batch_receive_and_an_asyncio_message_listener(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("many", batching_max_messages=3)
    for i in range(10):
        await producer.send_async(b"%d" % i)
    await producer.flush()
    consumer = await client.subscribe("many", "batch", "earliest")
    first = await consumer.batch_receive(max_num_messages=4, timeout_ms=5000)
    assert [m.data for m in first] == [b"0", b"1", b"2", b"3"]
    rest = await consumer.batch_receive(max_num_messages=100, timeout_ms=300)
    assert [m.data for m in rest] == [b"%d" % i for i in range(4, 10)]  # the time ran out
    assert await consumer.batch_receive(timeout_ms=0) == []

    heard: list[bytes] = []
    done = asyncio.Event()

    async def listener(consumer, message):
        heard.append(message.data)
        consumer.acknowledge(message)
        if len(heard) == 10:
            done.set()

    await client.subscribe("many", "listened", "earliest", message_listener=listener)
    await asyncio.wait_for(done.wait(), 30)
    assert heard == [b"%d" % i for i in range(10)]


def test_a_blocking_message_listener_runs_in_its_own_thread(cluster):
    cluster.start_bookies(3)
    with streamlib.connect(cluster.metadata_uri) as client:
        with client.create_producer("threads") as producer:
            for i in range(5):
                producer.send(b"%d" % i)
        heard: list[tuple[bytes, str]] = []
        done = threading.Event()

        def listener(consumer, message):
            heard.append((message.data, threading.current_thread().name))
            consumer.acknowledge(message)  # a blocking call: fine in its thread
            if len(heard) == 5:
                done.set()

        consumer = client.subscribe("threads", "sub", "earliest", message_listener=listener)
        assert done.wait(30)
        consumer.close()  # ends the listener's thread
        assert [d for d, _ in heard] == [b"%d" % i for i in range(5)]
        assert {t for _, t in heard} == {"streamlib-listener-sub"}
        assert not consumer._listener.is_alive()


async def test_readers_start_inclusively_and_seek_by_time(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("seek", batching_max_messages=2)
    ids = []
    for i in range(6):
        ids.append(await producer.send(b"%d" % i))
    # Pulsar's rule: a reader starts after its start message unless inclusive.
    after = await client.create_reader("seek", ids[2])
    assert (await after.read_next(timeout=30)).data == b"3"
    inclusive = await client.create_reader("seek", ids[2], start_message_id_inclusive=True)
    assert (await inclusive.read_next(timeout=30)).data == b"2"
    last = await client.create_reader("seek", "latest", start_message_id_inclusive=True)
    assert (await last.read_next(timeout=30)).data == b"5"  # the last message, first
    await inclusive.seek(ids[4])  # a seek follows the reader's start rule
    assert (await inclusive.read_next(timeout=30)).data == b"4"
    await after.seek(ids[4])
    assert (await after.read_next(timeout=30)).data == b"5"

    marked = now_ms()
    while now_ms() == marked:  # (publish times are in ms: the next one is later)
        await asyncio.sleep(0.001)
    await producer.send(b"after the mark")
    await after.seek(marked + 1)  # by time: the first message published then or later
    assert (await after.read_next(timeout=30)).data == b"after the mark"
    # A consumer's seek includes the message (Pulsar's rule too).
    consumer = await client.subscribe("seek", "sub", "earliest")
    await consumer.seek(ids[1])
    assert (await consumer.receive(timeout=30)).data == b"1"


async def test_sequence_ids_count_on_across_producers(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    first = await client.create_producer("seq", batching_max_messages=10)
    assert first.last_sequence_id == -1  # a new stream
    for i in range(3):
        await first.send_async(b"%d" % i)  # 0, 1, 2: one batch, consecutive
    await first.send_async(b"chosen", sequence_id=10)  # given: the next goes on from it
    await first.send_async(b"next")  # 11
    await first.flush()
    await first.close()
    second = await client.create_producer("seq")  # goes on after the stream's last: 12
    assert second.last_sequence_id == 11
    await second.send(b"twelve")
    await second.close()
    third = await client.create_producer("seq", initial_sequence_id=99)
    await third.send(b"hundred")
    reader = await client.create_reader("seq")
    ids = [(await reader.read_next(timeout=30)).sequence_id for _ in range(7)]
    assert ids == [0, 1, 2, 10, 11, 12, 100]
    with pytest.raises(BadRequestError, match="sequence_id must be an int >= 0"):
        await third.send(b"x", sequence_id=-5)


def test_one_subscription_on_several_streams(cluster):
    cluster.start_bookies(3)
    with streamlib.connect(cluster.metadata_uri) as client:
        for stream in ("eu", "us"):
            with client.create_producer(stream) as producer:
                for i in range(3):
                    producer.send(b"%s-%d" % (stream.encode(), i))
        consumer = client.subscribe(["eu", "us"], "all", "earliest")
        got = [consumer.receive(timeout=30) for _ in range(6)]
        for stream in ("eu", "us"):  # each stream in its order, both interleaved
            mine = [m.data for m in got if m.stream == stream]
            assert mine == [b"%s-%d" % (stream.encode(), i) for i in range(3)]
        for message in got[:4]:
            consumer.acknowledge(message)
        with pytest.raises(TimeoutError):
            consumer.receive(timeout=0.3)
        consumer.close()
        # Each stream kept its own cursor: what was not acknowledged comes again.
        again = client.subscribe(["eu", "us"], "all")
        rest = sorted(again.receive(timeout=30).data for _ in range(2))
        assert rest == sorted(m.data for m in got[4:])
        with pytest.raises(BadRequestError, match="distinct streams"):
            client.subscribe(["eu", "eu"], "x")


def test_a_partitioned_stream_routes_by_key_and_is_consumed_whole(cluster):
    cluster.start_bookies(3)
    with streamlib.connect(cluster.metadata_uri) as client:
        client.streams.create("parts", 3, 2, 2, partitions=3)
        with client.create_producer("parts") as producer:
            ids = {}
            for i in range(30):
                key = f"customer-{i % 5}"
                ids.setdefault(key, []).append(producer.send(b"%d" % i, key=key))
            for i in range(6):
                producer.send(b"no key %d" % i)
        # One key, one partition (its order kept); the keyless spread over several.
        for key_ids in ids.values():
            assert len({m.ledger_id for m in key_ids}) == 1
        consumer = client.subscribe("parts", "all", "earliest")
        got = [consumer.receive(timeout=30) for _ in range(36)]
        streams = {m.stream for m in got}
        assert streams <= {f"parts-partition-{i}" for i in range(3)} and len(streams) > 1
        for key in ids:
            mine = [int(m.data) for m in got if m.key == key]
            assert mine == sorted(mine) and len(mine) == 6
        with pytest.raises(BadRequestError, match="is partitioned"):
            client.create_reader("parts")
        client.streams.delete("parts")
        assert not [s for s in client.streams.list() if s.startswith("parts")]


async def test_a_takeover_of_an_unbounded_stream_goes_on_with_the_sequence_ids(cluster):
    # In term mode a takeover writes a TRUNCATE no-op: the stream's last entry is no
    # message, and the next producer must look past it (it crashed on it once).
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("terms", 3, 2, 2, mode="unbounded")
    first = await client.create_producer("terms")
    await first.send(b"a")
    await first.send(b"b")
    second = await client.create_producer("terms")  # fences the first, writes a no-op
    assert second.last_sequence_id == 1
    await second.send(b"c")
    third = await client.create_producer("terms")
    assert third.last_sequence_id == 2
    # Takeovers with nothing sent between them: the entries at the end are no-ops only.
    # (Releasing the stream publishes the LAC to every bookie: a no-op is confirmed.)
    for _ in range(3):
        quiet = await client.create_producer("terms")
        assert quiet.last_sequence_id == 2
        await quiet.close()
    reader = await client.create_reader("terms", "latest", start_message_id_inclusive=True)
    assert (await reader.read_next(timeout=30)).data == b"c"
