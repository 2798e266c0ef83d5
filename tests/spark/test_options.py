"""Bad options of the `streamlib` format get typed errors, before any Spark job runs;
the format is found by PySpark's lookup of top-level `pyspark_*` packages."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
from pyspark.sql.datasource import DataSource

from streamlib.protocol.errors import BadRequestError
from streamlib.spark.plan import InvalidOffsetsError, split_budget
from streamlib.spark.source import Options
from streamlib.stream.positions import EARLIEST, MessageId

BASE = {"metadata": "sqlite:///nowhere/meta.db", "stream": "a, b"}


def test_options_parse_streams_and_offsets() -> None:
    options = Options({**BASE, "startingOffsets": '{"a": "3:4:5"}', "maxMessagesPerTrigger": "10"})
    assert options.streams == ["a", "b"]
    assert options.starting == {"a": MessageId(3, 4, 5), "b": "earliest"}
    assert options.ending == {"a": "latest", "b": "latest"}
    assert options.max_messages == 10
    assert Options({**BASE, "startingOffsets": "LATEST"}).starting == {"a": "latest", "b": "latest"}


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"stream": "a"}, BadRequestError),
        ({"metadata": "sqlite:///x"}, BadRequestError),
        ({**BASE, "stream": "a,a"}, BadRequestError),
        ({**BASE, "startingOffsets": "yesterday"}, InvalidOffsetsError),
        ({**BASE, "startingOffsets": "[1]"}, InvalidOffsetsError),
        ({**BASE, "startingOffsets": '{"c": "1:1:1"}'}, InvalidOffsetsError),
        ({**BASE, "endingOffsets": '{"a": "1:x"}'}, InvalidOffsetsError),
        ({**BASE, "endingOffsets": '{"a": 5}'}, InvalidOffsetsError),
        ({**BASE, "maxMessagesPerTrigger": "0"}, BadRequestError),
        ({**BASE, "entriesPerPartition": "many"}, BadRequestError),
    ],
)
def test_bad_options_are_typed_errors(options: dict[str, str], error: type[Exception]) -> None:
    with pytest.raises(error):
        Options(options)


def test_budget_is_shared_without_exceeding_it() -> None:
    assert split_budget(10, ["a", "b", "c"]) == {"a": 4, "b": 3, "c": 3}
    assert sum(split_budget(1, ["a", "b"]).values()) == 1
    assert MessageId(0, 0, 0) > EARLIEST


def test_pyspark_lookup_finds_the_default_source() -> None:
    root = str(Path(__file__).resolve().parents[2])
    found = [m.name for m in pkgutil.iter_modules([root]) if m.name.startswith("pyspark_")]
    assert found == ["pyspark_streamlib"]
    source = importlib.import_module("pyspark_streamlib").DefaultSource
    assert issubclass(source, DataSource) and source.name() == "streamlib"
