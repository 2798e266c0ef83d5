"""Spark standalone across hosts: a master on host sm, a worker on each of w1 and w2, the
driver on c1, bookies on b1..b3 and ZooKeeper on zk, each host its own network namespace
and address. The executors read the bookies directly (the data source is pure Python:
they only need streamlib importable). A micro-batch query copies a partitioned stream
into Spark's parquet file sink; in its second batch, while both executors hold a task,
one executor's JVM is SIGKILLed. Spark runs the lost task again (the worker starts a new
executor), the source re-reads the same offsets, the sink's commit protocol keeps the
dead attempt's files out, and the output holds every published message exactly once."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.multihost.conftest import Cluster
from tests.multihost.hosts import Network, Worker, running_network
from tests.multihost.spark_driver import RELEASE
from tests.multihost.spark_standalone import SparkMaster, SparkWorker, executor_pids, spark_env

BOOKIE_HOSTS = ("b1", "b2", "b3")
WORKER_HOSTS = ("w1", "w2")
HOSTS = ("zk", *BOOKIE_HOSTS, "c1", "sm", *WORKER_HOSTS)
STREAM, PARTITIONS, COUNT, PER_TRIGGER, HELD_BATCH = "clicks", 3, 3000, 1000, 1
DRIVER = (sys.executable, "-m", "tests.multihost.spark_driver")


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """This module's hosts: ZooKeeper, three bookies, the driver's, Spark's master and two
    Spark workers."""
    with running_network(HOSTS, tmp_path_factory.mktemp("spark-cluster")) as net:
        yield net


def read_markers(markers: Path) -> list[dict[str, Any]]:
    """The task markers of the held batch so far (see spark_driver.py)."""
    return [json.loads(p.read_text()) for p in sorted(markers.glob("*.json"))]


def wait_markers(markers: Path, count: int, timeout_s: float) -> list[dict[str, Any]]:
    """The task markers of the held batch, once there are `count`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = read_markers(markers)
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} of {count} tasks held within {timeout_s}s")
        time.sleep(0.1)  # marker files have nothing to block on: poll them, bounded


def test_a_query_on_a_standalone_cluster_survives_an_executor_killed_mid_batch(
    cluster: Cluster, tmp_path: Path
) -> None:
    net = cluster.net
    began = time.monotonic()
    spark_dir = tmp_path / "spark"
    work = tmp_path / "query"
    # JVMs and bookies start in parallel: the master first, the workers once it serves,
    # the driver (which publishes first) once the bookies do.
    master = SparkMaster(net["sm"], spark_dir).launch()
    cluster.start_bookies(BOOKIE_HOSTS)
    master.wait_ready()
    workers = {w: SparkWorker(net[w], master.url, spark_dir).launch() for w in WORKER_HOSTS}
    argv = [*DRIVER, "--metadata", cluster.uri, "--master", master.url, "--stream", STREAM,
            "--partitions", str(PARTITIONS), "--count", str(COUNT),
            "--per-trigger", str(PER_TRIGGER), "--hold-batch", str(HELD_BATCH),
            "--work", str(work)]  # fmt: skip
    env = spark_env(net["c1"], spark_dir)
    driver = net["c1"].popen(argv, label="spark-driver", proc_class=Worker, env=env, cwd=tmp_path)
    assert isinstance(driver, Worker)
    for worker in workers.values():
        worker.wait_registered()
    driver.wait_event("published", 60)
    assert driver.wait_event("executors", 150)["count"] == len(WORKER_HOSTS)

    # Batch 1 runs: both executors hold a task that has rows of it. Kill one executor.
    held = wait_markers(work / "markers", len(WORKER_HOSTS), 120)
    host_of = {pid: w for w in WORKER_HOSTS for pid in executor_pids(net[w])}
    assert sorted(host_of.get(m["executor_pid"], "?") for m in held) == sorted(WORKER_HOSTS)
    victim = held[0]
    victim_host = host_of[victim["executor_pid"]]
    os.kill(victim["executor_pid"], signal.SIGKILL)
    killed = time.monotonic()
    (work / "markers" / RELEASE).touch()

    done = driver.wait_event("query_done", 240)
    assert done["finished"] and done["error"] is None, driver.tail()
    assert sum(done["batches"]) == COUNT
    written = driver.wait_event("rows", 120)
    assert driver.wait(60) == 0, driver.tail()

    # The lost task ran again; the worker whose executor died was given a new one.
    retried = [
        m
        for m in read_markers(work / "markers")
        if m["partition"] == victim["partition"] and m["attempt"] > 0
    ]
    assert retried and retried[0]["executor_pid"] != victim["executor_pid"]
    workers[victim_host].wait_executors_launched(2, 60)

    # Every published message once, from the stream's partitions, each at its own position.
    rows = written["rows"]
    assert Counter(value for *_, value in rows) == Counter(f"m{i}" for i in range(COUNT))
    assert len({tuple(r[:4]) for r in rows}) == COUNT
    assert {r[0] for r in rows} == {f"{STREAM}-partition-{i}" for i in range(PARTITIONS)}
    # The dead attempt had opened its output file (a task opens it before it pulls rows):
    # it lies in the output directory, and the sink's commit log leaves it out.
    assert written["files"] > written["committed_files"]
    # (for the log: where the time goes, and what the sink's commit log kept out)
    timeline = {e["event"]: round(e["t"] - began, 1) for e in driver.events if "t" in e}
    timeline["killed"] = round(killed - began, 1)
    print(f"\ntimeline (s): {timeline}; batches {done['batches']}; sink: "
          f"{written['committed_files']} files committed of {written['files']} written")  # fmt: skip
