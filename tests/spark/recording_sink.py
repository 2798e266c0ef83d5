"""`format("streamlib-recording")`: the streamlib sink, with the commit messages the
driver received appended to the file of option "record" (one pickled list per commit),
and, given option "failAfter" = K, a first attempt of partition 0's task that publishes
its first K rows and then fails (Spark tries the task again).

It lives in a module of its own so that Spark's Python workers can import the classes
(the driver's commit and the tasks run in other processes than the test)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from streamlib.spark.sink import StreamlibStreamWriter, StreamlibWriter, _publish_task
from streamlib.spark.source import StreamlibDataSource


class InjectedTaskFailure(RuntimeError):
    """The test's failure of a task's first attempt, after it published part of its rows."""


def read_commits(path: Path) -> list[list[WriterCommitMessage | None]]:
    """Every commit's messages, in order."""
    commits = []
    with path.open("rb") as f:
        while True:
            try:
                commits.append(pickle.load(f))
            except EOFError:
                return commits


def _record(path: str, messages: list[WriterCommitMessage | None]) -> None:
    with open(path, "ab") as f:
        pickle.dump(messages, f)


class RecordingWriter(StreamlibWriter):
    def __init__(self, options: Any, schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.record = options["record"]
        self.fail_after = int(options.get("failAfter") or -1)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        assert context is not None
        if self.fail_after >= 0 and context.partitionId() == 0 and context.attemptNumber() == 0:
            rows = list(iterator)[: self.fail_after]
            _publish_task(self.options, self.job_id, 0, iter(rows))  # durable when it returns
            raise InjectedTaskFailure(f"partition 0 failed after publishing {len(rows)} rows")
        return super().write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _record(self.record, messages)
        super().commit(messages)


class RecordingStreamWriter(StreamlibStreamWriter):
    def __init__(self, options: Any, schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.record = options["record"]

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _record(self.record, messages)
        super().commit(messages, batchId)


class RecordingDataSource(StreamlibDataSource):
    @classmethod
    def name(cls) -> str:
        return "streamlib-recording"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return RecordingWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return RecordingStreamWriter(self.options, schema, overwrite)
