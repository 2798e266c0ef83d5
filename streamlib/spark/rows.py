"""The rows of the `streamlib` format: the Spark schema, and a segment's messages as Arrow
record batches (what read() hands to Spark: one conversion per column, not per row)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamlib.protocol.actions import EntryData
from streamlib.spark.plan import Segment
from streamlib.stream.batch import DecodedBatch, decode_batch

SCHEMA = StructType(
    [
        StructField("stream", StringType(), False),
        StructField("ledger_id", LongType(), False),
        StructField("entry_id", LongType(), False),
        StructField("batch_index", IntegerType(), False),
        StructField("key", StringType(), True),
        StructField("value", BinaryType(), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("publish_time", TimestampType(), False),
        StructField("event_time", TimestampType(), True),
    ]
)

ARROW_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), False),
        pa.field("ledger_id", pa.int64(), False),
        pa.field("entry_id", pa.int64(), False),
        pa.field("batch_index", pa.int32(), False),
        pa.field("key", pa.string(), True),
        pa.field("value", pa.binary(), False),
        pa.field("properties", pa.map_(pa.string(), pa.field("value", pa.string(), False)), False),
        pa.field("publish_time", pa.timestamp("us", tz="UTC"), False),
        pa.field("event_time", pa.timestamp("us", tz="UTC"), True),
    ]
)

ROWS_PER_BATCH = 8192


class _Columns:
    def __init__(self) -> None:
        self.values: list[list[Any]] = [[] for _ in ARROW_SCHEMA]

    def batch(self) -> pa.RecordBatch:
        arrays = [
            pa.array(values, type=field.type)
            for values, field in zip(self.values, ARROW_SCHEMA, strict=True)
        ]
        self.values = [[] for _ in ARROW_SCHEMA]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def segment_batches(segment: Segment, entries: Sequence[EntryData]) -> Iterator[pa.RecordBatch]:
    """Record batches of the messages of `entries` inside the segment's (after, until],
    built straight from the entries' columns: the hot path of every read (no Message
    objects)."""
    columns = _Columns()
    rows = 0
    for data in entries:
        here = (segment.ledger_id, data.entry_id)
        after, until = segment.after, segment.until
        if here < (after.ledger_id, after.entry_id) or here > (until.ledger_id, until.entry_id):
            continue
        where = f"stream {segment.stream!r} ledger {segment.ledger_id} entry {data.entry_id}"
        batch = decode_batch(data.payload, where)
        # The indexes of this entry's messages inside (after, until].
        lo, hi = 0, len(batch.payloads)
        if here == (after.ledger_id, after.entry_id):
            lo = max(lo, after.batch_index + 1)
        if here == (until.ledger_id, until.entry_id):
            hi = min(hi, until.batch_index + 1)
        while lo < hi:
            take = min(hi - lo, ROWS_PER_BATCH - rows)
            _append(columns.values, segment, data.entry_id, batch, lo, lo + take)
            rows += take
            lo += take
            if rows == ROWS_PER_BATCH:
                yield columns.batch()
                rows = 0
    if rows:
        yield columns.batch()


def _append(
    values: list[list[Any]], segment: Segment, entry_id: int, batch: DecodedBatch, lo: int, hi: int
) -> None:
    """Messages lo..hi-1 of one entry, a column at a time."""
    (stream, ledger, entry, index, key, value, properties, publish, event) = values
    count = hi - lo
    stream.extend(itertools.repeat(segment.stream, count))
    ledger.extend(itertools.repeat(segment.ledger_id, count))
    entry.extend(itertools.repeat(entry_id, count))
    index.extend(range(lo, hi))
    value.extend(batch.payloads[lo:hi])
    publish.extend([t * 1000 for t in batch.publish_times[lo:hi]])
    if batch.event_times is None:
        event.extend(itertools.repeat(None, count))
    else:  # 0: the producer set none
        event.extend([t * 1000 or None for t in batch.event_times[lo:hi]])
    if batch.metadata is None:
        key.extend(itertools.repeat(None, count))
        properties.extend([] for _ in range(count))
    else:
        for i in range(lo, hi):
            mine = batch.metadata[i]
            key.append(mine.key if mine.HasField("key") else None)
            properties.append(list(mine.properties.items()))
