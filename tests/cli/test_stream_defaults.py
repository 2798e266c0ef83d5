"""Stream quorums and policies as an operator sets them: a one-bookie sandbox takes
`streamlib produce` at once (its defaults follow --bookies), `admin streams create`
takes every policy, and `admin streams defaults` shows and sets the cluster's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamlib.sandbox import Sandbox
from tests.cli.conftest import assert_one_line_error, run_cli


@pytest.fixture
def one_bookie(tmp_path: Path) -> Iterator[str]:
    box = Sandbox(tmp_path / "sandbox", bookies=1, port_base=0).start()
    try:
        yield box.metadata_uri
    finally:
        box.stop()


def test_a_one_bookie_sandbox_takes_a_produce_at_once(one_bookie: str) -> None:
    produced = run_cli("produce", "t", "-m", "x", metadata=one_bookie)
    assert produced.code == 0, produced
    read = run_cli("read", "t", metadata=one_bookie)
    assert read.code == 0 and read.lines[0].endswith("  x")
    shown = json.loads(run_cli("admin", "streams", "show", "t", "--json", metadata=one_bookie).out)
    config = shown["config"]
    assert (config["ensemble"], config["write_quorum"], config["ack_quorum"]) == (1, 1, 1)
    defaults = json.loads(
        run_cli("admin", "streams", "defaults", "--json", metadata=one_bookie).out
    )
    assert (defaults["ensemble"], defaults["write_quorum"], defaults["ack_quorum"]) == (1, 1, 1)


def test_create_takes_every_policy_and_defaults_are_set_for_the_cluster(uri: str) -> None:
    # The module's sandbox has three bookies: nothing set, the built-in E3/Qw2/Qa2.
    builtin = json.loads(run_cli("admin", "streams", "defaults", "--json", metadata=uri).out)
    assert (builtin["ensemble"], builtin["write_quorum"], builtin["ack_quorum"]) == (3, 2, 2)

    made = run_cli("admin", "streams", "create", "orders-x", "--ensemble", "3",
                   "--write-quorum", "3", "--ack-quorum", "2", "--rollover-entries", "5",
                   "--retention-ms", "60000", "--json", metadata=uri)  # fmt: skip
    assert made.code == 0, made
    shown = json.loads(run_cli("admin", "streams", "show", "orders-x", "--json", metadata=uri).out)
    assert shown["config"]["write_quorum"] == 3
    assert shown["config"]["rollover"]["max_entries"] == 5
    assert shown["config"]["retention"]["time_ms"] == 60000
    assert_one_line_error(
        run_cli("admin", "streams", "create", "orders-x", metadata=uri), "StreamExistsError"
    )
    assert_one_line_error(
        run_cli("admin", "streams", "create", "bad", "--ensemble", "2", "--write-quorum", "3",
                metadata=uri),
        "InvalidLedgerConfigError",
    )  # fmt: skip

    set_ = run_cli("admin", "streams", "defaults", "--write-quorum", "3", "--retention-bytes",
                   "1000000", "--json", metadata=uri)  # fmt: skip
    assert set_.code == 0, set_
    now = json.loads(set_.out)
    assert (now["ensemble"], now["write_quorum"], now["ack_quorum"]) == (3, 3, 2)
    assert now["retention"]["size_bytes"] == 1_000_000
    run_cli("produce", "auto-made", "-m", "x", metadata=uri)  # a stream made by a producer
    auto = json.loads(run_cli("admin", "streams", "show", "auto-made", "--json", metadata=uri).out)
    assert auto["config"]["write_quorum"] == 3
    assert auto["config"]["retention"]["size_bytes"] == 1_000_000
    run_cli(
        "admin",
        "streams",
        "defaults",
        "--write-quorum",
        "2",
        "--retention-bytes",
        "0",
        metadata=uri,
    )  # fmt: skip  (as the other tests of this sandbox expect)


def test_create_a_partitioned_stream(uri: str) -> None:
    # `streamlib streams` is `streamlib admin streams`.
    made = run_cli("streams", "create", "sharded", "--partitions", "2", metadata=uri)
    assert made.code == 0 and "in 2 partitions" in made.out, made
    listed = run_cli("admin", "streams", "list", "--json", metadata=uri)
    names = {r["name"] for r in json.loads(listed.out)}
    assert {"sharded", "sharded-partition-0", "sharded-partition-1"} <= names
    run_cli("produce", "sharded", "-m", "a", "-m", "b", "-k", "k1", metadata=uri)
    consumed = run_cli("consume", "sharded", "-s", "s", "--initial-position", "earliest",
                       "-n", "2", metadata=uri)  # fmt: skip
    assert consumed.code == 0 and [line.split("  ")[1] for line in consumed.lines] == ["a", "b"]
