"""Found by PySpark's data source lookup (a top-level `pyspark_*` package with a
`DefaultSource`), so `.format("streamlib")` works without registering it by hand."""

from streamlib.spark.source import StreamlibDataSource as DefaultSource

__all__ = ["DefaultSource"]
