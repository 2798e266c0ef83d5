"""The sink: df.write and writeStream publish to a stream; writeStream is exactly-once
across a restart that replays the last micro-batch."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streamlib.client import Client
from streamlib.protocol.errors import BadRequestError
from streamlib.spark.plan import end_position, segments
from streamlib.spark.plan import read_segment as read_part
from streamlib.spark.sink import (
    BATCH_PROPERTY,
    SEQ_PROPERTY,
    MissingValueColumnError,
    SinkOptions,
    UnsupportedSaveModeError,
    publish,
)
from streamlib.stream.positions import EARLIEST
from streamlib.stream.reader import Message
from tests.spark.conftest import create_stream, run
from tests.spark.conftest import publish as publish_values


def _messages(uri: str, stream: str) -> list[Message]:
    async def work(client: Client) -> list[Message]:
        end = await end_position(client, stream)
        found = []
        for segment in await segments(client, stream, EARLIEST, end, 1000):
            found.extend(await read_part(client, segment))
        return found

    return run(uri, work)


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
