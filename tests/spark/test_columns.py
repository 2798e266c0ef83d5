"""Reads build Arrow columns straight from the entries' columns, and a read is cut into
as many partitions as asked (the cores by default), each a contiguous run of entries."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from pyspark.sql import SparkSession

from streamlib.pulsar.entries import to_pulsar
from streamlib.spark.plan import LedgerRange, share_partitions, split
from streamlib.spark.rows import ARROW_SCHEMA, entry_columns, record_batch
from streamlib.stream.batch import (
    BatchBuilder,
    Compression,
    MessageDecodeError,
    compress,
    decode_batch,
    metadata_of,
)
from streamlib.stream.positions import EARLIEST, LATEST
from tests.spark.conftest import create_stream, publish_each

# (payload, key, properties, event time ms): keys, properties and event times on some
# messages of a batch only.
MIXED: list[tuple[bytes, str | None, dict[str, str], int]] = [
    (b"a", None, {}, 0),
    (b"", "k1", {}, 1_700_000_000_001),
    (b"ccc", None, {"p": "1", "q": ""}, 0),
    (b"dd", "", {"r": "2"}, 1_700_000_000_003),
    (b"e" * 300, None, {}, 0),
]


def _entry(messages: list[tuple[bytes, str | None, dict[str, str], int]], version: int) -> bytes:
    batch = BatchBuilder()
    for i, (data, key, properties, event) in enumerate(messages):
        batch.add(data, 1_600_000_000_000 + i, event, metadata_of(key, properties))
    return batch.encode(version)


def _rows_as_decode_batch_sees_them(payload: bytes, ledger: int, entry: int) -> list[dict]:
    decoded = decode_batch(payload, "test")
    rows = []
    for i, data in enumerate(decoded.payloads):
        meta = decoded.metadata[i] if decoded.metadata is not None else None
        event = decoded.event_times[i] if decoded.event_times is not None else 0
        rows.append(
            {
                "stream": "s",
                "ledger_id": ledger,
                "entry_id": entry,
                "batch_index": i,
                "key": meta.key if meta is not None and meta.HasField("key") else None,
                "value": data,
                "properties": sorted(meta.properties.items()) if meta is not None else [],
                "publish_time": _utc(decoded.publish_times[i]),
                "event_time": _utc(event) if event else None,
            }
        )
    return rows


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _rows(batch: Any) -> list[dict]:
    rows = batch.to_pylist()
    for row in rows:
        row["properties"] = sorted(row["properties"])
    return rows


@pytest.mark.parametrize("version", [1, 2])
def test_columns_equal_the_decoded_messages_with_metadata_on_some(version: int) -> None:
    plain = _entry([(b"x" * i, None, {}, 0) for i in range(4)], version)
    mixed = _entry(MIXED, version)
    pieces = [entry_columns(7, 0, plain, "e0"), entry_columns(7, 1, mixed, "e1")]
    batch = record_batch("s", pieces)
    assert batch.schema == ARROW_SCHEMA
    assert _rows(batch) == _rows_as_decode_batch_sees_them(
        plain, 7, 0
    ) + _rows_as_decode_batch_sees_them(mixed, 7, 1)


def test_columns_keep_only_the_messages_asked_for() -> None:
    mixed = _entry(MIXED, 2)
    batch = record_batch(
        "s", [entry_columns(3, 5, mixed, "e", lo=1, hi=4), entry_columns(3, 6, mixed, "e", lo=4)]
    )
    expected = _rows_as_decode_batch_sees_them(mixed, 3, 5)[1:4]
    expected += _rows_as_decode_batch_sees_them(mixed, 3, 6)[4:]
    assert _rows(batch) == expected


def test_entries_that_are_no_message_batch_are_refused_or_empty() -> None:
    with pytest.raises(MessageDecodeError, match="ledger 1 entry 2"):
        entry_columns(1, 2, b"\xff\xff\xff", "ledger 1 entry 2")
    assert entry_columns(1, 2, BatchBuilder().encode(), "e").hi == 0  # no messages


def test_a_pulsar_producer_s_entry_gives_the_same_columns() -> None:
    pulsar_entry = to_pulsar(compress(_entry(MIXED, 2), Compression.ZSTD), "e")
    batch = record_batch("s", [entry_columns(4, 1, pulsar_entry, "e")])
    assert _rows(batch) == _rows_as_decode_batch_sees_them(pulsar_entry, 4, 1)
    assert [row["value"] for row in _rows(batch)] == [m[0] for m in MIXED]
    piece = BatchBuilder()
    piece.add(b"part", 1)
    with pytest.raises(MessageDecodeError, match="piece of a chunked message"):
        entry_columns(4, 2, to_pulsar(piece.encode_chunk("u", 0, 2, 8), "e"), "e")


def test_a_read_is_cut_into_contiguous_segments_of_even_size() -> None:
    ranges = [LedgerRange(1, 0, 4), LedgerRange(2, 0, 2), LedgerRange(3, 10, 21)]  # 20 entries
    two = split("s", ranges, EARLIEST, LATEST, 2)
    assert [s.ranges for s in two] == [
        (LedgerRange(1, 0, 4), LedgerRange(2, 0, 2), LedgerRange(3, 10, 11)),
        (LedgerRange(3, 12, 21),),
    ]
    capped = split("s", ranges, EARLIEST, LATEST, 2, max_entries=3)
    assert len(capped) == 7 and all(sum(len(r) for r in s.ranges) <= 3 for s in capped)
    assert _entries([r for s in capped for r in s.ranges]) == _entries(ranges)  # in order
    assert len(split("s", [LedgerRange(1, 0, 0)], EARLIEST, LATEST, 4)) == 1  # never empty
    assert split("s", [], EARLIEST, LATEST, 4) == []
    assert share_partitions({"a": 90, "b": 10, "c": 0}, 4) == {"a": 4, "b": 1}


def _entries(ranges: list[LedgerRange]) -> list[tuple[int, int]]:
    return [(r.ledger_id, e) for r in ranges for e in range(r.first_entry, r.last_entry + 1)]


@pytest.mark.parametrize(("version", "compression"), [(1, "none"), (2, "none"), (2, "zstd")])
def test_spark_reads_keys_properties_and_event_times_set_on_some_messages(
    spark: SparkSession, uri: str, version: int, compression: str
) -> None:
    stream = f"mixed-{version}-{compression}"
    create_stream(uri, stream, max_entries=3)
    sent = [(data + str(r).encode(), k, p, e) for r in range(6) for data, k, p, e in MIXED]
    ids = publish_each(  # 30 messages, entries of at most 4, ledgers of 3 entries
        uri,
        stream,
        [(v, {"key": k, "properties": p, "event_time": e or None}) for v, k, p, e in sent],
        batching_max_messages=4,
        batch_format=version,
        compression_type=compression,  # (format 3 entries, where smaller: the 300-byte one)
    )
    df = (
        spark.read.format("streamlib")
        .option("metadata", uri)
        .option("stream", stream)
        .option("numPartitions", "2")
        .load()
    )
    assert df.rdd.getNumPartitions() == 2  # sized as asked, not by ledger
    rows = sorted(df.collect(), key=lambda r: (r.ledger_id, r.entry_id, r.batch_index))
    assert [(r.ledger_id, r.entry_id, r.batch_index) for r in rows] == [tuple(i) for i in ids]
    got = [
        (
            bytes(row.value),
            row.key,
            row.properties,
            int(row.event_time.timestamp() * 1000) if row.event_time is not None else 0,
        )
        for row in rows
    ]
    assert got == sent


@dataclasses.dataclass
class Item:
    name: str
    price: float


@dataclasses.dataclass
class Order:
    id: int
    items: list[Item]
    note: str | None = None
    paid: bool = False


def test_spark_gets_the_columns_of_a_json_schema_stream(spark: SparkSession, uri: str) -> None:
    from pyspark.sql.functions import col, from_json

    import streamlib
    from streamlib.errors import BadRequestError
    from streamlib.schema import JsonSchema, StringSchema
    from streamlib.spark import value_schema

    orders = [Order(1, [Item("book", 9.5)]), Order(2, [], note="gift", paid=True)]
    with streamlib.connect(uri) as client:
        with client.create_producer("typed-orders", schema=JsonSchema(Order)) as producer:
            for order in orders:
                producer.send(order)
        with client.create_producer("typed-text", schema=StringSchema()) as text:
            text.send("x")
    struct = value_schema(uri, "typed-orders")
    assert [f.name for f in struct.fields] == ["id", "items", "note", "paid"]
    df = spark.read.format("streamlib").option("metadata", uri).option("stream", "typed-orders")
    rows = (
        df.load()
        .select(from_json(col("value").cast("string"), struct).alias("v"))
        .select("v.*")
        .orderBy("id")
        .collect()
    )
    assert [r.asDict(recursive=True) for r in rows] == [
        {"id": 1, "items": [{"name": "book", "price": 9.5}], "note": None, "paid": False},
        {"id": 2, "items": [], "note": "gift", "paid": True},
    ]
    with pytest.raises(BadRequestError, match="a string schema"):
        value_schema(uri, "typed-text")
