"""One client, two transports: what the guide documents, run the same way in direct mode
(bookies and the metadata store) and through the stream service (a broker), with the
same outcome. Each test takes `mode` and the `client` it makes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.request
from typing import Any

import pulsar
import pytest

import streamlib
from streamlib import errors
from streamlib.schema import JsonSchema
from streamlib.stream.positions import EARLIEST, LATEST, MessageId

pytestmark = pytest.mark.timeout(180)


@dataclasses.dataclass
class Record:
    n: int


async def received(consumer: Any, count: int) -> list[Any]:
    messages = [await consumer.receive(timeout=30) for _ in range(count)]
    for message in messages:
        consumer.acknowledge(message)
    return messages


async def read_all(client: Any, stream: str) -> list[Any]:
    reader = await client.create_reader(stream, EARLIEST)
    found = []
    while await reader.has_message_available():
        found.append(await reader.read_next(timeout=30))
    await reader.close()
    return found


@pytest.mark.parametrize("codec", ["lz4", "zlib", "zstd", "snappy", pulsar.CompressionType.SNAPPY])
async def test_compressed_messages_arrive_as_sent(client: Any, codec: Any) -> None:
    producer = await client.create_producer("squeezed", compression_type=codec)
    sent = [b"%d " % i + b"x" * 2000 for i in range(50)]
    for data in sent:
        await producer.send_async(data)
    await producer.flush()
    consumer = await client.subscribe("squeezed", "s", initial_position="earliest")
    assert [m.data for m in await received(consumer, 50)] == sent


async def test_a_message_over_the_entry_limit_goes_in_chunks_and_arrives_whole(client: Any) -> None:
    """Through the service a chunking producer must be the stream's only one (readers put
    the pieces of a message together only when nothing comes between them)."""
    if not hasattr(client, "ledgers"):
        with pytest.raises(errors.BadRequestError, match="only one"):
            await client.create_producer("big", chunking_enabled=True)
    producer = await client.create_producer(
        "big", chunking_enabled=True, access_mode="exclusive_with_fencing"
    )
    large = bytes(range(256)) * (6 * 4096 + 7)  # about 6 MiB: two chunks
    small = await producer.send(b"after")
    del small
    big_id = await producer.send(large, key="k", properties={"p": "1"})
    await producer.send(b"last")
    consumer = await client.subscribe("big", "s", initial_position="earliest")
    first, whole, last = await received(consumer, 3)
    assert (first.data, last.data) == (b"after", b"last")
    assert whole.data == large and whole.key == "k" and whole.properties == {"p": "1"}
    assert whole.message_id == big_id
    with pytest.raises(errors.TooLargeError):
        unchunked = await client.create_producer("big-refused")
        await unchunked.send(large)


async def test_a_resend_of_a_stored_sequence_id_is_acknowledged_with_the_originals_id_once(
    client: Any,
) -> None:
    """Pulsar's deduplication, the same in both modes: a send whose sequence id was sent
    before is acknowledged with where the original went, stores nothing and is no error
    -- by the producer that sent it, and by the next producer of the stream."""
    producer = await client.create_producer("once", producer_name="p")
    ids = [await producer.send(b"%d" % i, sequence_id=i) for i in range(5)]
    assert await producer.send(b"2 again", sequence_id=2) == ids[2]
    await producer.close()
    again = await client.create_producer("once", producer_name="p")
    assert again.last_sequence_id == 4
    assert await again.send(b"4 again", sequence_id=4) == ids[4]
    five = await again.send(b"5")
    await again.close()
    stored = await read_all(client, "once")
    assert [m.data for m in stored] == [b"0", b"1", b"2", b"3", b"4", b"5"]
    assert [m.message_id for m in stored] == [*ids, five]


async def test_another_producers_sequence_ids_are_not_taken_for_resends(client: Any) -> None:
    """Deduplication is per producer name, in both modes: a producer of another name
    sending sequence id 0 after the stream's last writer stored 0..2 stores its message."""
    first = await client.create_producer("names", producer_name="a")
    for i in range(3):
        await first.send(b"a%d" % i, sequence_id=i)
    await first.close()
    other = await client.create_producer("names", producer_name="b")
    assert other.last_sequence_id == -1
    stored = await other.send(b"b0", sequence_id=0)
    await other.close()
    assert [m.data for m in await read_all(client, "names")] == [b"a0", b"a1", b"a2", b"b0"]
    assert (await read_all(client, "names"))[-1].message_id == stored


