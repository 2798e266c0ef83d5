"""A program written for pulsar-client hands streamlib pulsar's own MessageIds -- its
MessageId.earliest, .latest, and ids made from ledger and entry -- to seek and to
create_reader, on real bookies."""

from __future__ import annotations

import pulsar
import pytest

from streamlib.stream.positions import LATEST

pytestmark = pytest.mark.timeout(120)


async def test_a_consumer_seeks_to_pulsars_earliest_latest_and_ids(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("seeking", batching_max_messages=1)
    ids = [await producer.send(b"%d" % i) for i in range(5)]
    consumer = await client.subscribe("seeking", "s", initial_position="earliest")
    for _ in ids:
        consumer.acknowledge(await consumer.receive(timeout=30))

    await consumer.seek(pulsar.MessageId.earliest)
    assert (await consumer.receive(timeout=30)).data == b"0"
    # One message an entry: Pulsar's id of a message not in a batch (batch index -1).
    third = pulsar.MessageId(ledger_id=ids[3].ledger_id, entry_id=ids[3].entry_id)
    await consumer.seek(third)
    assert (await consumer.receive(timeout=30)).data == b"3"
    # Latest: the next message is the next one published, none before it again.
    await consumer.seek(pulsar.MessageId.latest)
    await producer.send(b"after pulsar's latest")
    assert (await consumer.receive(timeout=30)).data == b"after pulsar's latest"
    await consumer.seek(LATEST)  # (streamlib's own LATEST the same)
    await producer.send(b"after latest")
    assert (await consumer.receive(timeout=30)).data == b"after latest"
    await consumer.close()
    await producer.close()


async def test_a_reader_starts_and_seeks_at_pulsars_ids(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("reading", batching_max_messages=1)
    ids = [await producer.send(b"%d" % i) for i in range(4)]
    await producer.close()

    reader = await client.create_reader("reading", pulsar.MessageId.earliest)
    assert (await reader.read_next(timeout=30)).data == b"0"
    second = pulsar.MessageId(ledger_id=ids[1].ledger_id, entry_id=ids[1].entry_id)
    await reader.seek(second)  # (not inclusive: after it)
    assert (await reader.read_next(timeout=30)).data == b"2"
    await reader.close()
    inclusive = await client.create_reader("reading", second, start_message_id_inclusive=True)
    assert (await inclusive.read_next(timeout=30)).data == b"1"
    await inclusive.close()
    latest = await client.create_reader("reading", pulsar.MessageId.latest)
    assert not await latest.has_message_available()
    await latest.close()
