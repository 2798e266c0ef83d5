"""`streamlib bench metadata`: compare-and-swap operations per second on a metadata
store (a temporary sqlite store unless --uri names one, e.g. a zk:// URI)."""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

from metadata.bench import cas_benchmark


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="streamlib-bench-") as tmp:
        uri = args.uri or f"sqlite://{tmp}/meta.db"
        result = cas_benchmark(uri, args.seconds)
    print(
        f"metadata CAS on {uri.split('://')[0]}: {result['cas_ops_per_s']:,.0f} ops/s  "
        f"p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms"
    )
    return 0


def add_parser(which: Any) -> None:
    parser = which.add_parser("metadata", help="metadata store compare-and-swap ops/s")
    parser.add_argument("--uri", help="metadata store (default: a temporary sqlite store)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.set_defaults(run=run)
