"""examples/spark_stream.py counts the words of a stream (run in the shared session)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_stream.py"


def test_word_count_example(spark: SparkSession, uri: str, capsys: pytest.CaptureFixture) -> None:
    spec = importlib.util.spec_from_file_location("spark_stream_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(uri, spark) == 0
    out = capsys.readouterr().out
    assert "the      3" in out
    assert out.rstrip().endswith("spark_stream example: OK")
