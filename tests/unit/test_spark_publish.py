"""The Spark sink's numbering of rows through the stream service: a name's sequence ids
only grow across batches, a retry numbers its rows as the first attempt did, and a row
goes to the same partition of a partitioned stream on every attempt."""

from __future__ import annotations

import pytest

from streamlib.protocol.errors import BadRequestError
from streamlib.spark.publish import (
    MAX_BATCH_ID,
    MAX_ROWS_PER_TASK,
    TaskOutcome,
    _route,
    batch_of,
    check_outcomes,
    producer_name,
    sequence_id,
)


def test_every_row_of_a_batch_comes_before_every_row_of_the_next() -> None:
    assert sequence_id(0, 0) == 0
    assert sequence_id(3, MAX_ROWS_PER_TASK - 1) < sequence_id(4, 0)
    assert sequence_id(MAX_BATCH_ID, MAX_ROWS_PER_TASK - 1) == 2**63 - 1  # int64's largest
    assert [batch_of(sequence_id(b, r)) for b, r in ((0, 5), (7, 0), (7, 2**32 - 1))] == [0, 7, 7]
    assert batch_of(-1) == -1  # a name that published nothing


@pytest.mark.parametrize(
    ("batch", "row"), [(-1, 0), (MAX_BATCH_ID + 1, 0), (0, -1), (0, MAX_ROWS_PER_TASK)]
)
def test_ids_out_of_range_are_refused(batch: int, row: int) -> None:
    with pytest.raises(BadRequestError):
        sequence_id(batch, row)


def test_a_row_goes_to_the_same_partition_on_every_attempt() -> None:
    keys = [f"k{i}" if i % 3 else None for i in range(50)]
    first = [_route(key, i, 4) for i, key in enumerate(keys)]
    assert first == [_route(key, i, 4) for i, key in enumerate(keys)]
    assert {first[i] for i in range(0, 50, 3)} == {0, 1, 2, 3}  # keyless rows by index
    assert {_route("k1", i, 4) for i in range(10)} == {_route("k1", 0, 4)}  # a key, one place
    assert _route(None, 7, 1) == 0


def test_names_and_the_drivers_check() -> None:
    assert producer_name("q1", 3) == "spark-q1-3"
    outcomes = [TaskOutcome(0, 2, 10, 0), TaskOutcome(1, 2, 5, 5)]
    assert check_outcomes(outcomes, 2) == 15
    with pytest.raises(BadRequestError, match="batch"):
        check_outcomes(outcomes, 3)
