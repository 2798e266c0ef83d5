"""`streamlib bench ledger`: appends/s and latency percentiles of the ledger client on
three local bookies, and the recovery time of an open ledger."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from streamlib.bench import percentile
from streamlib.bench.cluster import local_cluster
from streamlib.client import Client


async def _appends(uri: str, args: argparse.Namespace) -> dict[str, float]:
    client = await Client.connect(uri)
    try:
        writer = await client.ledgers.create(args.ensemble, args.write_quorum, args.ack_quorum)
        payload = b"x" * args.entry_bytes
        latencies: list[float] = []
        in_flight = 0
        room = asyncio.Event()
        # Keep the window full: whenever acknowledgements free room, append that many
        # entries in one call (as a pipelined producer does); time every entry.
        start = time.perf_counter()
        sent = 0
        futures: list[asyncio.Future[int]] = []
        while sent < args.entries:
            free = min(args.window - in_flight, args.entries - sent, args.max_batch)
            if free <= 0:
                room.clear()
                await room.wait()
                continue
            sent_at = time.perf_counter()
            futures = writer.append_nowait([payload] * free)

            def done(_: asyncio.Future[int], sent_at: float = sent_at) -> None:
                nonlocal in_flight
                latencies.append(time.perf_counter() - sent_at)
                in_flight -= 1
                room.set()

            for future in futures:
                future.add_done_callback(done)
            in_flight += free
            sent += free
            await asyncio.sleep(0)  # let the streams move before topping up
        await asyncio.gather(*futures)
        elapsed = time.perf_counter() - start
        await writer.close()

        # Recovery time of an OPEN ledger with a tail of entries, from another client.
        open_writer = await client.ledgers.create(args.ensemble, args.write_quorum, args.ack_quorum)
        await open_writer.append_many([payload] * args.recovery_entries)
        reader_client = await Client.connect(uri)
        try:
            t0 = time.perf_counter()
            handle = await reader_client.ledgers.open(open_writer.ledger_id)
            recovery_s = time.perf_counter() - t0
            assert handle.last_entry_id == args.recovery_entries - 1
        finally:
            await reader_client.close()
    finally:
        await client.close()
    latencies.sort()
    return {
        "appends_per_s": args.entries / elapsed,
        "p50_ms": 1000 * percentile(latencies, 0.50),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "p999_ms": 1000 * percentile(latencies, 0.999),
        "recovery_ms": 1000 * recovery_s,
    }


def run(args: argparse.Namespace) -> int:
    with local_cluster(args.bookies) as cluster:
        result = asyncio.run(_appends(cluster.metadata_uri, args))
    print(
        f"ledger appends: {args.entries} x {args.entry_bytes} B, E{args.ensemble}/Qw"
        f"{args.write_quorum}/Qa{args.ack_quorum}, window {args.window} "
        f"(up to {args.max_batch} per call), "
        f"{args.bookies} local bookies\n"
        f"  {result['appends_per_s']:,.0f} appends/s   latency p50 {result['p50_ms']:.1f} ms"
        f"  p99 {result['p99_ms']:.1f} ms  p999 {result['p999_ms']:.1f} ms\n"
        f"  recovery of an open ledger ({args.recovery_entries} entries): "
        f"{result['recovery_ms']:.0f} ms"
    )
    return 0


def add_parser(which: Any) -> None:
    parser = which.add_parser("ledger", help="ledger client appends/s, latency, recovery time")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--window", type=int, default=5000, help="appends in flight")
    parser.add_argument(
        "--max-batch", type=int, default=500, help="most entries handed over in one call"
    )
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--ensemble", type=int, default=3)
    parser.add_argument("--write-quorum", type=int, default=2)
    parser.add_argument("--ack-quorum", type=int, default=2)
    parser.add_argument("--recovery-entries", type=int, default=1000)
    parser.set_defaults(run=run)
