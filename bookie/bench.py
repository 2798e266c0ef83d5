"""The add-stream benchmark: one real bookie, N entries in flight, fsync on.

Starts ``bookie serve`` (sqlite metadata in a temporary directory), drives it over
one gRPC add stream with batches of ``batch`` entries of ``entry_bytes`` each and at
most ``in_flight`` entries unacknowledged, and reports acknowledged entries/s,
p50/p99 ack latency (send of the batch to receipt of the entry's result), journal
fsyncs/s and entries per fsync (from the bookie's own metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from bookie.launcher import BookieProcess
from bookie.wire import bookie_pb2 as pb


@dataclass
class BenchResult:
    entries: int
    seconds: float
    entries_per_s: float
    p50_ms: float
    p99_ms: float
    fsyncs_per_s: float
    entries_per_fsync: float
    errors: int
    bookie_cpu_us_per_entry: float  # the bookie process's CPU (all threads) per acked entry

    def render(self) -> str:
        return (
            f"acknowledged {self.entries} entries in {self.seconds:.2f}s: "
            f"{self.entries_per_s:,.0f} entries/s; ack latency p50 {self.p50_ms:.2f} ms, "
            f"p99 {self.p99_ms:.2f} ms; {self.fsyncs_per_s:,.0f} fsyncs/s, "
            f"{self.entries_per_fsync:.1f} entries/fsync; bookie CPU "
            f"{self.bookie_cpu_us_per_entry:.1f} us/entry; errors {self.errors}"
        )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc; 0 where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def _drive(
    address: str, entries: int, entry_bytes: int, in_flight: int, batch: int
) -> tuple[float, list[float], int]:
    payload = bytes(range(256)) * (entry_bytes // 256) + b"x" * (entry_bytes % 256)
    key = b"bench-master-key"
    latencies: list[float] = []
    errors = 0
    window = asyncio.Semaphore(max(1, in_flight // batch))
    sent_at: dict[int, float] = {}
    done = asyncio.Event()
    # The requests are built and serialized before the clock starts: the client shares
    # the two cores with the bookie, and this measures the bookie, not protobuf.
    requests = [
        pb.AddRequest(
            entries=[
                pb.AddEntry(
                    ledger_id=1,
                    entry_id=i,
                    last_add_confirmed=i - 1,
                    payload=payload,
                    digest=b"d" * 4,
                    master_key=key,
                )
                for i in range(first, min(first + batch, entries))
            ]
        ).SerializeToString()
        for first in range(0, entries, batch)
    ]
    async with grpc.aio.insecure_channel(address) as channel:
        add_stream = channel.stream_stream(
            "/streamlib.bookie.v1.Bookie/AddStream",
            request_serializer=None,  # already bytes
            response_deserializer=pb.AddResponse.FromString,
        )
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def send():  # type: ignore[no-untyped-def]
            while (req := await queue.get()) is not None:
                yield req

        call = add_stream(send())
        started = time.perf_counter()

        async def produce() -> None:
            for n, req in enumerate(requests):
                await window.acquire()
                sent_at[n] = time.perf_counter()
                queue.put_nowait(req)

        async def consume() -> None:
            nonlocal errors
            acked = 0
            outstanding: dict[int, int] = {}
            async for resp in call:
                now = time.perf_counter()
                answered = [r.entry_id for r in resp.results]  # failures, in full
                errors += sum(r.status != pb.OK for r in resp.results)
                for ok in resp.ok:  # the compact OK lists
                    answered += ok.entry_ids
                for entry_id in answered:
                    b = entry_id // batch
                    latencies.append(now - sent_at[b])
                    n = outstanding.get(b, min(batch, entries - b * batch)) - 1
                    if n == 0:
                        outstanding.pop(b, None)
                        window.release()
                    else:
                        outstanding[b] = n
                acked += len(answered)
                if acked >= entries:
                    done.set()
                    return

        producer = asyncio.create_task(produce())
        await consume()
        elapsed = time.perf_counter() - started
        await producer
        queue.put_nowait(None)
        call.cancel()
    return elapsed, latencies, errors


def run_bookie_bench(
    *,
    entries: int = 100_000,
    entry_bytes: int = 1024,
    in_flight: int = 4000,
    batch: int = 100,
    workdir: Path | None = None,
    with_metadata: bool = True,
) -> BenchResult:
    """Start a real bookie, drive it, stop it; the measured figures."""
    with tempfile.TemporaryDirectory(prefix="bookie-bench-", dir=workdir) as tmp:
        root = Path(tmp)
        bookie = BookieProcess(
            root / "bookie", metadata_uri=f"sqlite:///{root / 'meta.db'}" if with_metadata else None
        )
        bookie.start()
        try:
            before = bookie.metrics_text()
            assert bookie.proc is not None
            pid = bookie.proc.pid
            cpu_before = _cpu_seconds(pid)
            elapsed, lat, errors = asyncio.run(
                _drive(bookie.address, entries, entry_bytes, in_flight, batch)
            )
            cpu = _cpu_seconds(pid) - cpu_before
            after = bookie.metrics_text()
        finally:
            bookie.stop()
    fsyncs = _metric(after, "bookie_journal_fsyncs_total") - _metric(
        before, "bookie_journal_fsyncs_total"
    )
    lat.sort()

    def pct(p: float) -> float:
        return 1000 * lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

    return BenchResult(
        entries=len(lat),
        seconds=elapsed,
        entries_per_s=len(lat) / elapsed if elapsed else 0.0,
        p50_ms=pct(0.50),
        p99_ms=pct(0.99),
        fsyncs_per_s=fsyncs / elapsed if elapsed else 0.0,
        entries_per_fsync=len(lat) / fsyncs if fsyncs else 0.0,
        errors=errors,
        bookie_cpu_us_per_entry=1e6 * cpu / len(lat) if lat else 0.0,
    )


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--entry-bytes", type=int, default=1024)
    p.add_argument("--in-flight", type=int, default=4000)
    p.add_argument("--batch", type=int, default=100, help="entries per AddRequest")
    p.add_argument(
        "--no-metadata", action="store_true", help="run the bookie without a metadata store"
    )


def main_bench(args: argparse.Namespace) -> int:
    result = run_bookie_bench(
        entries=args.entries,
        entry_bytes=args.entry_bytes,
        in_flight=args.in_flight,
        batch=args.batch,
        with_metadata=not args.no_metadata,
    )
    print(result.render())
    return 0 if result.errors == 0 else 1
