"""The sink: df.write and writeStream publish to a stream. Direct mode: the driver
publishes, and writeStream is exactly-once across a restart that replays the last
micro-batch. Through the stream service: every task publishes its own rows, exactly once
across task retries and replayed micro-batches."""

from __future__ import annotations

import asyncio
import datetime as dt
import pickle
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streamlib.client import Client
from streamlib.protocol.errors import BadRequestError
from streamlib.spark.plan import end_position, segments
from streamlib.spark.plan import read_segment as read_part
from streamlib.spark.publish import (
    ReusedWriterIdError,
    TaskOutcome,
    batch_of,
    publish_task,
    sequence_id,
)
from streamlib.spark.sink import (
    BATCH_PROPERTY,
    SEQ_PROPERTY,
    MissingValueColumnError,
    Published,
    SinkOptions,
    UnsupportedSaveModeError,
    publish,
)
from streamlib.stream.positions import EARLIEST
from streamlib.stream.reader import Message
from tests.spark.conftest import create_stream, run
from tests.spark.conftest import publish as publish_values
from tests.spark.recording_sink import RecordingDataSource, read_commits


def _messages(uri: str, stream: str) -> list[Message]:
    async def work(client: Client) -> list[Message]:
        end = await end_position(client, stream)
        found = []
        for segment in await segments(client, stream, EARLIEST, end, 1000):
            found.extend(await read_part(client, segment))
        return found

    return run(uri, work)


def _visible(uri: str, stream: str, count: int, timeout_s: float = 20.0) -> list[Message]:
    """The stream's messages once at least `count` are visible to readers (a service
    writer's last entry becomes visible with its explicit LAC, a moment after its
    acknowledgement)."""
    deadline = time.monotonic() + timeout_s
    while len(found := _messages(uri, stream)) < count and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a condition with a deadline, not a timed wait
    return found


def test_write_publishes_every_row(spark: SparkSession, uri: str) -> None:
    when = dt.datetime(2024, 1, 2, tzinfo=dt.UTC)
    rows = [(f"v{i}".encode(), f"k{i % 3}", {"n": str(i)}, when) for i in range(50)]
    df = spark.createDataFrame(
        rows, "value binary, key string, properties map<string,string>, event_time timestamp"
    )
    df.write.format("streamlib").option("metadata", uri).option("stream", "sink-a").mode(
        "append"
    ).save()

    back = spark.read.format("streamlib").option("metadata", uri).option("stream", "sink-a").load()
    got = sorted(
        (bytes(r.value), r.key, r.properties, int(r.event_time.timestamp())) for r in back.collect()
    )
    assert got == sorted((v, k, p, int(when.timestamp())) for v, k, p, _ in rows)


def test_write_rejects_overwrite_and_rows_without_value(spark: SparkSession, uri: str) -> None:
    schema = spark.createDataFrame([("x",)], "value string").schema
    with pytest.raises(UnsupportedSaveModeError):
        SinkOptions({"metadata": uri, "stream": "s"}, schema, overwrite=True)
    no_value = spark.createDataFrame([("x",)], "body string").schema
    with pytest.raises(MissingValueColumnError):
        SinkOptions({"metadata": uri, "stream": "s"}, no_value, overwrite=False)
    with pytest.raises(BadRequestError):
        SinkOptions({"metadata": uri, "stream": "a,b"}, schema, overwrite=False)


