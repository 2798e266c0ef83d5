"""The PySpark data source `streamlib` (PySpark 4 Python Data Source API): batch and
micro-batch reads of streams, and a sink that publishes to a stream.

    import streamlib.spark
    streamlib.spark.register(spark)        # or rely on the `pyspark_streamlib` package
    df = (spark.readStream.format("streamlib")
          .option("metadata", "sqlite:///path/meta.db").option("stream", "events").load())

`plan` (offsets, partitions, admission control) is plain asyncio over the client and
imports no pyspark; `rows`, `source` and `sink` are the Spark side.

Must never import: the bookie server (bookie.server, bookie.storage, ...); nothing
below streamlib imports this package (pyspark is an optional extra).
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the `streamlib` format with a SparkSession."""
    from streamlib.spark.source import StreamlibDataSource

    spark.dataSource.register(StreamlibDataSource)


def value_schema(metadata: str, stream: str, **client_options: Any) -> Any:
    """The Spark StructType of a JSON-schema stream's values (streamlib.spark.schemas)."""
    from streamlib.spark.schemas import value_schema as read

    return read(metadata, stream, **client_options)


__all__ = ["register", "value_schema"]