async def test_a_reader_made_at_latest_reads_everything_published_after_it_was_made(
    client: Any,
) -> None:
    producer = await client.create_producer("fresh")
    await producer.send(b"before")
    reader = await client.create_reader("fresh", LATEST)
    for i in range(5):
        await producer.send(b"%d" % i)
    assert [(await reader.read_next(timeout=30)).data for _ in range(5)] == [
        b"%d" % i for i in range(5)
    ]
    assert not await reader.has_message_available()


async def test_a_reader_seeks_by_id_and_by_time_and_knows_when_more_is_there(client: Any) -> None:
    producer = await client.create_producer("seekable")
    ids = []
    for i in range(6):
        ids.append(await producer.send(b"%d" % i))
        if i == 2:
            await asyncio.sleep(0.01)  # (publish times apart: a time to seek to)
            middle_ms = int(time.time() * 1000)
            await asyncio.sleep(0.01)
    reader = await client.create_reader("seekable", EARLIEST)
    assert await reader.has_message_available()
    await reader.seek(ids[3])  # after that message (a reader's rule)
    assert (await reader.read_next(timeout=30)).data == b"4"
    await reader.seek(middle_ms)
    assert (await reader.read_next(timeout=30)).data == b"3"
    await reader.seek(pulsar.MessageId.earliest)
    assert [(await reader.read_next(timeout=30)).data for _ in range(6)] == [
        b"%d" % i for i in range(6)
    ]
    assert not await reader.has_message_available()
    await reader.seek(int(time.time() * 1000) + 60_000)  # (nothing published that late)
    assert not await reader.has_message_available()
    await reader.seek(middle_ms)
    assert await reader.has_message_available()
    assert (await reader.read_next(timeout=30)).data == b"3"
    inclusive = await client.create_reader("seekable", ids[1], start_message_id_inclusive=True)
    assert await inclusive.has_message_available()
    assert (await inclusive.read_next(timeout=30)).data == b"1"
    last = await client.create_reader("seekable", LATEST, start_message_id_inclusive=True)
    assert await last.has_message_available()
    assert (await last.read_next(timeout=30)).data == b"5"
    assert not await last.has_message_available()


async def test_subscribing_to_a_stream_that_does_not_exist_raises(client: Any) -> None:
    with pytest.raises(errors.NoSuchStreamError):
        await client.subscribe("nowhere", "s")
    with pytest.raises(errors.NoSuchStreamError):
        await client.create_reader("nowhere", EARLIEST)
    assert "nowhere" not in await client.streams.list()


async def test_streams_are_administered_alike(client: Any) -> None:
    await client.streams.create("orders", partitions=2)
    assert await client.streams.partitions("orders") == 2
    assert {"orders-partition-0", "orders-partition-1"} <= set(await client.streams.list())
    producer = await client.create_producer("orders")
    for i in range(10):
        await producer.send(b"%d" % i, key=f"k{i}")
    await producer.flush()
    consumer = await client.subscribe(
        "orders", "billing", initial_position=pulsar.InitialPosition.Earliest
    )
    assert sorted(m.data for m in await received(consumer, 10)) == sorted(
        b"%d" % i for i in range(10)
    )
    await consumer.close()
    stats = await client.streams.stats("orders-partition-0")
    assert stats["name"] == "orders-partition-0" and "billing" in stats["subscriptions"]
    cursors = await client.streams.cursors("orders-partition-0")
    assert isinstance(cursors["billing"], MessageId)
    await client.streams.create("scratch")
    await client.streams.delete("scratch")
    assert "scratch" not in await client.streams.list()


