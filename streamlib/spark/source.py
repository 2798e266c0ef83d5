"""The `streamlib` data source: batch reads and micro-batch streaming reads of streams.

The reader objects are pickled from the driver to Spark's Python workers, so they hold
only options and plain data; every call that needs the cluster opens its own client
(`_run`) and closes it before returning.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from streamlib.client import Client
from streamlib.protocol.errors import BadRequestError
from streamlib.spark import plan
from streamlib.spark.rows import SCHEMA, segment_batches
from streamlib.stream.compacted import View
from streamlib.stream.positions import MessageId

T = TypeVar("T")


def _run(uri: str, work: Callable[[Client], Awaitable[T]]) -> T:
    async def main() -> T:
        client = await Client.connect(uri)
        try:
            return await work(client)
        finally:
            await client.close()

    return asyncio.run(main())


class Options:
    """The source's options, checked once in the driver."""

    def __init__(self, options: Mapping[str, str], *, partitions: bool = False) -> None:
        """partitions: look the streams up first (in the driver): a partitioned stream
        is read as its partitions (NAME-partition-0, ...), each with its own offsets."""
        self.metadata = options.get("metadata") or ""
        if not self.metadata:
            raise BadRequestError(
                "option 'metadata' is required: the metadata store URI, e.g. sqlite:///path/meta.db"
            )
        self.streams = plan.parse_streams(options.get("stream"))
        if partitions:
            named = self.streams
            self.streams = _run(self.metadata, lambda c: plan.expand_partitions(c, named))
        self.starting = plan.parse_offsets(
            options.get("startingOffsets") or "earliest", self.streams, "startingOffsets"
        )
        self.ending = plan.parse_offsets(
            options.get("endingOffsets") or "latest", self.streams, "endingOffsets"
        )
        self.max_messages = _positive(options, "maxMessagesPerTrigger", None)
        # Input partitions of a read (default: the cores of the machine planning it, which
        # in local mode are Spark's; on a cluster give the executors' total cores). A
        # Spark task costs far more than a range read: one per core, each reading a
        # contiguous run of entries, is the fastest.
        self.num_partitions: int = _positive(options, "numPartitions", None) or _cores()
        # ... more partitions if one would hold more entries than this.
        self.entries_per_partition: int | None = _positive(options, "entriesPerPartition", None)
        # Each stream's compacted view (each key once, at its latest as of the horizon),
        # then the stream after the horizon: what a compacted reader reads (plan.py).
        self.read_compacted = plan.parse_read_compacted(options.get("readCompacted"))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _positive(options: Mapping[str, str], name: str, default: int | None) -> Any:
    value = options.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise BadRequestError(f"option {name!r} must be a positive integer, got {value!r}")
    return number


class SegmentPartition(InputPartition):
    def __init__(self, segment: plan.Segment) -> None:
        super().__init__(segment)
        self.segment = segment


async def _views(client: Client, options: Options) -> dict[str, View | None] | None:
    """The streams' compacted views installed now, for a compacted read (else None)."""
    if not options.read_compacted:
        return None
    return await plan.compacted_views(client, options.streams)


async def _partitions(
    client: Client,
    options: Options,
    start: dict[str, MessageId],
    end: dict[str, MessageId],
    views: dict[str, View | None] | None,
) -> list[SegmentPartition]:
    segments = await plan.plan_segments(
        client,
        options.streams,
        start,
        end,
        options.num_partitions,
        options.entries_per_partition,
        views,
    )
    return [SegmentPartition(segment) for segment in segments]


