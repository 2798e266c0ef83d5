"""`streamlib bench spark`: rows/s of micro-batch reads of a stream into Spark's noop
sink, in a local[N] session, on three local bookies (E3/Qw2/Qa2). (`--sink`: the
streamlib sink's rows/s instead: streamlib/bench/spark_sink.py.)

Each run is one Trigger.AvailableNow query over the whole stream, after a warm-up query
that pays for starting Spark's Python workers. Two rates per run:

- with the query start: rows / wall time from `start()` to the end of the query;
- without it: rows / the time Spark reports for executing the micro-batches
  (`durationMs.addBatch` of the query's progress: planning the partitions, the tasks
  reading and decoding, the sink). What it leaves out is starting the query, asking the
  source for offsets (`latestOffset`) and writing the offset and commit logs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from streamlib.bench.cluster import local_cluster
from streamlib.client import Client


async def _fill(uri: str, stream: str, messages: int, message_bytes: int) -> None:
    client = await Client.connect(uri)
    try:
        await client.streams.create(stream, 3, 2, 2, rollover={"max_entries": 2000})
        producer = await client.create_producer(stream, batching_max_publish_delay_ms=2)
        payload = b"x" * message_bytes
        last = None
        for _ in range(messages):
            last = await producer.send_async(payload)
        assert last is not None
        await last
        await producer.close()  # closes the ledger: everything is readable
    finally:
        await client.close()


@dataclass
class Run:
    rows: int
    batches: int
    total_s: float  # start() to the end of the query
    batch_s: float  # the micro-batches' addBatch durations
    other_ms: dict[str, int]  # the rest of the progress' durations, summed


def _measure(spark: Any, uri: str, stream: str, args: argparse.Namespace) -> Run:
    with tempfile.TemporaryDirectory(prefix="streamlib-bench-spark-") as checkpoint:
        reader = spark.readStream.format("streamlib").option("metadata", uri)
        reader = reader.option("stream", stream)
        if args.entries_per_partition:
            reader = reader.option("entriesPerPartition", str(args.entries_per_partition))
        if args.max_per_trigger:
            reader = reader.option("maxMessagesPerTrigger", str(args.max_per_trigger))
        start = time.perf_counter()
        query = (
            reader.load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - start
        batches = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in batches)
    if rows != args.messages:
        raise RuntimeError(f"read {rows} rows, published {args.messages}")
    other: dict[str, int] = {}
    for progress in batches:
        for name, ms in progress["durationMs"].items():
            if name not in ("addBatch", "triggerExecution"):
                other[name] = other.get(name, 0) + ms
    batch_ms = sum(p["durationMs"].get("addBatch", 0) for p in batches)
    return Run(rows, len(batches), elapsed, batch_ms / 1000, other)


def session(cores: int) -> Any:
    """A local[cores] SparkSession with the streamlib format registered."""
    from pyspark.sql import SparkSession

    import streamlib.spark

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .getOrCreate()
    )
    streamlib.spark.register(spark)
    return spark


def run(args: argparse.Namespace) -> int:
    if args.sink:
        from streamlib.bench import spark_sink

        return spark_sink.run(args)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need streamlib
    args.cores = args.cores or 2
    runs = []
    with local_cluster(args.bookies) as cluster:
        asyncio.run(_fill(cluster.metadata_uri, "bench-spark", args.messages, args.message_bytes))
        spark = session(args.cores)
        try:
            _measure(spark, cluster.metadata_uri, "bench-spark", args)  # warm-up
            for _ in range(args.runs):
                runs.append(_measure(spark, cluster.metadata_uri, "bench-spark", args))
        finally:
            spark.stop()
    per_partition = args.entries_per_partition or "default"
    print(
        f"spark micro-batch read: {args.messages} x {args.message_bytes} B messages, "
        f"local[{args.cores}], entriesPerPartition {per_partition}, noop sink, "
        f"{args.runs} run(s) after a warm-up query\n"
        "  with query start: rows / wall time of the query; without: rows / the "
        "micro-batches' execution (Spark's durationMs.addBatch)"
    )
    for i, r in enumerate(runs, 1):
        rest = ", ".join(f"{name} {ms}" for name, ms in sorted(r.other_ms.items()))
        print(
            f"  run {i}: {r.rows / r.total_s:9,.0f} rows/s with query start ({r.total_s:.2f} s), "
            f"{r.rows / r.batch_s:9,.0f} rows/s without ({r.batch_s:.2f} s), "
            f"{r.batches} micro-batch(es); other ms: {rest}"
        )
    with_start = statistics.median(r.rows / r.total_s for r in runs)
    without = statistics.median(r.rows / r.batch_s for r in runs)
    print(f"  median: {with_start:,.0f} rows/s with query start, {without:,.0f} rows/s without")
    return 0


def add_parser(which: Any) -> None:
    parser = which.add_parser(
        "spark",
        help="rows/s of a micro-batch read into a noop sink (--sink: of the streamlib sink)",
    )
    parser.add_argument(
        "--sink",
        action="store_true",
        help="measure df.write.format('streamlib') with 1, 2 and 4 tasks instead",
    )
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--message-bytes", type=int, default=100)
    parser.add_argument(
        "--cores", type=int, default=0, help="Spark local[N] (default 2; 4 with --sink)"
    )
    parser.add_argument(
        "--entries-per-partition",
        type=int,
        default=0,
        help="the source's entriesPerPartition (0: not set, partitions sized to the cores)",
    )
    parser.add_argument(
        "--max-per-trigger", type=int, default=0, help="maxMessagesPerTrigger (0: no limit)"
    )
    parser.add_argument("--runs", type=int, default=3, help="measured queries, after a warm-up")
    parser.add_argument("--bookies", type=int, default=3)
    parser.set_defaults(run=run)
