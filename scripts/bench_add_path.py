"""One append in flight on a ledger (E3/Qw3/Qa2, 1 KiB) over three local bookies: the
latency of each, and the CPU per append of the client and of the bookies, with the add
stream on the bookies' framed ports and on gRPC (``--framed-port -1``), alternating.

CPU per append is read from the processes' own counters, so it says what each transport
costs even on a machine busy with other work, where latencies are noisy.

    python scripts/bench_add_path.py [--appends 3000] [--rounds 3] [--only framed]
    CLIENT_EVENT_LOOP=uvloop python scripts/bench_add_path.py   # the client on uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from pathlib import Path

# This checkout's packages, not whichever the interpreter has installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if os.environ.get("CLIENT_EVENT_LOOP") == "uvloop":
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


from streamlib.bench.cluster import local_cluster
from streamlib.client import Client


def cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds of this process, or of pid (from /proc)."""
    if pid is None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def appends(uri: str, n: int, pids: list[int]) -> dict[str, float]:
    client = await Client.connect(uri)
    try:
        ledger = await client.ledgers.create(3, 3, 2, password=b"pw")
        payload = b"x" * 1024
        for _ in range(200):  # warm up: streams open, caches filled
            await ledger.append(payload)
        cpu0, bookies0 = cpu_s(), [cpu_s(p) for p in pids]
        took = []
        for _ in range(n):
            started = time.perf_counter()
            await ledger.append(payload)
            took.append(time.perf_counter() - started)
        cpu1, bookies1 = cpu_s(), [cpu_s(p) for p in pids]
        framed = sum(c.stats.extra.get("framed_streams", 0) for c in client.pool._clients.values())
        await ledger.close()
    finally:
        await client.close()
    took.sort()
    per = 1e6 / n
    return {
        "p50_ms": 1000 * statistics.median(took),
        "p99_ms": 1000 * took[int(0.99 * len(took))],
        "client_us": (cpu1 - cpu0) * per,
        "framed_streams": framed,
        "bookie_us": statistics.mean(b1 - b0 for b0, b1 in zip(bookies0, bookies1, strict=True))
        * per,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--appends", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["grpc", "framed"], help="one transport only")
    args = parser.parse_args()
    for r in range(args.rounds):
        for name, extra in (("grpc", ["--framed-port", "-1"]), ("framed", [])):
            if args.only not in (None, name):
                continue
            with local_cluster(3, extra=extra) as cluster:
                pids = [b.proc.pid for b in cluster.bookies if b.proc is not None]
                got = asyncio.run(appends(cluster.metadata_uri, args.appends, pids))
            print(
                f"round {r + 1} {name:6}  append p50 {got['p50_ms']:.3f} ms  "
                f"p99 {got['p99_ms']:.3f} ms  CPU/append: client {got['client_us']:.0f} us, "
                f"each bookie {got['bookie_us']:.0f} us"
                f"  ({got['framed_streams']} framed streams)",
                flush=True,
            )


if __name__ == "__main__":
    main()
