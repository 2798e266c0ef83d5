"""Every `streamlib bench` runs end to end and prints its figures (tiny sizes; speed is
never asserted: benchmarks report it)."""

import subprocess
import sys

import pytest

STREAMLIB = [sys.executable, "-m", "streamlib.cli", "bench"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["protocol", "--entries", "2000"], ["entries/s", "acks/s"]),
        (["metadata", "--seconds", "0.3"], ["ops/s", "p99"]),
        (
            ["ledger", "--entries", "300", "--window", "50", "--recovery-entries", "20"],
            ["appends/s", "p999", "recovery of an open ledger"],
        ),
        (
            [
                "stream",
                "--messages",
                "500",
                "--rate",
                "200",
                "--seconds",
                "0.5",
                "--blocking-sends",
                "50",
            ],
            [
                "blocking send",
                "publish throughput",
                "end-to-end (a consumer tailing)",
                "a consumer of another client",
                "catch-up reads",
                "consumer catch-up",
            ],
        ),
        (
            ["service", "--messages", "400", "--rate", "200", "--seconds", "0.5"],
            [
                "publish, service, 4 producers",
                "consume, service, 4 shared consumers",
                "latency through the broker",
                "end-to-end p50",
            ],
        ),
        (
            [
                "failover",
                "--kills",
                "1",
                "--stops",
                "0",
                "--loaded-kills",
                "1",
                "--quiet-seconds",
                "1",
                "--session-timeout",
                "30",
            ],
            [
                "broker SIGKILL -> first ack via the next owner",
                "killed broker restarted",
                "every core busy",
                "takeovers nobody needed",
            ],
        ),
        (
            ["spark", "--sink", "--messages", "300", "--runs", "1"],
            [
                "spark sink",
                "service, 1 task ",
                "service, 2 tasks",
                "service, 4 tasks",
                "the driver publishing every row",
                "rows/s",
            ],
        ),
        (
            ["compaction", "--updates", "2000", "--keys", "100", "--more", "200"],
            ["first compaction", "incremental", "compacted read", "TableView start"],
        ),
        (
            ["service", "--streams", "20", "--clients", "2", "--seconds", "2"],
            [
                "all opened in",
                "broker RSS",
                "sending, the bookies / clients",
                "ledgers / open ledgers",
                "end-to-end p50 / p99",
            ],
        ),
    ],
    ids=[
        "protocol",
        "metadata",
        "ledger",
        "stream",
        "service",
        "failover",
        "spark-sink",
        "compaction",
        "service-streams",
    ],
)
def test_benchmark_prints_its_figures(args, expected):
    result = subprocess.run([*STREAMLIB, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for text in expected:
        assert text in result.stdout, result.stdout
