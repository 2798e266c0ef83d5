"""The Spark driver of tests/multihost/test_spark_cluster.py, run in a client host:

    python -m tests.multihost.spark_driver --metadata URI --master spark://sm:7077
        --stream NAME --partitions P --count N --per-trigger M --hold-batch B --work DIR

1. creates the partitioned stream NAME and publishes N messages m0..m(N-1) to it (keyed,
   so they spread over its partitions);
2. starts a SparkSession on the standalone master with the README's `spark-submit`
   settings (client mode: the driver is this process, the executors run on the worker
   hosts and read the bookies themselves);
3. runs a micro-batch query, Trigger.AvailableNow with maxMessagesPerTrigger M, from the
   stream into Spark's parquet file sink with a checkpoint, both under DIR. In micro-batch
   B every task's first attempt, once it has passed on its first rows, writes a marker file
   DIR/markers/b{B}-p{partition}-a{attempt}.json naming its executor's JVM and waits for
   the file DIR/markers/release: the test kills an executor while the batch is provably
   running, then releases it;
4. reads the sink's output back through Spark (which keeps to the files its commit log
   names) and reports every row.

Every line on stdout is one JSON event (tests/multihost/workers.py's format): "published",
"executors", "query_started", "query_done" (the batches' input rows), "rows", "end".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession

import streamlib.spark
from streamlib.client import Client
from tests.multihost.spark_standalone import JVM_OPTIONS, readme_spark_submit
from tests.multihost.workers import emit

RELEASE = "release"
HOLD_TIMEOUT_S = 120.0  # a held task gives up (fails the test) if never released


async def publish(uri: str, stream: str, partitions: int, count: int) -> None:
    client = await Client.connect(uri)
    try:
        # Small ledgers: a batch's ranges span several of them.
        rollover = {"max_entries": 20}
        await client.streams.create(stream, 3, 2, 2, rollover, partitions=partitions)
        producer = await client.create_producer(stream)
        futures = [
            await producer.send_async(f"m{i}".encode(), key=f"k{i % 12}") for i in range(count)
        ]
        await asyncio.gather(*futures)
        await producer.close()  # (its ledgers' LACs published: readers see every message)
    finally:
        await client.close()


def executor_jvm() -> int:
    """The pid of the executor JVM this Python worker runs under (its ancestor whose
    command line is CoarseGrainedExecutorBackend's)."""
    pid = os.getpid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline:
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # (the field after the state)
    raise RuntimeError("this Python worker does not run under an executor JVM")


def holding(markers: str, batch_id: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator]:
    """A mapInArrow function passing rows through unchanged; in micro-batch batch_id each
    task attempt, once it has handed Spark its first rows (the sink's file is open), writes
    its marker, and first attempts wait there until the release file appears (bounded)."""

    def hold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        assert context is not None
        held = context.getLocalProperty("streaming.sql.batchId") == str(batch_id)
        for batch in batches:
            yield batch
            if held:
                held = False
                attempt = context.attemptNumber()
                marker = {
                    "batch": batch_id,
                    "partition": context.partitionId(),
                    "attempt": attempt,
                    "executor_pid": executor_jvm(),
                }
                path = Path(markers) / f"b{batch_id}-p{context.partitionId()}-a{attempt}.json"
                path.with_suffix(".tmp").write_text(json.dumps(marker))
                path.with_suffix(".tmp").rename(path)  # (whole, for the test's reads)
                if attempt == 0:
                    wait_for_file(Path(markers) / RELEASE, HOLD_TIMEOUT_S)

    return hold


def wait_for_file(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s}s")
        time.sleep(0.05)  # a file has nothing to block on: poll it, bounded


def session(master_url: str) -> SparkSession:
    """A session on the standalone master with the README's `spark-submit` settings (the
    executors' Python, importing this checkout: streamlib is pure Python there, nothing
    ships with --packages; the driver known by this host's name), and sized for a small
    machine: two executors of one core and 512 MiB each, one per worker."""
    master, confs = readme_spark_submit(
        {
            "spark://MASTER:7077": master_url,
            "PYTHON": sys.executable,
            "CHECKOUT": os.environ["PYTHONPATH"],
            "DRIVER": os.environ["SPARK_LOCAL_HOSTNAME"],
        }
    )
    builder = SparkSession.builder.master(master).appName("streamlib-multihost")
    for key, value in confs.items():
        builder = builder.config(key, value)
    return (
        builder.config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
        # Start the query only once both executors are there, so both hold a task.
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
        .config("spark.task.maxFailures", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="tests.multihost.spark_driver")
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--per-trigger", type=int, required=True)
    parser.add_argument("--hold-batch", type=int, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    out, checkpoint, markers = (args.work / name for name in ("out", "checkpoint", "markers"))
    markers.mkdir(parents=True, exist_ok=True)

    asyncio.run(publish(args.metadata, args.stream, args.partitions, args.count))
    emit("published", count=args.count)

    spark = session(args.master)
    streamlib.spark.register(spark)
    # (the executors registered with the driver; the session waited for both)
    emit("executors", count=spark.sparkContext._jsc.sc().getExecutorIds().size())

    df = (
        spark.readStream.format("streamlib")
        .option("metadata", args.metadata)
        .option("stream", args.stream)
        .option("maxMessagesPerTrigger", str(args.per_trigger))
        .option("numPartitions", "2")  # the executors' cores
        .load()
    )
    query = (
        df.mapInArrow(holding(str(markers), args.hold_batch), df.schema)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    emit("query_started")
    finished = query.awaitTermination(240)
    error = query.exception()
    emit(
        "query_done",
        finished=finished,
        error=None if error is None else str(error)[:2000],
        batches=[p["numInputRows"] for p in query.recentProgress],
    )
    if not finished:
        query.stop()
        return 1

    written = spark.read.parquet(str(out))
    rows = written.select("stream", "ledger_id", "entry_id", "batch_index", "value").collect()
    emit(
        "rows",
        rows=[[r.stream, r.ledger_id, r.entry_id, r.batch_index, r.value.decode()] for r in rows],
        committed_files=len(written.inputFiles()),
        files=len(list(out.glob("*.parquet"))),
    )
    spark.stop()
    emit("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
