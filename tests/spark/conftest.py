"""One local[2] SparkSession and one cluster of three real bookies (sqlite metadata) for
the whole directory, and a broker of the stream service over them for the tests that
ask for it: a JVM and these processes are slow to start, so they are shared; every test
uses streams of its own names. All are stopped at the end.

The session's master is local[2, 2]: a failed task is tried once more, as on a cluster
(spark.task.maxFailures), so the sink's task retries can be tested."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

import streamlib
import streamlib.spark
from streamlib.client import Client
from streamlib.spark.plan import end_position
from streamlib.stream.positions import MessageId
from tests.integration.conftest import LedgerCluster


@pytest.fixture(scope="session")
def bookies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerCluster]:
    root = tmp_path_factory.mktemp("spark-cluster")
    cluster = LedgerCluster(root, f"sqlite://{root / 'meta.db'}")
    try:
        cluster.start_bookies(3)
        yield cluster
    finally:
        for b in cluster.bookies:
            b.kill()


@pytest.fixture(scope="session")
def service_url(bookies: LedgerCluster) -> Iterator[str]:
    """streamlib://HOST:PORT of one broker of the stream service over the bookies."""
    [broker] = bookies.start_brokers(1)
    try:
        yield bookies.service_url
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    # Python workers must run this venv's interpreter (streamlib, pyarrow), not the
    # python3 on PATH.
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2, 2]")
        .appName("streamlib-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    streamlib.spark.register(session)
    try:
        yield session
    finally:
        session.stop()
        monkeypatch.undo()


@pytest.fixture
def uri(bookies: LedgerCluster) -> str:
    return bookies.metadata_uri


def run(uri: str, work: Callable[[Client], Any]) -> Any:
    """Run `work(client)` (a coroutine function) on a fresh client."""

    async def main() -> Any:
        client = await Client.connect(uri)
        try:
            return await work(client)
        finally:
            await client.close()

    return asyncio.run(main())


def publish(uri: str, stream: str, values: list[bytes], **fields: Any) -> list[MessageId]:
    """Publish values (with the same key/properties for all, if given); their ids, once
    every one of them is visible to readers (the LAC has passed the last)."""
    return publish_each(uri, stream, [(v, fields) for v in values], batching_max_messages=7)


def publish_each(
    uri: str, stream: str, messages: list[tuple[bytes, dict[str, Any]]], **producer_options: Any
) -> list[MessageId]:
    """Publish (value, send_async's other arguments) pairs; their ids, once visible."""

    async def work(client: Client) -> list[MessageId]:
        producer = await client.create_producer(stream, **producer_options)
        futures = [await producer.send_async(v, **fields) for v, fields in messages]
        ids = list(await asyncio.gather(*futures))
        await producer.close()
        return ids

    ids: list[MessageId] = run(uri, work)
    wait_visible(uri, stream, ids[-1])
    return ids


def wait_visible(uri: str, stream: str, last: MessageId, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        end = run(uri, lambda client: end_position(client, stream))
        if (end.ledger_id, end.entry_id) >= (last.ledger_id, last.entry_id):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{stream}: {last} not visible after {timeout_s}s (end {end})")
        time.sleep(0.05)  # polling a condition with a deadline, not a timed wait


def create_stream(uri: str, stream: str, max_entries: int = 5) -> None:
    """A stream that rolls every few entries, so reads span several ledgers."""
    run(
        uri,
        lambda client: client.streams.create(
            stream, ensemble=3, write_quorum=2, ack_quorum=2, rollover={"max_entries": max_entries}
        ),
    )
