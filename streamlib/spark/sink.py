"""The `streamlib` sink: df.write and writeStream publish rows to one stream.

A Producer takes over its stream (it fences the previous writer), so tasks cannot
publish side by side: each task hands its rows to the driver in its commit message and
the driver publishes the whole batch through one Producer. That keeps the order of
the rows (partition by partition) and bounds a batch by the driver's memory.

Delivery: df.write is at-least-once (a retried job publishes again). writeStream is
exactly-once for micro-batches that replay the same rows in the same order (a
streamlib source with stateless transformations does): every message carries
`spark.batch` = "<queryId>:<batchId>:<digest of the batch's rows>" and `spark.seq` =
its index in the batch. Taking over the stream makes its tail final, so before
publishing the driver reads the last message: if it belongs to this batch, the batch
(or its first seq+1 messages) is already there, and only the rest is published.
A replay whose rows differ gets a different digest and is published again
(at-least-once).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from streamlib.client import Client
from streamlib.protocol.errors import BadRequestError
from streamlib.spark.plan import end_position
from streamlib.stream.positions import EARLIEST
from streamlib.stream.reader import decode_entry
from streamlib.stream.writer import STREAM_PASSWORD

BATCH_PROPERTY = "spark.batch"
SEQ_PROPERTY = "spark.seq"


class UnsupportedSaveModeError(BadRequestError):
    """Streams are append-only: mode("overwrite") cannot be honoured."""


class MissingValueColumnError(BadRequestError):
    """The DataFrame written has no `value` column (binary or string)."""


# One message to publish: (value, key, properties, event time ms or None).
Record = tuple[bytes, str | None, dict[str, str], int | None]


@dataclass
class Collected(WriterCommitMessage):
    records: list[Record]


class SinkOptions:
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise UnsupportedSaveModeError(
                "a stream is append-only: use mode('append') to publish to it"
            )
        self.metadata = options.get("metadata") or ""
        if not self.metadata:
            raise BadRequestError("option 'metadata' is required: the metadata store URI")
        self.stream = (options.get("stream") or "").strip()
        if not self.stream or "," in self.stream:
            raise BadRequestError("option 'stream' is required: the one stream to publish to")
        self.query_id = options.get("queryId") or ""
        fields = {f.name: f.dataType for f in schema.fields}
        if not isinstance(fields.get("value"), BinaryType | StringType):
            raise MissingValueColumnError(
                f"the rows written need a binary or string 'value' column; columns: {sorted(fields)}"
            )


def _record(row: Row) -> Record:
    fields = row.asDict()
    value = fields["value"]
    if value is None:
        raise BadRequestError("a row to publish has a null 'value'")
    data = value.encode() if isinstance(value, str) else bytes(value)
    key = fields.get("key")
    properties = {str(k): str(v) for k, v in (fields.get("properties") or {}).items()}
    event_time = fields.get("event_time")
    event_ms = int(event_time.timestamp() * 1000) if event_time is not None else None
    return data, (str(key) if key is not None else None), properties, event_ms


def _collect(rows: Iterator[Row]) -> Collected:
    return Collected([_record(row) for row in rows])


def _records(messages: Sequence[WriterCommitMessage | None]) -> list[Record]:
    return [r for m in messages if isinstance(m, Collected) for r in m.records]


def batch_digest(records: Sequence[Record]) -> str:
    digest = hashlib.sha256()
    for value, key, properties, event_ms in records:
        for part in (value, (key or "").encode(), repr(sorted(properties.items())).encode()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        digest.update(str(event_ms).encode())
    return digest.hexdigest()[:32]


async def _already_published(client: Client, stream: str, marker: str) -> int:
    """How many messages of the batch `marker` end the stream (0 if its last message
    belongs to another batch)."""
    last = await end_position(client, stream)
    if last == EARLIEST:
        return 0
    handle = await client.ledgers.open(last.ledger_id, password=STREAM_PASSWORD, recover=False)
    try:
        [entry] = await handle.read_entries(last.entry_id, last.entry_id)
    finally:
        await handle.close()
    messages = decode_entry(stream, last.ledger_id, last.entry_id, entry.payload, EARLIEST)
    properties = messages[-1].properties if messages else {}
    if properties.get(BATCH_PROPERTY) != marker:
        return 0
    return int(properties[SEQ_PROPERTY]) + 1


async def publish(
    client: Client, stream: str, records: Sequence[Record], marker: str | None = None
) -> int:
    """Publish records in order; with a marker, skip those a previous attempt published.
    Returns how many were published now."""
    if not records:
        return 0
    producer = await client.create_producer(stream)
    try:
        # The producer recovered the stream's last ledgers: its tail is final now.
        done = await _already_published(client, stream, marker) if marker else 0
        futures = []
        for seq in range(done, len(records)):
            value, key, properties, event_ms = records[seq]
            if marker:
                properties = {**properties, BATCH_PROPERTY: marker, SEQ_PROPERTY: str(seq)}
            futures.append(await producer.send_async(value, key, properties, event_ms))
        await producer.flush()
        await asyncio.gather(*futures)
        return len(futures)
    finally:
        await producer.close()


def _publish(options: SinkOptions, records: list[Record], marker: str | None) -> int:
    async def main() -> int:
        client = await Client.connect(options.metadata)
        try:
            return await publish(client, options.stream, records, marker)
        finally:
            await client.close()

    return asyncio.run(main())


class StreamlibWriter(DataSourceWriter):
    """df.write.format("streamlib"): at-least-once."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.options = SinkOptions(options, schema, overwrite)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _collect(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _publish(self.options, _records(messages), None)


class StreamlibStreamWriter(DataSourceStreamWriter):
    """writeStream.format("streamlib"): exactly-once for deterministic micro-batches."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        # Complete/update output modes arrive as overwrite; each micro-batch is appended.
        self.options = SinkOptions(options, schema, False)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _collect(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        records = _records(messages)
        marker = f"{self.options.query_id}:{batchId}:{batch_digest(records)}"
        _publish(self.options, records, marker)
