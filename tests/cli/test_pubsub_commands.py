"""`streamlib produce | consume | read` against a real sandbox, output checked -- in
direct mode (--metadata names the metadata store) and through the stream service
(--metadata names the sandbox's broker), the same way."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import streamlib
from streamlib.sandbox import Sandbox
from tests.cli.conftest import assert_one_line_error, run_cli


@pytest.fixture(scope="module", params=["direct", "service"])
def uri(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    box = Sandbox(tmp_path_factory.mktemp("sandbox"), bookies=3, port_base=0)
    box.start()
    try:
        yield box.metadata_uri if request.param == "direct" else box.service_url
    finally:
        box.stop()


def _ids(lines: list[str]) -> list[str]:
    return [line.split()[0] for line in lines]


def test_produce_prints_ids_and_read_shows_messages_with_key_and_properties(uri: str) -> None:
    produced = run_cli("produce", "orders", "-m", "first", "-m", "zweite ü", "-k", "c1",
                       "-p", "region=eu", "-p", "n=1", metadata=uri)  # fmt: skip
    assert produced.code == 0, produced
    ids = produced.lines
    assert len(ids) == 2 and all(len(i.split(":")) == 3 for i in ids)
    assert "produced 2 messages to 'orders'" in produced.err

    read = run_cli("read", "orders", "--from", "earliest", metadata=uri)
    assert read.code == 0, read
    assert read.lines == [
        f"{ids[0]}  first  [key=c1 n=1 region=eu]",
        f"{ids[1]}  zweite ü  [key=c1 n=1 region=eu]",
    ]
    assert "read 2 messages" in read.err

    after_first = run_cli("read", "orders", "--from", ids[0], "-n", "1", "--json", metadata=uri)
    record = json.loads(after_first.out)
    assert record["id"] == ids[1] and record["data"] == "zweite ü"
    assert record["key"] == "c1" and record["properties"] == {"region": "eu", "n": "1"}
    assert record["publish_time_ms"] > 0

    latest = run_cli("read", "orders", "--from", "latest", metadata=uri)
    assert latest.code == 0 and latest.out == ""


def test_produce_from_a_file_and_binary_payloads_show_as_base64(uri: str, tmp_path: Path) -> None:
    lines = tmp_path / "messages.txt"
    lines.write_bytes(b"alpha\n\nbeta\n\xff\xfe\x00\n")
    produced = run_cli("produce", "lines", "--file", str(lines), "--json", metadata=uri)
    assert produced.code == 0, produced
    assert len([json.loads(line)["id"] for line in produced.lines]) == 3  # the empty line skipped
    from_stdin = run_cli("produce", "lines", "--file", "-", "-z", "zstd", stdin=b"gamma\n",
                         metadata=uri)  # fmt: skip
    assert from_stdin.code == 0 and len(from_stdin.lines) == 1

    read = run_cli("read", "lines", metadata=uri)
    shown = [line.split("  ", 1)[1] for line in read.lines]
    binary = "base64:" + base64.b64encode(b"\xff\xfe\x00").decode()
    assert shown == ["alpha", "beta", binary, "gamma"]


def test_consume_acknowledges_so_the_subscription_resumes_after_them(uri: str) -> None:
    run_cli("produce", "jobs", *[a for i in range(5) for a in ("-m", f"job {i}")], metadata=uri)
    first = run_cli("consume", "jobs", "-s", "workers", "--initial-position", "earliest",
                    "-n", "3", metadata=uri)  # fmt: skip
    assert first.code == 0, first
    assert [line.split("  ")[1] for line in first.lines] == ["job 0", "job 1", "job 2"]
    assert "consumed and acknowledged 3 messages on 'jobs' subscription 'workers'" in first.err

    rest = run_cli("consume", "jobs", "-s", "workers", "-n", "0", "--timeout", "1", "--json",
                   metadata=uri)  # fmt: skip
    assert rest.code == 0, rest
    assert [json.loads(line)["data"] for line in rest.lines] == ["job 3", "job 4"]

    nothing_left = run_cli("consume", "jobs", "-s", "workers", "-n", "1", "--timeout", "0.5",
                           metadata=uri)  # fmt: skip
    assert_one_line_error(nothing_left, "TimeoutError", "received 0 of 1 messages")


def test_metadata_comes_from_the_environment_when_not_given(uri: str) -> None:
    run_cli("produce", "env-stream", "-m", "hi", metadata=uri)
    read = run_cli("read", "env-stream", env={"STREAMLIB_METADATA": uri})
    assert read.code == 0 and read.lines[0].endswith("  hi")


def test_errors_are_one_line_and_exit_1(uri: str, tmp_path: Path) -> None:
    assert_one_line_error(run_cli("read", "no-such-stream", metadata=uri), "NoSuchStreamError")
    assert_one_line_error(
        run_cli("read", "orders", "--from", "not-an-id", metadata=uri), "InvalidPositionError"
    )
    missing = f"sqlite://{tmp_path / 'nowhere' / 'meta.db'}"
    assert_one_line_error(
        run_cli("consume", "s", "-s", "x", metadata=missing), "NoMetadataStoreError", "sandbox"
    )
    assert_one_line_error(
        run_cli("produce", "s", "--file", str(tmp_path / "absent.txt"), metadata=uri),
        "cannot read",
    )


def test_consume_is_refused_while_another_consumer_holds_the_subscription(uri: str) -> None:
    run_cli("produce", "held", "-m", "one", metadata=uri)
    client = streamlib.connect(uri)
    try:
        holder = client.subscribe("held", "workers", "earliest", consumer_name="holder")
        busy = run_cli("consume", "held", "-s", "workers", "--timeout", "1", metadata=uri)
        assert_one_line_error(busy, "ConsumerBusyError", "(exclusive, holder)")
        standby = run_cli("consume", "held", "-s", "workers", "-t", "failover", "--timeout", "1",
                          metadata=uri)  # fmt: skip
        assert_one_line_error(standby, "ConsumerBusyError", "active exclusive consumer (holder)")
        holder.close()
    finally:
        client.close()
    taken = run_cli("consume", "held", "-s", "workers", "-t", "failover", "--timeout", "5",
                    metadata=uri)  # fmt: skip
    assert taken.code == 0 and [line.split("  ")[1] for line in taken.lines] == ["one"], taken
