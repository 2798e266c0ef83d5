"""A word count over a stream with Spark Structured Streaming (the `streamlib` format).

    streamlib sandbox &                            # a local cluster, in another terminal
    python examples/spark_stream.py [METADATA_URI] # default: the sandbox's

Publishes a few lines to a fresh stream, then runs a streaming query that reads the
stream in micro-batches (Trigger.AvailableNow: everything published so far, then stop),
splits the values into words and counts them.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

import streamlib
import streamlib.spark
from streamlib.sandbox import default_metadata_uri

LINES = ["the quick brown fox", "jumps over the lazy dog", "the dog sleeps"]


def word_count(spark: Any, uri: str, stream: str) -> dict[str, int]:
    from pyspark.sql import functions as F

    lines = (
        spark.readStream.format("streamlib")
        .option("metadata", uri)
        .option("stream", stream)
        .option("startingOffsets", "earliest")
        .load()
    )
    words = lines.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
    table = f"word_counts_{uuid.uuid4().hex[:8]}"
    query = (
        words.groupBy("word")
        .count()
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName(table)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    counts = {row.word: row["count"] for row in spark.sql(f"SELECT * FROM {table}").collect()}
    print(f"{len([p for p in query.recentProgress if p['numInputRows']])} micro-batches")
    return counts


def main(uri: str, spark: Any = None) -> int:
    stream = f"example-spark-{uuid.uuid4().hex[:8]}"  # fresh each run: reruns are independent
    with streamlib.connect(uri) as client:
        producer = client.create_producer(stream)
        for line in LINES:
            producer.send(line.encode())
        producer.close()  # closes the ledger: every message is readable now
    print(f"published {len(LINES)} lines to {stream!r}")

    own = spark is None
    if own:
        from pyspark.sql import SparkSession

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need streamlib
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
    try:
        streamlib.spark.register(spark)
        counts = word_count(spark, uri, stream)
    finally:
        if own:
            spark.stop()
    for word, count in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0])):
        print(f"{word:8} {count}")
    expected: dict[str, int] = {}
    for word in " ".join(LINES).split():
        expected[word] = expected.get(word, 0) + 1
    if counts != expected:
        print(f"unexpected counts: {counts}", file=sys.stderr)
        return 1
    with streamlib.connect(uri) as client:
        client.streams.delete(stream)
    print("spark_stream example: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else default_metadata_uri()))
