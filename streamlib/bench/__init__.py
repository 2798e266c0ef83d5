"""`streamlib bench ...`: benchmarks that print figures. Tests check behaviour, never speed.

Each benchmark starts what it needs (real `bookie serve` processes over a sqlite
metadata store in a temporary directory) and stops it before it returns.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    from streamlib.bench import bookie, ledger, metadata, protocol, service, spark, stream

    parser = commands.add_parser("bench", help="run a benchmark and print its figures")
    which = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for module in (protocol, metadata, bookie, ledger, stream, service, spark):
        module.add_parser(which)


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


__all__ = ["argparse", "percentile"]
