"""Batch and micro-batch reads of streams in a local[2] session against real bookies."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession

from streamlib.client import Client
from tests.spark.conftest import create_stream, publish, run


def _read(spark: SparkSession, uri: str, stream: str, **options: str):
    reader = spark.read.format("streamlib").option("metadata", uri).option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_read_equals_what_was_published(spark: SparkSession, uri: str) -> None:
    create_stream(uri, "batch-a")
    values = [f"m{i}".encode() for i in range(120)]
    ids = publish(
        uri, "batch-a", values, key="k", properties={"p": "1"}, event_time=1_700_000_000_000
    )

    df = _read(spark, uri, "batch-a", entriesPerPartition="3")
    assert df.rdd.getNumPartitions() > 2  # several ledgers, entry ranges: parallel tasks
    rows = sorted(df.collect(), key=lambda r: (r.ledger_id, r.entry_id, r.batch_index))

    assert [bytes(r.value) for r in rows] == values
    assert [(r.ledger_id, r.entry_id, r.batch_index) for r in rows] == [tuple(i) for i in ids]
    assert {r.stream for r in rows} == {"batch-a"}
    assert all(r.key == "k" and r.properties == {"p": "1"} for r in rows)
    assert all(int(r.event_time.timestamp() * 1000) == 1_700_000_000_000 for r in rows)
    assert all(r.publish_time is not None for r in rows)


def test_batch_read_between_json_offsets(spark: SparkSession, uri: str) -> None:
    create_stream(uri, "batch-b")
    ids = publish(uri, "batch-b", [f"m{i}".encode() for i in range(30)])
    start, end = ids[9], ids[19]
    df = _read(
        spark,
        uri,
        "batch-b",
        startingOffsets=json.dumps({"batch-b": str(start)}),
        endingOffsets=json.dumps({"batch-b": str(end)}),
    )
    assert sorted(bytes(r.value) for r in df.collect()) == sorted(
        f"m{i}".encode() for i in range(10, 20)
    )


def _stream_to_parquet(spark, uri, stream, out: Path, checkpoint: Path, **options: str):
    reader = spark.readStream.format("streamlib").option("metadata", uri).option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_available_now_then_restart_reads_only_new_messages(
    spark: SparkSession, uri: str, tmp_path: Path
) -> None:
    create_stream(uri, "micro-a")
    publish(uri, "micro-a", [f"a{i}".encode() for i in range(40)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    assert sum(_stream_to_parquet(spark, uri, "micro-a", out, checkpoint)) == 40
    publish(uri, "micro-a", [f"b{i}".encode() for i in range(25)])
    assert sum(_stream_to_parquet(spark, uri, "micro-a", out, checkpoint)) == 25

    rows = spark.read.parquet(str(out)).collect()
    positions = [(r.ledger_id, r.entry_id, r.batch_index) for r in rows]
    assert len(positions) == len(set(positions)) == 65  # no loss, no duplicates
    assert sorted(bytes(r.value) for r in rows) == sorted(
        [f"a{i}".encode() for i in range(40)] + [f"b{i}".encode() for i in range(25)]
    )


def test_max_messages_per_trigger_splits_batches(
    spark: SparkSession, uri: str, tmp_path: Path
) -> None:
    create_stream(uri, "micro-b")
    publish(uri, "micro-b", [f"m{i}".encode() for i in range(100)])
    batches = _stream_to_parquet(
        spark,
        uri,
        "micro-b",
        tmp_path / "out",
        tmp_path / "checkpoint",
        maxMessagesPerTrigger="30",
    )
    assert batches == [30, 30, 30, 10]


def test_unbounded_streams_read_without_no_ops_and_from_the_first_retained_entry(
    spark: SparkSession, uri: str
) -> None:
    # One ledger, rolled by fragments; every publish() is a takeover by term, which seals
    # the old term with a TRUNCATE no-op entry: Spark must never show those.
    run(uri, lambda client: client.streams.create(
        "one-ledger-spark", 3, 2, 2, mode="unbounded", rollover={"max_entries": 3}))  # fmt: skip
    values = [f"u{i}".encode() for i in range(60)]
    ids = []
    for part in range(3):
        ids += publish(uri, "one-ledger-spark", values[20 * part : 20 * (part + 1)])
    assert len({i.ledger_id for i in ids}) == 1
    rows = _read(spark, uri, "one-ledger-spark", entriesPerPartition="4").collect()
    rows.sort(key=lambda r: (r.entry_id, r.batch_index))
    assert [bytes(r.value) for r in rows] == values
    assert [(r.ledger_id, r.entry_id, r.batch_index) for r in rows] == [tuple(i) for i in ids]

    # With retention, fragments go; Spark reads from the ledger's first retained entry,
    # exactly what a reader from EARLIEST sees.
    run(uri, lambda client: client.streams.create(
        "trimmed-spark", 3, 2, 2, mode="unbounded", rollover={"max_entries": 3},
        retention={"size_bytes": 300}))  # fmt: skip
    published = []
    for part in range(6):  # a fragment rolls from the LAC on: give it a few to roll from
        published += publish(uri, "trimmed-spark", values[10 * part : 10 * (part + 1)])
    run(uri, lambda client: client.streams.trim("trimmed-spark"))

    async def first_entry(client: Client) -> int:
        return (await client.ledgers.metadata(published[0].ledger_id)).first_entry_id

    first = run(uri, first_entry)
    assert first > 0
    kept = [v for v, i in zip(values, published, strict=True) if i.entry_id >= first]
    assert 0 < len(kept) < len(values)
    rows = _read(spark, uri, "trimmed-spark").collect()
    rows.sort(key=lambda r: (r.entry_id, r.batch_index))
    assert [bytes(r.value) for r in rows] == kept


def test_a_partitioned_stream_reads_as_one_source_with_offsets_per_partition(
    spark: SparkSession, uri: str
) -> None:
    run(uri, lambda client: client.streams.create("parted", 3, 2, 2, partitions=3))
    values = [f"m{i}".encode() for i in range(60)]

    async def send(client: Client) -> None:
        producer = await client.create_producer("parted")
        for i, value in enumerate(values):
            await producer.send_async(value, key=f"k{i % 6}")
        await producer.close()  # (its ledgers' LACs published: readers see every message)

    run(uri, send)
    df = _read(spark, uri, "parted")
    rows = df.collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(values)
    assert {r.stream for r in rows} == {f"parted-partition-{i}" for i in range(3)}
    # Offsets are per partition: from the end of partition 0, only the others' messages.
    ends = {f"parted-partition-{i}": "earliest" for i in range(3)}
    ends["parted-partition-0"] = "latest"
    later = _read(spark, uri, "parted", startingOffsets=json.dumps(ends)).collect()
    assert {r.stream for r in later} == {"parted-partition-1", "parted-partition-2"}
    assert len(later) == len([r for r in rows if r.stream != "parted-partition-0"])
