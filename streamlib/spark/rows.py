"""The rows of the `streamlib` format: the Spark schema, and a segment's messages as Arrow
record batches (what read() hands to Spark: one conversion per column, not per row)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from google.protobuf.message import DecodeError
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
from streamlib.stream import envelope_pb2
from streamlib.stream.positions import MessageId
from streamlib.stream.reader import MessageDecodeError

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
    built straight from the envelopes: the hot path of every read (no Message objects)."""
    columns = _Columns()
    (stream, ledger, entry, index, key, value, properties, publish, event) = columns.values
    rows = 0
    for data in entries:
        try:
            batch = envelope_pb2.Batch.FromString(data.payload)
        except DecodeError as error:
            raise MessageDecodeError(
                f"stream {segment.stream!r} ledger {segment.ledger_id} entry {data.entry_id} "
                "is not a message batch"
            ) from error
        for i, envelope in enumerate(batch.messages):
            position = MessageId(segment.ledger_id, data.entry_id, i)
            if not segment.after < position <= segment.until:
                continue
            stream.append(segment.stream)
            ledger.append(segment.ledger_id)
            entry.append(data.entry_id)
            index.append(i)
            key.append(envelope.key if envelope.HasField("key") else None)
            value.append(envelope.payload)
            properties.append(list(envelope.properties.items()))
            publish.append(envelope.publish_time_ms * 1000)
            event.append(envelope.event_time_ms * 1000 or None)  # 0: the producer set none
            rows += 1
            if rows == ROWS_PER_BATCH:
                yield columns.batch()
                (stream, ledger, entry, index, key, value, properties, publish, event) = (
                    columns.values
                )
                rows = 0
    if rows:
        yield columns.batch()
