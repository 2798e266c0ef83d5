"""`streamlib bench service --streams N`: one broker serving N streams, each with a named
producer and a consumer of its own, every producer sending a message a second -- what a
broker costs per stream (Pulsar's many-topics case).

Client processes (--clients, each with a share of the streams) open their producers and
consumers together once told to; the time from then until every one is open is "open".
Then, for --seconds, each producer sends one small message a second carrying its send
time, and each consumer takes the difference on receipt (one host: one clock): the
end-to-end latency. Meanwhile the broker's RSS and CPU are sampled; at the end, the
streams it owns and the ledgers open in the metadata store are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamlib.bench import percentile
from streamlib.bench.cluster import local_cluster
from streamlib.chaos.resources import sample_process

IDLE_S = 5.0  # the broker's CPU is measured this long with every stream open and quiet
# A quiet stream's LAC goes to the bookies this late (`streamlib broker --quiet-lac-ms`):
# at a message a second, most entries' LAC then travels with the next add.
QUIET_LAC_MS = 1000

# argv: uri first count seconds. Says "ready" once connected, opens its streams' producers
# and consumers on "go" and says "opened SECONDS"; on the next "go" sends for `seconds`
# (a message a second per stream) and says "latencies" with every latency (ms), as JSON;
# then it waits, its producers and consumers open, until it is killed.
CLIENT = r"""
import asyncio, gc, json, sys, time
from streamlib.client import Client
from streamlib.broker.cli import GC_THRESHOLDS

gc.set_threshold(*GC_THRESHOLDS)  # (a load generator of thousands of streams: as the broker)

uri, first, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
SLICES = 50  # a second's sends, in this many slices

async def main():
    client = await Client.connect(uri)
    loop = asyncio.get_running_loop()
    readline = lambda: loop.run_in_executor(None, sys.stdin.readline)
    print("ready", flush=True)
    await readline()
    names = [f"many-{i}" for i in range(first, first + count)]
    room = asyncio.Semaphore(16)  # opens under way at once, per client
    producers, consumers = [], []

    async def open_one(name):
        async with room:
            producers.append(await client.create_producer(
                name, producer_name=f"p-{name}", batching_max_publish_delay_ms=1))
            consumers.append(await client.subscribe(name, "bench", "earliest",
                                                    receiver_queue_size=10))

    start = time.perf_counter()
    await asyncio.gather(*(open_one(name) for name in names))
    print("opened", time.perf_counter() - start, flush=True)
    await readline()
    latencies = []

    async def receive(consumer):
        while True:
            message = await consumer.receive()
            latencies.append(1000 * (time.time() - float(message.data)))
            consumer.acknowledge(message)

    receivers = [loop.create_task(receive(c)) for c in consumers]
    # Each producer sends once a second, the producers spread evenly over the second (as
    # independent ones would be), not in one burst.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick = time.monotonic()
        for part in range(SLICES):
            for producer in producers[part::SLICES]:
                await producer.send_async(b"%.6f" % time.time())
            await asyncio.sleep(max(0.0, tick + (part + 1) / SLICES - time.monotonic()))
    await asyncio.sleep(2)  # (the last second's messages arrive)
    for task in receivers:
        task.cancel()
    print("latencies", json.dumps(latencies), flush=True)
    await readline()  # (open until the ledgers are counted: then killed)

asyncio.run(main())
"""


def _broker_sample(pid: int) -> tuple[float, float]:
    """(RSS in MiB, CPU seconds so far) of a process."""
    sampled = sample_process(pid)
    if sampled is None:
        raise RuntimeError(f"the broker (pid {pid}) is gone")
    return sampled[0], _cpu_s(pid)


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used so far (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _tell(procs: list[subprocess.Popen[str]], word: str) -> list[str]:
    """Send each client a line; the next line each says back."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(word + "\n")
        proc.stdin.flush()
    answers = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a benchmark client ended (exit {proc.wait()})")
        answers.append(line.strip())
    return answers


async def _count_open(metadata_uri: str) -> tuple[int, int]:
    """(ledgers in the store, of them open)."""
    from metadata.schemas import LedgerState
    from metadata.services.ledgers import LedgerMetadataManager
    from metadata.uri import connect

    store = await connect(metadata_uri)
    try:
        registry = LedgerMetadataManager(store)
        ids = await registry.list()
        open_ = 0
        for ledger_id in ids:
            metadata, _ = await registry.read(ledger_id)
            open_ += metadata.state == LedgerState.OPEN
        return len(ids), open_
    finally:
        await store.close()