def _read(uri: str, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The partition's record batches, read with one client on one event loop: the ranges
    read ahead stay in flight while Spark takes a batch."""
    assert isinstance(partition, SegmentPartition)
    segment = partition.segment
    with asyncio.Runner() as runner:
        client = runner.run(Client.connect(uri))
        batches = segment_batches(segment, plan.segment_entries(client, segment))

        async def next_batch() -> pa.RecordBatch | None:
            return await anext(batches, None)

        async def close() -> None:
            try:
                await batches.aclose()
            finally:
                await client.close()

        try:
            while (batch := runner.run(next_batch())) is not None:
                yield batch
        finally:
            runner.run(close())


class StreamlibBatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options

        async def work(client: Client) -> list[SegmentPartition]:
            views = await _views(client, options)  # (first: no horizon is past the end)
            start = await plan.resolve(client, options.starting, latest_is_end=True)
            end = await plan.resolve(client, options.ending, latest_is_end=True)
            return await _partitions(client, options, start, end, views)

        return _run(options.metadata, work)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options.metadata, partition)


class StreamlibStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches: offsets are {stream: "ledger:entry:index"} of the last message read.
    With readCompacted a micro-batch (start, end] is what a compacted reader after start
    reads up to end (the view's messages in it, if start is before the view's horizon,
    then the stream's): offsets are stream positions either way, as the view keeps the
    messages' ids; maxMessagesPerTrigger counts the messages so read."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._target: dict[str, MessageId] | None = None  # Trigger.AvailableNow's end

    def initialOffset(self) -> dict:
        options = self.options
        start = _run(
            options.metadata,
            lambda client: plan.resolve(client, options.starting, latest_is_end=True),
        )
        return plan.to_json(start)

    def _start(self, start: dict) -> dict[str, MessageId]:
        positions = plan.from_json(start)
        missing = [n for n in self.options.streams if n not in positions]
        if missing:  # a stream added to the option since the checkpoint was written
            more = {n: self.options.starting[n] for n in missing}
            positions.update(
                _run(
                    self.options.metadata,
                    lambda client: plan.resolve(client, more, latest_is_end=True),
                )
            )
        return positions

    def prepareForTriggerAvailableNow(self) -> None:
        options = self.options
        self._target = _run(options.metadata, lambda client: self._ends(client))

    async def _ends(self, client: Client) -> dict[str, MessageId]:
        return {name: await plan.end_position(client, name) for name in self.options.streams}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_messages)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        positions = self._start(start)
        options = self.options
        target = self._target

        async def work(client: Client) -> dict[str, MessageId]:
            ends = target if target is not None else await self._ends(client)
            ends = {n: max(ends.get(n, positions[n]), positions[n]) for n in options.streams}
            if not isinstance(limit, ReadMaxRows):
                return ends
            budget = plan.split_budget(limit.max_rows, options.streams)
            admitted = {}
            for name in options.streams:
                admitted[name], _ = await plan.advance(
                    client, name, positions[name], ends[name], budget[name], options.read_compacted
                )
            return admitted

        return plan.to_json(_run(options.metadata, work))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        options = self.options
        after, until = self._start(start), plan.from_json(end)

        async def work(client: Client) -> list[SegmentPartition]:
            return await _partitions(client, options, after, until, await _views(client, options))

        return _run(options.metadata, work)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options.metadata, partition)


class StreamlibDataSource(DataSource):
    """spark.read / readStream / write / writeStream .format("streamlib").

    Read options: metadata (the store's URI), stream (a name or a comma list; a
    partitioned stream reads as its partitions, NAME-partition-I, each with its offsets),
    startingOffsets / endingOffsets (earliest | latest | JSON {stream: "ledger:entry:index"}),
    maxMessagesPerTrigger, numPartitions (input partitions of a read; default the cores of
    the planning machine: set it to the executors' cores on a cluster),
    entriesPerPartition (more partitions if one would hold more entries than this) and
    readCompacted (true | false, default false: each stream's compacted view -- the
    latest message of every key up to its horizon, tombstoned keys and keyless messages
    left out, each with its id in the stream -- then every message after the horizon,
    as a compacted Reader reads it; a stream never compacted reads whole; in a streaming
    read a micro-batch that starts before a newer horizon reads that view's part).

    Write options: stream (one), and url (the stream service, streamlib://HOST:PORT,...:
    every task publishes its rows, exactly-once) or metadata (direct mode: the driver
    publishes every row); see streamlib/spark/sink.py.
    """

    @classmethod
    def name(cls) -> str:
        return "streamlib"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return StreamlibBatchReader(Options(self.options, partitions=True))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamlibStreamReader(Options(self.options, partitions=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from streamlib.spark.sink import StreamlibWriter

        return StreamlibWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from streamlib.spark.sink import StreamlibStreamWriter

        return StreamlibStreamWriter(self.options, schema, overwrite)
