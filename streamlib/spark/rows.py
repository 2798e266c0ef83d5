"""The rows of the `streamlib` format: the Spark schema, and a segment's messages as Arrow
record batches (what read() hands to Spark), built column by column.

Format 2 entries already hold their messages by columns (envelope.proto: the payloads
back to back with their sizes, the publish times, event times and keys/properties only
when some message has them), so a record batch is made of whole columns: the value
column is the entries' payload bytes joined once with offsets summed from the sizes,
the times and positions are numpy arrays. Nothing is made per message unless a message
carries a key or properties (they are protobuf messages) or the entry is in format 1.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

import numpy as np
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
from streamlib.spark.plan import Segment, view_entry
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import (
    CHUNK_FORMAT,
    COMPRESSED_FORMAT,
    KeyAndProperties,
    MessageDecodeError,
    decode_batch,
    uncompressed,
)

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

PROPERTIES = pa.map_(pa.string(), pa.field("value", pa.string(), False))
TIMESTAMP = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), False),
        pa.field("ledger_id", pa.int64(), False),
        pa.field("entry_id", pa.int64(), False),
        pa.field("batch_index", pa.int32(), False),
        pa.field("key", pa.string(), True),
        pa.field("value", pa.binary(), False),
        pa.field("properties", PROPERTIES, False),
        pa.field("publish_time", TIMESTAMP, False),
        pa.field("event_time", TIMESTAMP, True),
    ]
)

# A record batch ends after the entry that takes it past either bound (whole entries:
# an entry is at most 5 MiB, so the value column's int32 offsets never overflow).
ROWS_PER_BATCH = 65536
BYTES_PER_BATCH = 8 << 20


@dataclass(frozen=True, slots=True)
class EntryColumns:
    """Messages lo..hi-1 of one entry, by column (the arrays cover the whole entry)."""

    ledger_id: int
    entry_id: int
    payloads: bytes  # back to back
    sizes: np.ndarray  # int64, one per message
    publish_ms: np.ndarray  # int64
    event_ms: np.ndarray | None  # int64, 0 = not set; None: no message has one
    metadata: Sequence[KeyAndProperties] | None  # None: no message has a key or properties
    lo: int
    hi: int


def _a_piece(where: str) -> MessageDecodeError:
    return MessageDecodeError(
        f"{where} is a piece of a chunked message: the Spark source does not put "
        f"chunked messages together (read them with a Reader or a Consumer)"
    )


def entry_columns(
    ledger_id: int, entry_id: int, payload: bytes, where: str, lo: int = 0, hi: int | None = None
) -> EntryColumns:
    """The columns of one entry, keeping messages lo..hi-1 (clipped to the entry)."""
    try:
        batch: envelope.Batch | None = envelope.Batch.FromString(payload)
    except DecodeError:
        batch = None  # decode_batch below says so
    if batch is not None and batch.format_version == CHUNK_FORMAT:
        raise _a_piece(where)
    if batch is not None and batch.format_version == COMPRESSED_FORMAT:
        batch = uncompressed(payload, batch, where)  # (MessageDecodeError if damaged)
    if batch is not None and batch.format_version == 2 and not batch.messages:
        sizes = np.array(batch.payload_sizes, dtype=np.int64)
        count = len(sizes)
        payloads = batch.payloads
        publish = np.array(batch.publish_time_ms, dtype=np.int64)
        events = np.array(batch.event_time_ms, dtype=np.int64) if batch.event_time_ms else None
        metadata = batch.metadata if batch.metadata else None
        if (
            count
            and int(sizes.sum()) == len(payloads)
            and len(publish) == count
            and (events is None or len(events) == count)
            and (metadata is None or len(metadata) == count)
        ):
            end = count if hi is None else min(hi, count)
            return EntryColumns(
                ledger_id, entry_id, payloads, sizes, publish, events, metadata, lo, end
            )
    # Anything else (format 1, no messages, a malformed batch): decode_batch decides,
    # and raises MessageDecodeError naming `where` for what is not a message batch.
    decoded = decode_batch(payload, where)
    if decoded.chunk is not None:  # (a Pulsar producer's piece: not a Batch, so here)
        raise _a_piece(where)
    sizes = np.array([len(p) for p in decoded.payloads], dtype=np.int64)
    events = None if decoded.event_times is None else np.array(decoded.event_times, np.int64)
    end = len(sizes) if hi is None else min(hi, len(sizes))
    return EntryColumns(
        ledger_id,
        entry_id,
        b"".join(decoded.payloads),
        sizes,
        np.array(decoded.publish_times, dtype=np.int64),
        events,
        decoded.metadata,
        lo,
        end,
    )


def record_batch(stream: str, pieces: Sequence[EntryColumns]) -> pa.RecordBatch:
    """One record batch of the pieces' messages, in order."""
    counts = np.array([p.hi - p.lo for p in pieces], dtype=np.int64)
    rows = int(counts.sum())
    sizes = np.concatenate([p.sizes[p.lo : p.hi] for p in pieces])
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    value = pa.Array.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(_payloads(pieces))]
    )
    # The first index of each piece, less the row where the piece starts.
    starts = np.array([p.lo for p in pieces], dtype=np.int64) - (np.cumsum(counts) - counts)
    index = (np.arange(rows, dtype=np.int64) + np.repeat(starts, counts)).astype(np.int32)
    publish = np.concatenate([p.publish_ms[p.lo : p.hi] for p in pieces]) * 1000
    if all(p.event_ms is None for p in pieces):
        event = pa.nulls(rows, TIMESTAMP)
    else:
        event_ms = np.concatenate(
            [
                np.zeros(p.hi - p.lo, np.int64) if p.event_ms is None else p.event_ms[p.lo : p.hi]
                for p in pieces
            ]
        )
        event = pa.array(event_ms * 1000, TIMESTAMP, mask=event_ms == 0)  # 0: none set
    key, properties = _keys_and_properties(pieces, rows)
    columns = [
        pa.repeat(pa.scalar(stream, pa.string()), rows),
        pa.array(np.repeat(np.array([p.ledger_id for p in pieces], np.int64), counts)),
        pa.array(np.repeat(np.array([p.entry_id for p in pieces], np.int64), counts)),
        pa.array(index),
        key,
        value,
        properties,
        pa.array(publish, TIMESTAMP),
        event,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _payloads(pieces: Sequence[EntryColumns]) -> bytes:
    parts = []
    for p in pieces:
        if p.lo == 0 and p.hi == len(p.sizes):
            parts.append(p.payloads)
        else:
            start = int(p.sizes[: p.lo].sum())
            parts.append(p.payloads[start : start + int(p.sizes[p.lo : p.hi].sum())])
    return b"".join(parts)


def _keys_and_properties(pieces: Sequence[EntryColumns], rows: int) -> tuple[pa.Array, pa.Array]:
    if all(p.metadata is None for p in pieces):
        no_entries = pa.array([], pa.string())
        empty = pa.MapArray.from_arrays(
            pa.array(np.zeros(rows + 1, np.int32)), no_entries, no_entries, type=PROPERTIES
        )
        return pa.nulls(rows, pa.string()), empty
    # Some message has a key or properties: they are protobuf messages, read one by one.
    keys: list[str | None] = []
    offsets = [0]
    names: list[str] = []
    values: list[str] = []
    for p in pieces:
        if p.metadata is None:
            keys.extend([None] * (p.hi - p.lo))
            offsets.extend([offsets[-1]] * (p.hi - p.lo))
            continue
        for i in range(p.lo, p.hi):
            mine = p.metadata[i]
            keys.append(mine.key if mine.HasField("key") else None)
            for name, value in mine.properties.items():
                names.append(name)
                values.append(value)
            offsets.append(len(names))
    properties = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(names, pa.string()),
        pa.array(values, pa.string()),
        type=PROPERTIES,
    )
    return pa.array(keys, pa.string()), properties