def _copy(spark: SparkSession, uri: str, checkpoint: Path):
    query = (
        spark.readStream.format("streamlib")
        .option("metadata", uri)
        .option("stream", "eo-in")
        .load()
        .selectExpr("value", "key")
        .writeStream.format("streamlib")
        .option("metadata", uri)
        .option("stream", "eo-out")
        .option("queryId", "copy")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_stream_sink_is_exactly_once_across_a_restart(
    spark: SparkSession, uri: str, tmp_path: Path
) -> None:
    create_stream(uri, "eo-in")
    publish_values(uri, "eo-in", [f"a{i}".encode() for i in range(30)], key="k")
    checkpoint = tmp_path / "checkpoint"
    _copy(spark, uri, checkpoint)

    # Crash after the sink published batch N but before Spark recorded it as committed:
    # the restarted query runs batch N again, with the same offsets.
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    publish_values(uri, "eo-in", [f"b{i}".encode() for i in range(20)], key="k")
    restarted = _copy(spark, uri, checkpoint)
    replayed = [p for p in restarted.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] > 0  # the sink did see the batch again

    out = _messages(uri, "eo-out")
    values = [m.data for m in out]
    assert sorted(values) == sorted(
        [f"a{i}".encode() for i in range(30)] + [f"b{i}".encode() for i in range(20)]
    )  # every message once: the replayed batch was not published again
    assert all(m.key == "k" and m.properties[BATCH_PROPERTY].startswith("copy:") for m in out)


def test_publish_resumes_a_partially_published_batch(uri: str) -> None:
    records = [(f"r{i}".encode(), None, {}, None) for i in range(10)]
    marker = "q:7:digest"

    async def work(client: Client) -> None:
        # A first attempt that got only 4 messages out before its driver died.
        producer = await client.create_producer("partial")
        for seq, (value, *_rest) in enumerate(records[:4]):
            await producer.send(value, properties={BATCH_PROPERTY: marker, SEQ_PROPERTY: str(seq)})
        await producer.close()
        assert await publish(client, "partial", records, marker) == 6
        assert await publish(client, "partial", records, marker) == 0  # a second replay

    run(uri, work)
    out = _messages(uri, "partial")
    assert [m.data for m in out] == [r[0] for r in records]
    assert [m.properties[SEQ_PROPERTY] for m in out] == [str(i) for i in range(10)]


# -- through the stream service: every task publishes its own rows --------------------


def _recording(spark: SparkSession) -> None:
    spark.dataSource.register(RecordingDataSource)


def _outcomes(commits: list[list]) -> list[TaskOutcome]:
    return [m.outcome for messages in commits for m in messages if isinstance(m, Published)]


def test_write_through_the_service_publishes_from_the_tasks(
    spark: SparkSession, uri: str, service_url: str, tmp_path: Path
) -> None:
    _recording(spark)
    record = tmp_path / "commits"
    rows = [(f"w{i}".encode(), f"k{i % 5}") for i in range(400)]
    df = spark.createDataFrame(rows, "value binary, key string").repartition(4)
    df.write.format("streamlib-recording").option("url", service_url).option(
        "stream", "svc-write"
    ).option("record", str(record)).mode("append").save()

    [messages] = read_commits(record)
    # The driver got counts, never rows: one small message per task.
    assert all(isinstance(m, Published) for m in messages)
    assert all(len(pickle.dumps(m)) < 400 for m in messages)
    outcomes = _outcomes([messages])
    assert sorted(o.partition for o in outcomes) == [0, 1, 2, 3]
    assert sum(o.rows for o in outcomes) == 400 and all(o.duplicates == 0 for o in outcomes)

    out = _visible(uri, "svc-write", 400)
    assert sorted((m.data, m.key) for m in out) == sorted(rows)  # every row, once
    # Each task's producer: spark-<job id>-<partition>, its rows numbered from 0.
    by_name: dict[str, list[int]] = {}
    for m in out:
        by_name.setdefault(m.producer_name, []).append(m.sequence_id)
    assert len(by_name) == 4 and all(n.startswith("spark-") for n in by_name)
    assert all(seqs == list(range(len(seqs))) for seqs in by_name.values())


def test_a_task_retried_after_publishing_part_of_its_rows_publishes_each_row_once(
    spark: SparkSession, uri: str, service_url: str, tmp_path: Path
) -> None:
    _recording(spark)
    record = tmp_path / "commits"
    rows = [(f"t{i}".encode(),) for i in range(300)]
    df = spark.createDataFrame(rows, "value binary").repartition(2)
    # Partition 0's first attempt publishes 60 rows, then fails; Spark runs it again.
    df.write.format("streamlib-recording").option("url", service_url).option(
        "stream", "svc-retry"
    ).option("record", str(record)).option("failAfter", "60").mode("append").save()

    outcomes = {o.partition: o for o in _outcomes(read_commits(record))}
    assert outcomes[0].duplicates == 60  # the retry skipped what the first attempt stored
    assert outcomes[1].duplicates == 0
    values = [m.data for m in _visible(uri, "svc-retry", 300)]
    assert sorted(values) == sorted(v for (v,) in rows)


def _copy_through_the_service(
    spark: SparkSession, uri: str, service_url: str, checkpoint: Path, record: Path
):
    query = (
        spark.readStream.format("streamlib")
        .option("metadata", uri)
        .option("stream", "svc-eo-in")
        .load()
        .selectExpr("value", "key")
        .writeStream.format("streamlib-recording")
        .option("url", service_url)
        .option("stream", "svc-eo-out")
        .option("record", str(record))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_stream_sink_through_the_service_is_exactly_once_across_a_replay(
    spark: SparkSession, uri: str, service_url: str, tmp_path: Path
) -> None:
    _recording(spark)
    create_stream(uri, "svc-eo-in")
    publish_values(uri, "svc-eo-in", [f"a{i}".encode() for i in range(40)], key="k")
    checkpoint, record = tmp_path / "checkpoint", tmp_path / "commits"
    first = _copy_through_the_service(spark, uri, service_url, checkpoint, record)
    query_id = first.id

    # The driver died after the tasks of batch N published but before Spark recorded
    # the batch as committed: the restarted query runs batch N again, same offsets.
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    publish_values(uri, "svc-eo-in", [f"b{i}".encode() for i in range(25)], key="k")
    restarted = _copy_through_the_service(spark, uri, service_url, checkpoint, record)
    assert restarted.id == query_id  # (the producers' names come from it)
    replayed = [p for p in restarted.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] > 0

    outcomes = [o for o in _outcomes(read_commits(record)) if o.batch_id == last]
    # Batch N's rows were sent twice and stored once.
    assert sum(o.duplicates for o in outcomes) == replayed[0]["numInputRows"]
    out = _visible(uri, "svc-eo-out", 65)
    assert sorted(m.data for m in out) == sorted(
        [f"a{i}".encode() for i in range(40)] + [f"b{i}".encode() for i in range(25)]
    )
    assert {m.producer_name.rsplit("-", 1)[0] for m in out} == {f"spark-{query_id}"}
    assert all(batch_of(m.sequence_id) <= last + 1 for m in out)


def test_sink_options_name_one_target(spark: SparkSession, uri: str) -> None:
    schema = spark.createDataFrame([("x",)], "value string").schema
    with pytest.raises(BadRequestError, match="give one of"):
        SinkOptions({"metadata": uri, "url": "streamlib://h:1", "stream": "s"}, schema, False)
    with pytest.raises(BadRequestError, match="give one of"):
        SinkOptions({"stream": "s"}, schema, False)
    with pytest.raises(BadRequestError, match="streamlib://"):
        SinkOptions({"url": "http://h:1", "stream": "s"}, schema, False)


def _publish_direct(url: str, stream: str, writer: str, batch: int, records: list) -> TaskOutcome:
    async def main() -> TaskOutcome:
        client = await Client.connect(url)
        try:
            return await publish_task(client, stream, writer, 0, batch, records)
        finally:
            await client.close()

    return asyncio.run(main())


def test_publish_task_resends_nothing_and_refuses_an_earlier_batch(
    uri: str, service_url: str
) -> None:
    records = [(f"p{i}".encode(), None, {}, None) for i in range(20)]
    assert _publish_direct(service_url, "svc-task", "w", 5, records).duplicates == 0
    assert _publish_direct(service_url, "svc-task", "w", 5, records).duplicates == 20
    # Another query reusing the name would have its rows dropped as resends: refused.
    with pytest.raises(ReusedWriterIdError, match="already published batch 5"):
        _publish_direct(service_url, "svc-task", "w", 4, records)
    out = _visible(uri, "svc-task", 20)
    assert [m.data for m in out] == [r[0] for r in records]
    assert [m.sequence_id for m in out] == [sequence_id(5, i) for i in range(20)]


def test_publish_task_to_a_partitioned_stream_routes_the_same_way_every_attempt(
    uri: str, service_url: str
) -> None:
    run(uri, lambda client: client.streams.create("svc-parts", 3, 2, 2, partitions=3))
    records = [(f"q{i}".encode(), f"k{i}" if i % 2 else None, {}, None) for i in range(60)]
    _publish_direct(service_url, "svc-parts", "w", 0, records[:25])  # an attempt that died
    assert _publish_direct(service_url, "svc-parts", "w", 0, records).duplicates == 25
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(values) < 60 and time.monotonic() < deadline:
        values = [m.data for i in range(3) for m in _messages(uri, f"svc-parts-partition-{i}")]
    assert sorted(values) == sorted(r[0] for r in records)
