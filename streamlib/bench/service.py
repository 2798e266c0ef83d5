"""`streamlib bench service`: the stream service next to direct mode, on three local
bookies (E3/Qw3/Qa2, fsync) and one broker: publish throughput with 1 and 4 producer
processes on one stream, and shared-subscription throughput with 1 and 4 consumer
processes; direct mode's one producer and one consumer for comparison; then publish and
end-to-end latency through the broker at a low and a higher fixed rate.

Every throughput client is a process of its own (as a fleet of publishers or workers
is), started and connected before the clock starts; a figure is the messages over the
time from the common start to the last process's end. The latency phase's producer and
consumer are two clients of the broker in the benchmark's process (one clock for both
ends), as `bench stream`'s "consumer of another client".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from streamlib.bench.cluster import local_cluster

# argv: uri stream count bytes name. Connects, says "ready", waits for "go", publishes,
# says how long it took.
PRODUCER = """
import sys, time, streamlib
uri, stream, count, size, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
client = streamlib.connect(uri)
options = {"producer_name": name} if uri.startswith("streamlib://") else {}
producer = client.create_producer(stream, **options)
payload = b"x" * size
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
for _ in range(count):
    producer.send_async(payload)
producer.flush()
print(time.perf_counter() - start, flush=True)
client.close()
"""

# argv: uri stream type. Subscribes, says "ready", waits for "go", receives and
# acknowledges until nothing comes for a second; prints the count and the time of the
# last message. (receive() one by one: a batch_receive's last batch of each consumer waits
# out its timeout for messages that will not come, and that wait was counted.)
CONSUMER = """
import sys, time, streamlib
uri, stream, kind = sys.argv[1], sys.argv[2], sys.argv[3]
client = streamlib.connect(uri)
consumer = client.subscribe(stream, "bench", "earliest", consumer_type=kind,
                            receiver_queue_size=1000)
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
count, last = 0, start
while True:
    try:
        message = consumer.receive(timeout=1)
    except TimeoutError:
        break
    consumer.acknowledge(message)
    count += 1
    last = time.perf_counter()
print(count, last - start, flush=True)
consumer.close()
client.close()
"""


def _processes(script: str, argvs: list[list[str]]) -> list[tuple[float, ...]]:
    """Start one process per argv, wait until each is ready, start them together; each
    one's last line, as numbers."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a benchmark client failed to start: {line!r}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError("a benchmark client failed")
            results.append(tuple(float(x) for x in out.split()))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def publish(uri: str, stream: str, producers: int, args: argparse.Namespace) -> float:
    each = args.messages // producers
    times = _processes(
        PRODUCER,
        [[uri, stream, str(each), str(args.message_bytes), f"p{i}"] for i in range(producers)],
    )
    return each * producers / max(t[0] for t in times)


def consume(uri: str, stream: str, consumers: int, kind: str) -> tuple[float, int]:
    results = _processes(CONSUMER, [[uri, stream, kind] for _ in range(consumers)])
    total = int(sum(r[0] for r in results))
    return total / max(r[1] for r in results), total


def _prefill(uri: str, stream: str, args: argparse.Namespace) -> None:
    publish(uri, stream, 1, args)


