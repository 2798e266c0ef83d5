"""`streamlib bench compaction`: how fast a changelog compacts, and what reading it
compacted saves. A changelog of --updates messages over --keys keys is published to 3
local bookies; then the figures: a first compaction (messages read per second), an
incremental one after --more updates, a compacted read and a plain read of the whole
stream (messages per second, and how many), and a TableView's start."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from streamlib.bench.cluster import local_cluster
from streamlib.client import Client
from streamlib.stream.positions import EARLIEST


async def _publish(client: Client, stream: str, first: int, count: int, args: Any) -> None:
    producer = await client.create_producer(stream)
    value = b"x" * args.value_bytes
    for i in range(first, first + count):
        await producer.send_async(value, key=f"key-{i % args.keys}")
    await producer.flush()
    await producer.close()


async def _read(client: Client, stream: str, compacted: bool) -> tuple[int, float]:
    started = time.perf_counter()
    reader = await client.create_reader(stream, EARLIEST, read_compacted=compacted)
    count = 0
    while await reader.has_message_available():
        await reader.read_next(timeout=60)
        count += 1
    await reader.close()
    return count, time.perf_counter() - started


async def _run(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    client = await Client.connect(uri)
    try:
        stream = "changelog"
        await _publish(client, stream, 0, args.updates, args)
        started = time.perf_counter()
        first = await client.streams.compact(stream)
        first_s = time.perf_counter() - started
        await _publish(client, stream, args.updates, args.more, args)
        started = time.perf_counter()
        again = await client.streams.compact(stream)
        again_s = time.perf_counter() - started
        compacted, compacted_s = await _read(client, stream, True)
        plain, plain_s = await _read(client, stream, False)
        started = time.perf_counter()
        view = await client.create_table_view(stream)
        view_s = time.perf_counter() - started
        keys = len(view)
        await view.close()
        return {
            "first_read": first.read_messages, "first_s": first_s,
            "first_bytes": first.size_bytes, "keys": first.keys,
            "again_read": again.read_messages, "again_s": again_s,
            "compacted_read": compacted, "compacted_s": compacted_s,
            "plain_read": plain, "plain_s": plain_s,
            "table_keys": keys, "table_s": view_s,
        }  # fmt: skip
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    with local_cluster(3) as cluster:
        r = asyncio.run(_run(cluster.metadata_uri, args))
    print(
        f"compaction: {args.updates:,} updates of {args.value_bytes} B over {args.keys:,} keys,"
        f" 3 local bookies (E3/Qw2/Qa2)\n"
        f"  first compaction     {r['first_read'] / r['first_s']:,.0f} msgs/s read"
        f" ({r['first_read']:,} messages in {r['first_s']:.2f} s; view: {r['keys']:,} keys,"
        f" {r['first_bytes']:,} B)\n"
        f"  incremental          {r['again_read'] / r['again_s']:,.0f} msgs/s read"
        f" (the view and {args.more:,} new updates: {r['again_read']:,} messages in"
        f" {r['again_s']:.2f} s)\n"
        f"  compacted read       {r['compacted_read']:,} messages in {r['compacted_s']:.2f} s\n"
        f"  plain read           {r['plain_read']:,} messages in {r['plain_s']:.2f} s\n"
        f"  TableView start      {r['table_keys']:,} keys in {r['table_s']:.2f} s",
        flush=True,
    )
    return 0


def add_parser(which: Any) -> None:
    parser = which.add_parser("compaction", help="compaction and compacted reads of a changelog")
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--more", type=int, default=20_000, help="updates before the second")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.set_defaults(run=run)
