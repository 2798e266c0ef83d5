"""`streamlib bench bookie`: one real bookie, 1 KiB entries, N in flight on the add
stream (the benchmark itself lives with the bookie: bookie/bench.py)."""

from __future__ import annotations

from typing import Any

from bookie.bench import add_bench_args, main_bench


def add_parser(which: Any) -> None:
    parser = which.add_parser(
        "bookie", help="one bookie: acknowledged entries/s, ack latency, fsyncs"
    )
    add_bench_args(parser)
    parser.set_defaults(run=main_bench)
