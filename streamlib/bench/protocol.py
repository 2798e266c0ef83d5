"""`streamlib bench protocol`: the sans-I/O ack path alone."""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from streamlib.protocol import AckTracker, write_set


def bench_protocol(
    entries: int, ensemble: int, write_quorum: int, ack_quorum: int
) -> dict[str, Any]:
    """Cost of the sans-I/O ack path alone: acks processed per second."""
    rnd = random.Random(1)
    tracker = AckTracker(ack_quorum)
    acks: list[tuple[int, int]] = []
    for entry in range(entries):
        ws = write_set(entry, ensemble, write_quorum)
        tracker.add_pending(entry, ws)
        acks += [(entry, b) for b in ws]
    # Acks arrive roughly in order with local jitter, as they do from bookies.
    for i in range(0, len(acks) - 1, 7):
        j = min(len(acks) - 1, i + rnd.randrange(1, 8))
        acks[i], acks[j] = acks[j], acks[i]
    start = time.perf_counter()
    for entry, bookie in acks:
        tracker.on_ack(entry, bookie)
    elapsed = time.perf_counter() - start
    assert tracker.last_add_confirmed == entries - 1
    return {
        "entries": entries,
        "acks_per_s": len(acks) / elapsed,
        "entries_per_s": entries / elapsed,
    }


def _run_protocol(args: argparse.Namespace) -> int:
    result = bench_protocol(args.entries, args.ensemble, args.write_quorum, args.ack_quorum)
    print(
        f"protocol ack tracking: {result['entries']} entries, "
        f"{result['entries_per_s']:,.0f} entries/s, {result['acks_per_s']:,.0f} acks/s"
    )
    return 0


def add_parser(which: Any) -> None:
    proto = which.add_parser("protocol", help="the sans-I/O ack path alone")
    proto.add_argument("--entries", type=int, default=200_000)
    proto.add_argument("--ensemble", type=int, default=3)
    proto.add_argument("--write-quorum", type=int, default=3)
    proto.add_argument("--ack-quorum", type=int, default=2)
    proto.set_defaults(run=_run_protocol)