def run_many(args: argparse.Namespace) -> int:
    from streamlib.broker.launcher import BrokerProcess

    streams, clients = args.streams, max(1, min(args.clients, args.streams))
    figures: dict[str, Any] = {"streams": streams}
    with local_cluster(3) as cluster, tempfile.TemporaryDirectory() as logs:
        sessions = str(2 * streams + 100)
        broker = BrokerProcess(
            Path(logs), cluster.metadata_uri,
            extra=["--port", "0", "--max-sessions", sessions,
                   "--max-sessions-per-principal", sessions,
                   "--quiet-lac-ms", str(QUIET_LAC_MS)],
        ).start(port=0)  # fmt: skip
        procs: list[subprocess.Popen[str]] = []
        try:
            url = f"streamlib://{broker.address}"
            share = [streams // clients + (i < streams % clients) for i in range(clients)]
            first = 0
            for count in share:
                argv = [
                    sys.executable,
                    "-c",
                    CLIENT,
                    url,
                    str(first),
                    str(count),
                    str(args.seconds),
                ]
                pipe = subprocess.PIPE
                procs.append(subprocess.Popen(argv, stdin=pipe, stdout=pipe, text=True))
                first += count
            for proc in procs:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise RuntimeError("a benchmark client failed to start")
            rss0, _ = _broker_sample(broker.pid)
            start = time.perf_counter()
            opened = _tell(procs, "go")
            figures["open_s"] = time.perf_counter() - start
            figures["open_s_per_client"] = [float(a.split()[1]) for a in opened]
            # Open and quiet: what the streams cost the broker while nothing is sent.
            _, cpu0 = _broker_sample(broker.pid)
            quiet = time.monotonic()
            time.sleep(IDLE_S)
            rss1, cpu1 = _broker_sample(broker.pid)
            figures["broker_cpu_idle"] = (cpu1 - cpu0) / (time.monotonic() - quiet)
            # (the machine's other processes too: what sending costs besides the broker)
            bookie_pids = [b.proc.pid for b in cluster.bookies if b.proc is not None]
            others0 = [sum(map(_cpu_s, bookie_pids)), sum(_cpu_s(p.pid) for p in procs)]
            started = time.monotonic()
            answers = _tell(procs, "go")
            rss2, cpu2 = _broker_sample(broker.pid)
            others1 = [sum(map(_cpu_s, bookie_pids)), sum(_cpu_s(p.pid) for p in procs)]
            elapsed = time.monotonic() - started
            figures["bookies_cpu"] = (others1[0] - others0[0]) / elapsed
            figures["clients_cpu"] = (others1[1] - others0[1]) / elapsed
            latencies = sorted(x for a in answers for x in json.loads(a.split(" ", 1)[1]))
            figures.update(
                broker_rss_idle_mib=rss0,
                broker_rss_opened_mib=rss1,
                broker_rss_mib=rss2,
                broker_cpu=(cpu2 - cpu1) / elapsed,
                messages=len(latencies),
                e2e_p50_ms=percentile(latencies, 0.5),
                e2e_p99_ms=percentile(latencies, 0.99),
            )
            figures["ledgers"], figures["open_ledgers"] = asyncio.run(
                _count_open(cluster.metadata_uri)
            )
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            broker.stop()
    expected = streams * int(args.seconds)
    print(
        f"service, many streams: {streams:,} streams on 1 broker, a producer and a consumer "
        f"each, 1 msg/s per stream for {args.seconds:g} s; {clients} client processes; "
        "E3/Qw3/Qa2 (fsync), 3 local bookies\n"
        f"  all opened in                 {figures['open_s']:8.1f} s\n"
        f"  broker RSS idle / opened / at the end  {figures['broker_rss_idle_mib']:.0f} / "
        f"{figures['broker_rss_opened_mib']:.0f} / {figures['broker_rss_mib']:.0f} MiB\n"
        f"  broker CPU idle / sending     {100 * figures['broker_cpu_idle']:4.0f} / "
        f"{100 * figures['broker_cpu']:.0f} % of a core\n"
        f"  sending, the bookies / clients {100 * figures['bookies_cpu']:4.0f} / "
        f"{100 * figures['clients_cpu']:.0f} % of a core (this machine: {os.cpu_count()} "
        "cores)\n"
        f"  ledgers / open ledgers        {figures['ledgers']:,} / {figures['open_ledgers']:,}\n"
        f"  messages received             {figures['messages']:,} of about {expected:,}\n"
        f"  end-to-end p50 / p99          {figures['e2e_p50_ms']:.1f} / "
        f"{figures['e2e_p99_ms']:.1f} ms"
    )
    if args.json:
        print(json.dumps(figures))
    return 0
