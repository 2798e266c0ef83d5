"""Publishing a Spark task's rows from the executor, exactly once, through the stream
service's producer deduplication (Pulsar's): plain asyncio over the service client, no
pyspark (streamlib.spark.sink calls it from DataSourceWriter.write).

Each task publishes with a producer of its own name, `spark-<writer id>-<partition>`
(the writer id: Spark's query id for a streaming query, kept in its checkpoint; a fresh
id per df.write job), and numbers its rows

    sequence id = batch id * 2**32 + row index

so the sequence ids of one name only grow across micro-batches (the broker drops a
message whose sequence id is not above the last it stored for the name). A retried task
(same partition, same batch) and a micro-batch replayed after a driver restart send the
same names and sequence ids again: what the first attempt stored is acknowledged without
being stored twice, the rest is published. The producer learns the name's last stored
sequence id when it connects and skips those rows without sending them; the broker's
own check covers the rest (a send racing the first attempt's last acknowledgements).

That is exactly-once when a retry sees the same rows in the same order (a streamlib
source with deterministic transformations; Spark's round-robin repartition sorts first
for this reason). A retry that sees other rows (non-deterministic input) still stores
each (partition, batch, row index) once: the first attempt's rows up to where it got,
the retry's after them -- by content, rows of the first attempt's may be missing and
rows may repeat. We do not read back what the first attempt stored (that would cost a
read per retried task); the README says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streamlib.protocol.errors import BadRequestError
from streamlib.retry import SPARK_TASK_PRODUCER
from streamlib.stream.admin import partition_name
from streamlib.stream.partitioned import partition_of

# A message to publish: (value, key, properties, event time ms or None).
Record = tuple[bytes, str | None, dict[str, str], int | None]

ROW_BITS = 32
MAX_ROWS_PER_TASK = 1 << ROW_BITS  # rows of one task in one batch
# Sequence ids are int64 on the wire and in the entry format, and never negative.
MAX_BATCH_ID = (1 << (63 - ROW_BITS)) - 1


class ReusedWriterIdError(BadRequestError):
    """A task's producer name already published a later batch than the task's: the name
    belongs to another query (or the checkpoint went back). Its rows would be taken for
    resends and dropped, so the task refuses to publish."""


def sequence_id(batch_id: int, row_index: int) -> int:
    if not 0 <= batch_id <= MAX_BATCH_ID:
        raise BadRequestError(f"batch id {batch_id} is outside 0..{MAX_BATCH_ID}")
    if not 0 <= row_index < MAX_ROWS_PER_TASK:
        raise BadRequestError(
            f"a task publishes at most {MAX_ROWS_PER_TASK} rows per batch; "
            "repartition the DataFrame into more partitions"
        )
    return (batch_id << ROW_BITS) | row_index


def batch_of(sequence: int) -> int:
    """The batch id a sequence id belongs to (-1 for the -1 of a name with none)."""
    return -1 if sequence < 0 else sequence >> ROW_BITS


def producer_name(writer_id: str, partition: int) -> str:
    return f"spark-{writer_id}-{partition}"


@dataclass(frozen=True)
class TaskOutcome:
    """What a task reports to the driver: counts, never rows."""

    partition: int
    batch_id: int
    rows: int  # rows the task saw
    duplicates: int  # of them, skipped as already stored by an earlier attempt


async def _producer(client: Any, stream: str, name: str, batch_id: int, options: dict) -> Any:
    # A previous attempt of this task that died with its executor may still hold the
    # name on the broker until its connection is noticed gone (ProducerBusyError).
    producer = await SPARK_TASK_PRODUCER.run(
        f"producer {name!r} on {stream!r}",
        lambda: client.create_producer(stream, producer_name=name, **options),
    )
    last = producer.last_sequence_id
    if batch_of(last) > batch_id:
        await producer.close()
        raise ReusedWriterIdError(
            f"producer {name!r} already published batch {batch_of(last)} to {stream!r}, "
            f"later than this task's batch {batch_id}: another query used this id, or its "
            "checkpoint went back; give the query a new checkpoint location"
        )
    return producer


async def publish_task(
    client: Any,
    stream: str,
    writer_id: str,
    partition: int,
    batch_id: int,
    records: Iterable[Record],
    **producer_options: Any,
) -> TaskOutcome:
    """Publish one task's records (client: a streamlib:// service client), numbered
    from row 0 of `batch_id`; returns once every one of them is durable. A partitioned
    stream gets a producer of the same name on each partition: a row goes to its key's
    partition, a row without a key to row index mod partitions (the same partition on
    every attempt, unlike round robin)."""
    name = producer_name(writer_id, partition)
    count = await client.partitions(stream, create=True)
    targets = [partition_name(stream, i) for i in range(count)] if count else [stream]
    producers: list[Any] = []
    failures: list[BaseException] = []

    def settled(future: Any) -> None:
        if not future.cancelled() and future.exception() is not None and not failures:
            failures.append(future.exception())

    rows = 0
    try:
        for target in targets:
            producers.append(await _producer(client, target, name, batch_id, producer_options))
        for index, (value, key, properties, event_ms) in enumerate(records):
            rows += 1
            producer = producers[_route(key, index, len(producers))]
            future = await producer.send_async(
                value, key, properties, event_ms, sequence_id=sequence_id(batch_id, index)
            )
            future.add_done_callback(settled)
            if failures:
                raise failures[0]
        for producer in producers:
            await producer.flush()
        if failures:
            raise failures[0]
        return TaskOutcome(partition, batch_id, rows, sum(p.duplicates for p in producers))
    finally:
        for producer in producers:
            await producer.close()


def _route(key: str | None, index: int, partitions: int) -> int:
    if partitions == 1:
        return 0
    return partition_of(key, partitions) if key is not None else index % partitions


def check_outcomes(outcomes: Sequence[TaskOutcome], batch_id: int) -> int:
    """The driver's check of its tasks' reports: every one is of this batch. Returns
    the rows published."""
    wrong = sorted({o.batch_id for o in outcomes} - {batch_id})
    if wrong:
        raise BadRequestError(f"tasks of batch {batch_id} reported publishing batch(es) {wrong}")
    return sum(o.rows for o in outcomes)


__all__ = [
    "MAX_BATCH_ID",
    "MAX_ROWS_PER_TASK",
    "Record",
    "ReusedWriterIdError",
    "TaskOutcome",
    "batch_of",
    "check_outcomes",
    "producer_name",
    "publish_task",
    "sequence_id",
]