def _in_segment(segment: Segment, ledger_id: int, data: EntryData) -> EntryColumns | None:
    """The entry's messages inside the segment's (after, until], by column (None: none).
    An entry of a compacted view holds messages of stream entry (its ledger id, its entry
    id) from its first index on: they keep the ids they have in the stream."""
    entry_id, first, payload = data.entry_id, 0, data.payload
    if segment.view:
        in_view = f"stream {segment.stream!r} compacted view ledger {ledger_id} entry {entry_id}"
        ledger_id, entry_id, first, payload = view_entry(payload, in_view)
    after, until = segment.after, segment.until
    here = (ledger_id, entry_id)
    if here < (after.ledger_id, after.entry_id) or here > (until.ledger_id, until.entry_id):
        return None
    lo = after.batch_index + 1 if here == (after.ledger_id, after.entry_id) else 0
    hi = until.batch_index + 1 if here == (until.ledger_id, until.entry_id) else None
    where = f"stream {segment.stream!r} ledger {ledger_id} entry {entry_id}"
    if segment.view:
        where += f" (compacted view ledger {segment.ranges[0].ledger_id} entry {data.entry_id})"
    columns = entry_columns(ledger_id, entry_id, payload, where, max(lo, first), hi)
    return columns if columns.lo < columns.hi else None


async def segment_batches(
    segment: Segment, entries: AsyncIterator[tuple[int, list[EntryData]]]
) -> AsyncGenerator[pa.RecordBatch, None]:
    """Record batches of the messages of `entries` (ledger id, entries read) inside the
    segment's (after, until]: the hot path of every read."""
    pieces: list[EntryColumns] = []
    rows = size = 0
    async for ledger_id, read in entries:
        for data in read:
            columns = _in_segment(segment, ledger_id, data)
            if columns is None:
                continue
            pieces.append(columns)
            rows += columns.hi - columns.lo
            size += len(columns.payloads)
            if rows >= ROWS_PER_BATCH or size >= BYTES_PER_BATCH:
                yield record_batch(segment.stream, pieces)
                pieces, rows, size = [], 0, 0
    if pieces:
        yield record_batch(segment.stream, pieces)