async def test_stats_and_metrics_count_each_stream_once(client: Any) -> None:
    for _ in range(2):  # a producer closed and made again: its counts add up
        producer = await client.create_producer("counted")
        for i in range(3):
            await producer.send(b"%d" % i)
        await producer.close()
    assert client.stats()["producers"]["counted"]["sent"] == 6
    port = client.serve_metrics(0)
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
    )
    series = [
        line for line in body.splitlines() if line.startswith("streamlib_client_messages_sent")
    ]
    assert series == ['streamlib_client_messages_sent_total{stream="counted"} 6.0']


async def test_a_listener_that_raises_gets_the_message_again_and_a_second_is_refused(
    client: Any,
) -> None:
    producer = await client.create_producer("listened")
    seen: list[tuple[bytes, int]] = []
    done = asyncio.Event()

    def listener(consumer: Any, message: Any) -> None:
        seen.append((message.data, message.redelivery_count))
        if message.redelivery_count == 0:
            raise RuntimeError("not yet")
        consumer.acknowledge(message)
        done.set()

    consumer = await client.subscribe(
        "listened", "s", message_listener=listener, negative_ack_redelivery_delay_ms=50
    )
    await producer.send(b"once")
    await asyncio.wait_for(done.wait(), 30)
    assert seen == [(b"once", 0), (b"once", 1)]
    with pytest.raises(errors.BadRequestError):
        consumer.listen(listener)


async def test_what_is_given_back_too_often_goes_to_the_dead_letter_stream(client: Any) -> None:
    producer = await client.create_producer("poison")
    consumer = await client.subscribe(
        "poison",
        "s",
        negative_ack_redelivery_delay_ms=20,
        dead_letter_policy=streamlib.DeadLetterPolicy(max_redeliver_count=1),
    )
    await producer.send(b"bad", properties={"a": "b"})
    for expected in (0, 1):
        message = await consumer.receive(timeout=30)
        assert message.redelivery_count == expected
        consumer.negative_acknowledge(message)
    with pytest.raises(errors.TimeoutError):  # (its third coming goes to the dead letters)
        await consumer.receive(timeout=2)
    dead = await client.subscribe("poison-s-DLQ", "d", initial_position="earliest")
    [letter] = await received(dead, 1)
    assert letter.data == b"bad" and letter.properties["a"] == "b"
    assert letter.properties["REAL_TOPIC"] == "poison"


async def test_an_unacknowledged_message_comes_again_after_the_ack_timeout(client: Any) -> None:
    producer = await client.create_producer("slow")
    consumer = await client.subscribe(
        "slow", "s", ack_timeout_ms=100, negative_ack_redelivery_delay_ms=20
    )
    await producer.send(b"m")
    first = await consumer.receive(timeout=30)
    again = await consumer.receive(timeout=30)
    assert (again.data, again.redelivery_count) == (first.data, first.redelivery_count + 1)
    consumer.acknowledge(again)


async def test_a_consumer_seeks_back_to_a_message(client: Any) -> None:
    producer = await client.create_producer("rewound")
    ids = [await producer.send(b"%d" % i) for i in range(4)]
    consumer = await client.subscribe("rewound", "s", initial_position="earliest")
    await received(consumer, 4)
    await consumer.seek(ids[1])
    assert [m.data for m in await received(consumer, 3)] == [b"1", b"2", b"3"]


async def test_keys_ordering_keys_event_times_schemas_and_delays_arrive(client: Any) -> None:
    producer = await client.create_producer("rich", schema=JsonSchema(Record))
    await producer.send(Record(1), key="k", ordering_key=b"o", event_time=1234, deliver_after=50)
    consumer = await client.subscribe(
        "rich", "s", initial_position="earliest", schema=JsonSchema(Record)
    )
    [message] = await received(consumer, 1)
    assert message.value() == Record(1)
    assert (message.partition_key(), message.ordering_key()) == ("k", b"o")
    assert (message.event_timestamp(), message.topic_name()) == (1234, "rich")
    assert message.publish_timestamp() > 0