async def _latency(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Publish at the low and the higher rate through the broker while a consumer of
    another client of it tails (a shared subscription from the latest message)."""
    from streamlib.bench import p50_p99_ms
    from streamlib.bench.stream import fixed_rate
    from streamlib.client import Client

    figures: dict[str, float] = {}
    producing, consuming = await Client.connect(url), await Client.connect(url)
    try:
        for name, rate in (("low", args.low_rate), ("high", args.rate)):
            publish, end_to_end = await fixed_rate(
                producing, args, rate, consuming, stream=f"service-latency-{name}"
            )
            figures.update(p50_p99_ms(f"{name}_publish", publish))
            figures.update(p50_p99_ms(f"{name}_e2e", end_to_end))
    finally:
        await consuming.close()
        await producing.close()
    return figures


def run(args: argparse.Namespace) -> int:
    from streamlib.broker.launcher import BrokerProcess

    if args.streams:
        from streamlib.bench.many import run_many

        return run_many(args)

    figures: dict[str, Any] = {}
    with local_cluster(3) as cluster, tempfile.TemporaryDirectory() as logs:
        _defaults(cluster.metadata_uri)
        broker = BrokerProcess(Path(logs), cluster.metadata_uri, extra=["--port", "0"]).start(
            port=0
        )
        try:
            url = f"streamlib://{broker.address}"
            direct = cluster.metadata_uri
            # Latency first: after the throughput phases the bookies spend seconds
            # flushing and indexing their hundreds of MB (as in `bench stream`).
            latency = asyncio.run(_latency(url, args))
            figures["direct_publish_1"] = publish(direct, "direct-publish", 1, args)
            for n in (1, 4):
                figures[f"service_publish_{n}"] = publish(url, f"service-publish-{n}", n, args)
            _prefill(direct, "direct-consume", args)
            figures["direct_consume_1"], _ = consume(direct, "direct-consume", 1, "exclusive")
            for n in (1, 4):
                stream = f"service-consume-{n}"
                _prefill(url, stream, args)
                figures[f"service_consume_{n}"], count = consume(url, stream, n, "shared")
                if count < args.messages:
                    raise RuntimeError(f"{n} shared consumers got {count} of {args.messages}")
        finally:
            broker.stop()
    print(
        f"service: {args.messages} messages of {args.message_bytes} B, E3/Qw3/Qa2 (fsync), "
        "3 local bookies, 1 broker; every client a process of its own\n"
        f"  publish, direct mode (1 producer)       {figures['direct_publish_1']:>10,.0f} msgs/s\n"
        f"  publish, service, 1 producer            {figures['service_publish_1']:>10,.0f} msgs/s\n"
        f"  publish, service, 4 producers           {figures['service_publish_4']:>10,.0f} msgs/s\n"
        f"  consume, direct mode (1 exclusive)      {figures['direct_consume_1']:>10,.0f} msgs/s\n"
        f"  consume, service, 1 shared consumer     {figures['service_consume_1']:>10,.0f} msgs/s\n"
        f"  consume, service, 4 shared consumers    {figures['service_consume_4']:>10,.0f} msgs/s",
    )
    print("latency through the broker (a producer and a consumer, two clients of it):")
    for name, rate in (("low", args.low_rate), ("high", args.rate)):
        print(
            f"  at {rate:>5,} msgs/s       publish p50 {latency[name + '_publish_p50_ms']:.2f} ms"
            f"  p99 {latency[name + '_publish_p99_ms']:.2f} ms;  end-to-end"
            f" p50 {latency[name + '_e2e_p50_ms']:.2f} ms  p99 {latency[name + '_e2e_p99_ms']:.2f} ms"
        )
    sys.stdout.flush()
    figures.update({f"latency_{key}": value for key, value in latency.items()})
    if args.json:
        print(json.dumps(figures))
    return 0


def _defaults(uri: str) -> None:
    """New streams: E3/Qw3/Qa2 as `bench stream` (every entry on all three bookies)."""
    from streamlib.client import Client

    async def set_defaults() -> None:
        client = await Client.connect(uri)
        try:
            await client.streams.set_defaults(ensemble=3, write_quorum=3, ack_quorum=2)
        finally:
            await client.close()

    asyncio.run(set_defaults())


def add_parser(which: Any) -> None:
    parser = which.add_parser(
        "service", help="the stream service next to direct mode: throughput, latency"
    )
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--rate", type=int, default=2000, help="msgs/s of the higher-rate phase")
    parser.add_argument("--low-rate", type=int, default=100, help="msgs/s of the low-rate phase")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each rate phase")
    parser.add_argument(
        "--streams", type=int, default=0,
        help="instead: one broker serving this many streams, a producer and a consumer each, "
        "a message a second per stream, for --seconds (streamlib/bench/many.py)",
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=4, help="with --streams: client processes")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.set_defaults(run=run)
