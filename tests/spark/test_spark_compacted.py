"""option("readCompacted", "true"): Spark reads a compacted stream as a compacted Reader
does -- the view (each key once, at its latest as of the horizon, with the id the stream
gave it) then every message after the horizon -- in batch and micro-batch reads, against
real bookies in the shared local session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from streamlib.client import Client
from streamlib.protocol.errors import BadRequestError
from streamlib.spark import plan
from streamlib.spark.source import Options
from streamlib.stream.positions import EARLIEST, MessageId
from tests.spark.conftest import create_stream, publish_each, run
from tests.spark.test_read import _stream_to_parquet

pytestmark = pytest.mark.timeout(120)

Update = tuple[str | None, bytes]


def _publish(uri: str, stream: str, updates: list[Update]) -> list[MessageId]:
    """Updates (key, value), several to an entry; their ids, once readers see them."""
    messages = [(value, {} if key is None else {"key": key}) for key, value in updates]
    return publish_each(uri, stream, messages, batching_max_messages=7)


def _compact(uri: str, stream: str) -> Any:
    result = run(uri, lambda client: client.streams.compact(stream))
    assert result.compacted
    return result


def _compacted_reader(uri: str, stream: str, start: MessageId = EARLIEST) -> list[tuple]:
    """(key, value, id) of what a compacted Reader after `start` reads up to the end now."""

    async def work(client: Client) -> list[tuple]:
        reader = await client.create_reader(stream, start, read_compacted=True)
        found = []
        while await reader.has_message_available():
            m = await reader.read_next(timeout=30)
            found.append((m.key, m.data, tuple(m.message_id)))
        await reader.close()
        return found

    result: list[tuple] = run(uri, work)
    return result


def _spark_rows(spark: SparkSession, uri: str, stream: str, **options: str) -> list[tuple]:
    """(key, value, id) of a batch read, in the order Spark returns it."""
    reader = spark.read.format("streamlib").option("metadata", uri).option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    return [
        (r.key, bytes(r.value), (r.ledger_id, r.entry_id, r.batch_index))
        for r in reader.load().collect()
    ]


def _changelog(stream: str, uri: str) -> tuple[list[Update], list[MessageId], list[Update]]:
    """2,000 updates of 100 keys round robin (after a key set then tombstoned and a
    message without a key: the view leaves both out), compacted; then later updates
    after the horizon. (the changelog, its ids, the later updates)"""
    create_stream(uri, stream, max_entries=40)
    sent: list[Update] = [("gone", b"soon"), (None, b"no key"), ("gone", b"")]
    sent += [(f"k{i % 100}", b"v%d" % i) for i in range(2_000)]
    ids = _publish(uri, stream, sent)
    result = _compact(uri, stream)
    assert result.keys == 100
    later: list[Update] = [("k5", b"new5"), ("k0", b"new0"), ("k5", b"newer5"), ("k200", b"+")]
    _publish(uri, stream, later)
    return sent, ids, later


def test_a_batch_read_compacted_is_the_view_then_the_updates_after_the_horizon(
    spark: SparkSession, uri: str
) -> None:
    sent, ids, later = _changelog("spark-table", uri)
    # Several partitions of the view and of the stream after it, read in parallel.
    rows = _spark_rows(
        spark, uri, "spark-table", readCompacted="true", numPartitions="4", entriesPerPartition="4"
    )
    # The 100 latest values (the last 100 updates: 1900..1999), each with its id in the
    # stream, in stream order; then every later update, in order.
    latest = [(key, value, tuple(i)) for (key, value), i in zip(sent, ids, strict=True)][-100:]
    assert rows[:100] == latest
    assert [(key, value) for key, value, _ in rows[100:]] == later
    # Exactly what a compacted Reader reads.
    assert rows == _compacted_reader(uri, "spark-table")
    # Without the option: every message of the stream.
    everything = sorted(_spark_rows(spark, uri, "spark-table"), key=lambda r: r[2])
    assert [(k, v) for k, v, _ in everything] == sent + later


def test_offsets_inside_the_view_read_what_a_compacted_reader_from_there_reads(
    spark: SparkSession, uri: str
) -> None:
    sent, ids, later = _changelog("spark-table-offsets", uri)
    start = ids[1_950]  # (in the view, likely mid-entry: 7 messages to an entry)
    rows = _spark_rows(
        spark,
        uri,
        "spark-table-offsets",
        readCompacted="true",
        startingOffsets=json.dumps({"spark-table-offsets": str(start)}),
    )
    assert rows == _compacted_reader(uri, "spark-table-offsets", start)
    assert [v for _, v, _ in rows] == [v for _, v in sent[1_951:]] + [v for _, v in later]
    # An end inside the view: the view's messages up to it, nothing of the stream after.
    end = ids[1_990]
    upto = _spark_rows(
        spark,
        uri,
        "spark-table-offsets",
        readCompacted="true",
        endingOffsets=json.dumps({"spark-table-offsets": str(end)}),
    )
    assert [v for _, v, _ in upto] == [v for _, v in sent[1_903:1_991]]


def test_a_stream_never_compacted_reads_whole(spark: SparkSession, uri: str) -> None:
    create_stream(uri, "spark-never-compacted")
    sent: list[Update] = [(f"k{i % 3}", b"m%d" % i) for i in range(30)]
    _publish(uri, "spark-never-compacted", sent)
    rows = _spark_rows(spark, uri, "spark-never-compacted", readCompacted="true")
    assert [(k, v) for k, v, _ in sorted(rows, key=lambda r: r[2])] == sent


def test_bad_read_compacted_values_are_refused_when_the_read_is_planned(
    spark: SparkSession, uri: str
) -> None:
    base = {"metadata": "sqlite:///nowhere/meta.db", "stream": "a"}
    assert Options(base).read_compacted is False
    assert Options({**base, "readCompacted": " True "}).read_compacted is True
    assert Options({**base, "readCompacted": "FALSE"}).read_compacted is False
    for value in ("yes", "1", "on"):
        with pytest.raises(BadRequestError, match="'readCompacted' must be true or false"):
            Options({**base, "readCompacted": value})
    create_stream(uri, "spark-bad-option")
    with pytest.raises(Exception, match="readCompacted' must be true or false"):
        _spark_rows(spark, uri, "spark-bad-option", readCompacted="yes")


def test_a_task_reading_a_view_replaced_since_planning_fails_rather_than_miss_keys(
    uri: str,
) -> None:
    create_stream(uri, "spark-recompacted", max_entries=40)
    _publish(uri, "spark-recompacted", [(f"k{i % 10}", b"v%d" % i) for i in range(100)])
    _compact(uri, "spark-recompacted")

    async def planned(client: Client) -> list[plan.Segment]:
        views = await plan.compacted_views(client, ["spark-recompacted"])
        end = await plan.end_position(client, "spark-recompacted")
        return await plan.plan_segments(
            client, ["spark-recompacted"], {"spark-recompacted": EARLIEST},
            {"spark-recompacted": end}, 2, None, views,
        )  # fmt: skip

    segments = run(uri, planned)
    assert segments and all(s.view and s.compacted for s in segments)
    found = [m for s in segments for m in run(uri, lambda c, s=s: plan.read_segment(c, s))]
    assert [(m.key, m.data) for m in found] == [(f"k{i % 10}", b"v%d" % i) for i in range(90, 100)]
    # Compacted again: the view planned is deleted. Its tasks fail, saying what to do.
    _publish(uri, "spark-recompacted", [("k1", b"later")])
    _compact(uri, "spark-recompacted")
    with pytest.raises(plan.CompactedViewChangedError, match="run the read again"):
        run(uri, lambda client: plan.read_segment(client, segments[0]))


def test_a_streaming_read_compacted_reads_the_view_then_follows_compactions(
    spark: SparkSession, uri: str, tmp_path: Path
) -> None:
    sent, _, later = _changelog("spark-table-stream", uri)
    # maxMessagesPerTrigger counts the messages a compacted read reads: 104 in all.
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    batches = _stream_to_parquet(
        spark, uri, "spark-table-stream", out, checkpoint,
        readCompacted="true", maxMessagesPerTrigger="60",
    )  # fmt: skip
    assert batches == [60, 44]
    # Updates after the checkpoint's offset, compacted before the next run: it reads
    # the new view's part after its offset (each key once, at its latest).
    _publish(uri, "spark-table-stream", [("k1", b"a"), ("k2", b"b"), ("k1", b"c")])
    _compact(uri, "spark-table-stream")
    again = _stream_to_parquet(
        spark, uri, "spark-table-stream", out, checkpoint, readCompacted="true"
    )
    assert again == [2]
    rows = spark.read.parquet(str(out)).collect()
    rows.sort(key=lambda r: (r.ledger_id, r.entry_id, r.batch_index))
    values = [(r.key, bytes(r.value)) for r in rows]
    assert values == sent[-100:] + later + [("k2", b"b"), ("k1", b"c")]
