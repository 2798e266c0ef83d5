"""The `streamlib` sink: df.write and writeStream publish rows to one stream.

Two paths, by where the sink publishes to:

- The stream service (option "url", streamlib://HOST:PORT,...): every task publishes its
  own rows from its executor, side by side, through a producer named after the query
  (a job id for df.write) and its partition, with sequence ids from the batch id and the
  row index; the broker's deduplication drops what a retried task or a replayed
  micro-batch sends again (streamlib.spark.publish). Exactly-once, in parallel, and no
  row goes through the driver: commit messages carry counts.

- Direct mode (option "metadata", the metadata store URI): a direct-mode Producer takes
  over its stream (it fences the previous writer), so tasks cannot publish side by side,
  and direct mode has no broker to deduplicate by name. Each task hands its rows to the
  driver in its commit message and the driver publishes the whole batch through one
  Producer. That keeps the order of the rows (partition by partition) and bounds a batch
  by the driver's memory. df.write is at-least-once (a retried job publishes again).
  writeStream is exactly-once for micro-batches that replay the same rows in the same
  order (a streamlib source with stateless transformations does): every message carries
  `spark.batch` = "<queryId>:<batchId>:<digest of the batch's rows>" and `spark.seq` =
  its index in the batch. Taking over the stream makes its tail final, so before
  publishing the driver reads the last message: if it belongs to this batch, the batch
  (or its first seq+1 messages) is already there, and only the rest is published. A
  replay whose rows differ gets a different digest and is published again
  (at-least-once).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from streamlib.client import Client
from streamlib.protocol.errors import BadRequestError
from streamlib.spark.plan import end_position
from streamlib.spark.publish import Record, TaskOutcome, check_outcomes, publish_task
from streamlib.stream.positions import EARLIEST
from streamlib.stream.reader import decode_entry
from streamlib.stream.writer import STREAM_PASSWORD

BATCH_PROPERTY = "spark.batch"
SEQ_PROPERTY = "spark.seq"


class UnsupportedSaveModeError(BadRequestError):
    """Streams are append-only: mode("overwrite") cannot be honoured."""


class MissingValueColumnError(BadRequestError):
    """The DataFrame written has no `value` column (binary or string)."""


# Local properties Spark gives the tasks of a micro-batch: the query's id (kept in its
# checkpoint: the same after a restart) and the batch id.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class Collected(WriterCommitMessage):
    """Direct mode: a task's rows, for the driver to publish."""

    records: list[Record]


@dataclass
class Published(WriterCommitMessage):
    """The stream service: what a task published itself (counts only)."""

    outcome: TaskOutcome


class SinkOptions:
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise UnsupportedSaveModeError(
                "a stream is append-only: use mode('append') to publish to it"
            )
        self.metadata = options.get("metadata") or ""
        self.url = options.get("url") or ""
        if bool(self.metadata) == bool(self.url):
            raise BadRequestError(
                "give one of the options 'url' (the stream service, streamlib://HOST:PORT,...: "
                "tasks publish in parallel, exactly-once) and 'metadata' (the metadata store "
                "URI: the driver publishes)"
            )
        if self.url and not self.url.startswith("streamlib://"):
            raise BadRequestError(
                f"option 'url' is the stream service's, streamlib://HOST:PORT,...: {self.url!r}"
            )
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


def _publish_task(
    options: SinkOptions, writer_id: str, batch_id: int, rows: Iterator[Row]
) -> Published:
    """Publish a task's rows from the executor (the stream service)."""
    context = TaskContext.get()
    if context is None:
        raise BadRequestError("the sink's write() runs in a Spark task")
    partition = context.partitionId()
    first = next(rows, None)
    if first is None:  # (many micro-batch partitions are empty: no connection for them)
        return Published(TaskOutcome(partition, batch_id, 0, 0))

    async def main() -> TaskOutcome:
        client = await Client.connect(options.url)
        try:
            records = (_record(row) for row in itertools.chain([first], rows))
            return await publish_task(
                client, options.stream, writer_id, partition, batch_id, records
            )
        finally:
            await client.close()

    return Published(asyncio.run(main()))


def _outcomes(messages: Sequence[WriterCommitMessage | None]) -> list[TaskOutcome]:
    return [m.outcome for m in messages if isinstance(m, Published)]


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
    """df.write.format("streamlib"): through the stream service, exactly-once across task
    retries (a job run again publishes again); direct, at-least-once."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.options = SinkOptions(options, schema, overwrite)
        # Made in the driver and pickled to every task: a retried task has the same.
        self.job_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        if self.options.url:
            return _publish_task(self.options, self.job_id, 0, iterator)
        return _collect(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.url:
            check_outcomes(_outcomes(messages), 0)
            return
        _publish(self.options, _records(messages), None)


class StreamlibStreamWriter(DataSourceStreamWriter):
    """writeStream.format("streamlib"): exactly-once for deterministic micro-batches."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        # Complete/update output modes arrive as overwrite; each micro-batch is appended.
        self.options = SinkOptions(options, schema, False)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        if not self.options.url:
            return _collect(iterator)
        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if not query_id or batch_id is None:
            raise BadRequestError(
                f"a micro-batch's task has no {QUERY_ID_PROPERTY!r} / {BATCH_ID_PROPERTY!r} "
                "local property: this Spark does not say which query and batch it runs"
            )
        return _publish_task(self.options, query_id, int(batch_id), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.url:
            check_outcomes(_outcomes(messages), batchId)
            return
        records = _records(messages)
        marker = f"{self.options.query_id}:{batchId}:{batch_digest(records)}"
        _publish(self.options, records, marker)
