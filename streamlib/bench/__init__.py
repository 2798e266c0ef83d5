"""`streamlib bench ...`: benchmarks that print figures. Tests check behaviour, never speed.

Each benchmark starts what it needs (real `bookie serve` processes over a sqlite
metadata store in a temporary directory) and stops it before it returns.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    from streamlib.bench import (
        bookie,
        compaction,
        failover,
        ledger,
        metadata,
        protocol,
        pulsar,
        service,
        spark,
        stream,
    )

    parser = commands.add_parser("bench", help="run a benchmark and print its figures")
    which = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for module in (
        protocol, metadata, bookie, ledger, stream, service, failover, pulsar, spark, compaction,
    ):  # fmt: skip
        module.add_parser(which)


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def p50_p99_ms(key: str, latencies: list[float]) -> dict[str, float]:
    """{KEY_p50_ms, KEY_p99_ms} of latencies given in seconds (sorted here, in place)."""
    latencies.sort()
    return {
        f"{key}_p50_ms": 1000 * percentile(latencies, 0.5),
        f"{key}_p99_ms": 1000 * percentile(latencies, 0.99),
    }


__all__ = ["argparse", "p50_p99_ms", "percentile"]
