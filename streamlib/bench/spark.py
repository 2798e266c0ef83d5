"""`streamlib bench spark`: rows/s of micro-batch reads of a stream into Spark's noop
sink, in a local[N] session, on three local bookies (E3/Qw2/Qa2)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
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


def _measure(spark: Any, uri: str, stream: str, args: argparse.Namespace) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="streamlib-bench-spark-") as checkpoint:
        reader = (
            spark.readStream.format("streamlib")
            .option("metadata", uri)
            .option("stream", stream)
            .option("entriesPerPartition", str(args.entries_per_partition))
        )
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
    return elapsed, len(batches)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need streamlib
    from pyspark.sql import SparkSession

    import streamlib.spark

    with local_cluster(args.bookies) as cluster:
        asyncio.run(_fill(cluster.metadata_uri, "bench-spark", args.messages, args.message_bytes))
        spark = (
            SparkSession.builder.master(f"local[{args.cores}]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(args.cores))
            .getOrCreate()
        )
        try:
            streamlib.spark.register(spark)
            # The first query also pays for starting Python workers; report the second.
            _measure(spark, cluster.metadata_uri, "bench-spark", args)
            elapsed, batches = _measure(spark, cluster.metadata_uri, "bench-spark", args)
        finally:
            spark.stop()
    print(
        f"spark micro-batch read: {args.messages} x {args.message_bytes} B messages, "
        f"local[{args.cores}], {batches} micro-batch(es), "
        f"{args.entries_per_partition} entries per partition, noop sink\n"
        f"  {args.messages / elapsed:,.0f} rows/s ({elapsed:.2f} s, query start included)"
    )
    return 0


def add_parser(which: Any) -> None:
    parser = which.add_parser("spark", help="rows/s of a micro-batch read into a noop sink")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--message-bytes", type=int, default=100)
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    parser.add_argument("--entries-per-partition", type=int, default=16)
    parser.add_argument(
        "--max-per-trigger", type=int, default=0, help="maxMessagesPerTrigger (0: no limit)"
    )
    parser.add_argument("--bookies", type=int, default=3)
    parser.set_defaults(run=run)
