"""Messages over the entry limit go in pieces (format 4) that consumers and readers put
together; a message whose producer died mid-way is never seen, and never holds a cursor
back."""

from __future__ import annotations

import pytest

import streamlib
from streamlib.errors import TooLargeError
from streamlib.stream.batch import BatchBuilder, MessageDecodeError
from streamlib.stream.producer import _Batch
from streamlib.stream.writer import now_ms

pytestmark = pytest.mark.timeout(180)

BIG = bytes(range(256)) * (10 * 1024 * 1024 // 256)  # 10 MiB


def test_a_10_mib_message_goes_in_pieces_and_comes_whole(cluster):
    cluster.start_bookies(3)
    with streamlib.connect(cluster.metadata_uri) as client:
        with (
            client.create_producer("big") as plain,
            pytest.raises(TooLargeError, match="chunking_enabled=True"),
        ):
            plain.send(BIG)
        with client.create_producer("big", chunking_enabled=True) as producer:
            before = producer.send(b"before")
            big_id = producer.send(BIG, key="k", properties={"p": "1"})
            after = producer.send(b"after")
        assert (before.ledger_id, before.entry_id + 3) == (big_id.ledger_id, big_id.entry_id)
        with client.subscribe("big", "sub", "earliest") as consumer:
            got = [consumer.receive(timeout=60) for _ in range(3)]
            assert [m.message_id for m in got] == [before, big_id, after]
            assert got[1].data == BIG and got[1].key == "k" and got[1].properties == {"p": "1"}
            for message in got:
                consumer.acknowledge(message)
        with (
            client.subscribe("big", "sub") as again,  # every piece was acknowledged
            pytest.raises(TimeoutError),
        ):
            again.receive(timeout=0.5)
        with client.create_reader("big") as reader:
            assert [reader.read_next(timeout=60).data for _ in range(3)] == [
                b"before",
                BIG,
                b"after",
            ]
        with client.create_reader("big", before) as reader:  # starting before the pieces
            assert reader.read_next(timeout=60).data == BIG


async def test_the_pieces_of_a_message_that_never_finished_are_never_seen(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("torn", chunking_enabled=True)
    await producer.send(b"first")
    # A producer that dies after two of three pieces: its last piece never comes.
    for index in range(2):
        piece = BatchBuilder()
        piece.add(b"x" * 100, now_ms())
        producer._append(
            _Batch(piece, []), lambda p=piece, i=index: p.encode_chunk("torn-uuid", i, 3, 300)
        )
    last = await producer.send(b"last")
    consumer = await client.subscribe("torn", "sub", "earliest")
    got = [await consumer.receive(timeout=30) for _ in range(2)]
    assert [m.data for m in got] == [b"first", b"last"]
    for message in got:
        consumer.acknowledge(message)
    assert consumer.mark_delete_position == last  # the torn pieces hold nothing back
    reader = await client.create_reader("torn")
    assert [(await reader.read_next(timeout=30)).data for _ in range(2)] == [b"first", b"last"]


def test_spark_refuses_pieces_clearly():
    from streamlib.spark.rows import entry_columns

    piece = BatchBuilder()
    piece.add(b"x", 1)
    with pytest.raises(MessageDecodeError, match="piece of a chunked message"):
        entry_columns(1, 2, piece.encode_chunk("u", 0, 2, 2), "ledger 1 entry 2")
