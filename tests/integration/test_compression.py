"""Producers compress entries (lz4, zlib, zstd, snappy) and every reader -- Reader, Consumer, the
blocking API -- reads them, mixed with uncompressed entries of the same stream."""

from __future__ import annotations

import pulsar
import pytest

import streamlib
from streamlib.errors import BadRequestError
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import COMPRESSED_FORMAT, Compression

pytestmark = pytest.mark.timeout(120)


def message(i: int) -> bytes:
    return b"order %d: the same few words, again and again and again " % i * 8


@pytest.mark.parametrize("codec", ["lz4", "zlib", "zstd", "snappy"])
async def test_compressed_entries_read_back_everywhere(cluster, codec):
    cluster.start_bookies(3)
    client = await cluster.client()
    plain = await client.create_producer("mixed", batching_max_messages=10)
    first = [message(i) for i in range(30)]
    for data in first:
        await plain.send_async(data, key="k", properties={"n": "1"})
    await plain.flush()
    await plain.close()
    packed = await client.create_producer("mixed", compression_type=codec, batching_max_messages=10)
    ids = []
    second = [message(i) for i in range(30, 60)]
    for data in second:
        ids.append(await packed.send_async(data, key="k", properties={"n": "2"}))
    await packed.flush()

    # The entries on the bookies are format 3, smaller than what they hold.
    last = await ids[-1]
    handle = await client.ledgers.open(last.ledger_id, password=None, recover=False)
    (entry,) = await handle.read(last.entry_id, last.entry_id)
    batch = envelope.Batch.FromString(entry)
    assert batch.format_version == COMPRESSED_FORMAT
    assert batch.compression == Compression[codec.upper()]
    assert len(entry) < batch.uncompressed_size / 3

    reader = await client.create_reader("mixed")
    read = [await reader.read_next(timeout=30) for _ in range(60)]
    assert [m.data for m in read] == first + second
    assert [m.properties["n"] for m in read] == ["1"] * 30 + ["2"] * 30
    consumer = await client.subscribe("mixed", "sub", "earliest")
    received = [await consumer.receive(timeout=30) for _ in range(60)]
    assert [m.data for m in received] == first + second


def test_the_blocking_api_compresses_as_pulsar_spells_it(cluster):
    cluster.start_bookies(3)

    class CompressionType:  # pulsar-client's enum members carry their name
        name = "LZ4"

    with streamlib.connect(cluster.metadata_uri) as client:
        with client.create_producer("spelled", compression_type=CompressionType()) as producer:
            sent = [producer.send(message(i)) for i in range(3)]
        with client.create_reader("spelled") as reader:
            assert [reader.read_next(timeout=30).data for _ in sent] == [
                message(i) for i in range(3)
            ]
        # pulsar-client's own enum, SNAPPY included
        with client.create_producer(
            "spelled", compression_type=pulsar.CompressionType.SNAPPY
        ) as producer:
            producer.send(message(3) * 4)
        with client.create_reader("spelled", sent[-1]) as reader:
            assert reader.read_next(timeout=30).data == message(3) * 4
        with pytest.raises(BadRequestError, match="one of none, lz4, zlib, zstd, snappy"):
            client.create_producer("spelled", compression_type="brotli")
        with pytest.raises(BadRequestError, match="compression needs batch_format 2"):
            client.create_producer("spelled", compression_type="zstd", batch_format=1)
