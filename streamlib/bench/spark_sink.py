"""`streamlib bench spark --sink`: rows/s of df.write.format("streamlib") through the
stream service, where every task publishes its own rows (streamlib/spark/publish.py),
with the DataFrame in 1, 2 and 4 partitions (tasks) of a local[N] session, on three
local bookies (new streams E3/Qw2/Qa2, as `bench spark`'s) and one broker; and, for comparison, direct mode's sink,
where the driver publishes every row through one producer.

The DataFrame is built, repartitioned and cached before the clock starts, so a figure
is the rows over the wall time of save() alone: planning the write, the tasks
publishing (each connects to the broker and waits until its rows are durable), the
driver's commit. A warm-up write first pays for starting Spark's Python workers. Every
write goes to a new stream, read back to check it holds every row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamlib.bench.cluster import local_cluster

TASKS = (1, 2, 4)


def _frame(spark: Any, rows: int, message_bytes: int, tasks: int) -> Any:
    pad = max(0, message_bytes - 8)
    df = spark.range(rows).selectExpr(
        f"concat(lpad(cast(id as string), 8, '0'), repeat('x', {pad})) as value"
    )
    df = df.repartition(tasks).cache()
    df.count()  # (materialised: the clock measures the write only)
    return df


def _write(df: Any, target: tuple[str, str], stream: str) -> float:
    option, address = target
    start = time.perf_counter()
    df.write.format("streamlib").option(option, address).option("stream", stream).mode(
        "append"
    ).save()
    return time.perf_counter() - start


def _count(spark: Any, uri: str, stream: str, expected: int) -> int:
    """The rows readers see in the stream, once they see `expected` (or after 20 s): a
    service writer's last entry becomes visible with its explicit LAC, a moment after
    its acknowledgement."""
    deadline = time.monotonic() + 20
    while True:
        reader = spark.read.format("streamlib").option("metadata", uri).option("stream", stream)
        count = int(reader.load().count())
        if count >= expected or time.monotonic() > deadline:
            return count


def _measure(
    spark: Any, uri: str, target: tuple[str, str], tasks: int, args: argparse.Namespace
) -> list[float]:
    """rows/s of each run writing args.messages rows in `tasks` partitions."""
    df = _frame(spark, args.messages, args.message_bytes, tasks)
    rates = []
    try:
        for run in range(args.runs):
            stream = f"bench-sink-{target[0]}-{tasks}-{run}"
            elapsed = _write(df, target, stream)
            stored = _count(spark, uri, stream, args.messages)
            if stored != args.messages:
                raise RuntimeError(f"{stream}: {stored} rows stored, {args.messages} written")
            rates.append(args.messages / elapsed)
    finally:
        df.unpersist()
    return rates


def _defaults(uri: str) -> None:
    from streamlib.client import Client

    async def set_defaults() -> None:
        client = await Client.connect(uri)
        try:
            await client.streams.set_defaults(ensemble=3, write_quorum=2, ack_quorum=2)
        finally:
            await client.close()

    asyncio.run(set_defaults())


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need streamlib
    from streamlib.bench.spark import session
    from streamlib.broker.launcher import BrokerProcess

    cores = args.cores or max(TASKS)
    figures: dict[str, list[float]] = {}
    with local_cluster(args.bookies) as cluster, tempfile.TemporaryDirectory() as logs:
        uri = cluster.metadata_uri
        _defaults(uri)
        broker = BrokerProcess(Path(logs), uri, extra=["--port", "0"]).start(port=0)
        spark = session(cores)
        try:
            service = ("url", f"streamlib://{broker.address}")
            warm_up = _frame(spark, 100, args.message_bytes, max(TASKS))
            _write(warm_up, service, "bench-sink-warm-up")
            _write(warm_up, ("metadata", uri), "bench-sink-warm-up-direct")
            for tasks in TASKS:
                figures[f"service {tasks}"] = _measure(spark, uri, service, tasks, args)
            figures["direct"] = _measure(spark, uri, ("metadata", uri), max(TASKS), args)
        finally:
            spark.stop()
            broker.stop()
    print(
        f"spark sink: df.write of {args.messages} rows of {args.message_bytes} B, "
        f"local[{cores}], 3 local bookies (E3/Qw2/Qa2), 1 broker; "
        f"median of {args.runs} run(s) after a warm-up write; rows / wall time of save()"
    )
    for tasks in TASKS:
        rates = figures[f"service {tasks}"]
        label = f"{tasks} task{'s' if tasks > 1 else ''}"
        print(
            f"  service, {label:<8} publishing from the executors "
            f"{statistics.median(rates):>10,.0f} rows/s  (runs: "
            + ", ".join(f"{r:,.0f}" for r in rates)
            + ")"
        )
    direct = figures["direct"]
    print(
        f"  direct, {max(TASKS)} tasks, the driver publishing every row  "
        f"{statistics.median(direct):>10,.0f} rows/s  (runs: "
        + ", ".join(f"{r:,.0f}" for r in direct)
        + ")"
    )
    return 0
