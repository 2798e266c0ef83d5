"""`streamlib bench pulsar`: the official Pulsar client (pulsar-client, its C++ core)
against a broker's Pulsar port, beside streamlib's own clients on the same cluster:
three local bookies (E3/Qw3/Qa2, fsync), one broker.

- publish: direct mode's asyncio producer (the target's yardstick), then pulsar-client
  producers -- 1 and 4 processes, batching on with pulsar-client's default batch limits
  (1000 messages, 128 KiB, 10 ms) -- then streamlib's producer through the stream
  service (`bench service`'s figure, measured again in this window);
- consume: pulsar-client shared consumers (1 and 4 processes) acknowledging each
  message, then streamlib's through the service.

Every pulsar-client and service client is a process of its own, started and connected
before the clock starts (as `bench service`); a figure is the messages over the time
from the common start to the last process's end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from streamlib.bench.cluster import local_cluster
from streamlib.bench.service import _defaults, _processes, consume, publish

# argv: url topic count bytes. Connects, says "ready", waits for "go", publishes with
# send_async (batching on, pulsar-client's default limits), flushes; says how long.
PRODUCER = """
import sys, time, pulsar
url, topic, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
log = pulsar.FileLogger(pulsar.LoggerLevel.Warn, "/dev/stderr")  # (stdout: the figures)
client = pulsar.Client(url, operation_timeout_seconds=60, logger=log)
producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True,
                                  max_pending_messages=20000)
payload = b"x" * size
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
for _ in range(count):
    producer.send_async(payload, None)
producer.flush()
print(time.perf_counter() - start, flush=True)
client.close()
"""

# argv: url topic. Subscribes (shared, from the earliest), says "ready", waits for "go",
# receives and acknowledges until nothing comes for a second; the count and the time of
# the last message.
CONSUMER = """
import sys, time, pulsar
url, topic = sys.argv[1], sys.argv[2]
log = pulsar.FileLogger(pulsar.LoggerLevel.Warn, "/dev/stderr")
client = pulsar.Client(url, operation_timeout_seconds=60, logger=log)
consumer = client.subscribe(topic, "bench", consumer_type=pulsar.ConsumerType.Shared,
                            initial_position=pulsar.InitialPosition.Earliest,
                            receiver_queue_size=1000)
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
count, last = 0, start
while True:
    try:
        message = consumer.receive(timeout_millis=1000)
    except pulsar.Timeout:
        break
    consumer.acknowledge(message)
    count += 1
    last = time.perf_counter()
print(count, last - start, flush=True)
consumer.close()
client.close()
"""


def pulsar_publish(url: str, topic: str, producers: int, args: argparse.Namespace) -> float:
    each = args.messages // producers
    times = _processes(
        PRODUCER, [[url, topic, str(each), str(args.message_bytes)] for _ in range(producers)]
    )
    return each * producers / max(t[0] for t in times)


def pulsar_consume(url: str, topic: str, consumers: int) -> tuple[float, int]:
    results = _processes(CONSUMER, [[url, topic] for _ in range(consumers)])
    total = int(sum(r[0] for r in results))
    return total / max(r[1] for r in results), total


def _direct_asyncio(uri: str, args: argparse.Namespace) -> float:
    from streamlib.bench.stream import _publish_throughput
    from streamlib.client import Client

    async def run() -> float:
        client = await Client.connect(uri)
        try:
            return await _publish_throughput(client, args, "pulsar-bench-direct")
        finally:
            await client.close()

    return asyncio.run(run())


def run(args: argparse.Namespace) -> int:
    try:
        import pulsar  # noqa: F401
    except ImportError:
        print(
            "bench pulsar needs pulsar-client (the official Pulsar client): "
            "pip install 'streamlib[test]' or pip install pulsar-client",
            file=sys.stderr,
        )
        return 2
    from streamlib.broker.launcher import BrokerProcess

    figures: dict[str, Any] = {}
    with local_cluster(3) as cluster, tempfile.TemporaryDirectory() as logs:
        _defaults(cluster.metadata_uri)
        broker = BrokerProcess(
            Path(logs), cluster.metadata_uri, extra=["--port", "0"], pulsar=True
        ).start(port=0)
        try:
            url, service = broker.pulsar_url, f"streamlib://{broker.address}"
            figures["direct_asyncio_publish"] = _direct_asyncio(cluster.metadata_uri, args)
            for n in (1, 4):
                figures[f"pulsar_publish_{n}"] = pulsar_publish(url, f"pulsar-publish-{n}", n, args)
            figures["service_publish_1"] = publish(service, "service-publish-1", 1, args)
            for n in (1, 4):
                topic = f"pulsar-consume-{n}"
                pulsar_publish(url, topic, 1, args)
                figures[f"pulsar_consume_{n}"], count = pulsar_consume(url, topic, n)
                if count < args.messages:
                    raise RuntimeError(f"{n} pulsar consumers got {count} of {args.messages}")
            publish(service, "service-consume-1", 1, args)
            figures["service_consume_1"], _ = consume(service, "service-consume-1", 1, "shared")
        finally:
            broker.stop()
    share = figures["pulsar_publish_1"] / figures["direct_asyncio_publish"]
    print(
        f"pulsar: {args.messages} messages of {args.message_bytes} B, E3/Qw3/Qa2 (fsync), "
        "3 local bookies, 1 broker; every client a process of its own\n"
        f"  publish, direct mode (asyncio)           {figures['direct_asyncio_publish']:>10,.0f} msgs/s\n"
        f"  publish, pulsar-client, 1 producer       {figures['pulsar_publish_1']:>10,.0f} msgs/s"
        f"  ({share:.0%} of direct asyncio)\n"
        f"  publish, pulsar-client, 4 producers      {figures['pulsar_publish_4']:>10,.0f} msgs/s\n"
        f"  publish, streamlib service, 1 producer   {figures['service_publish_1']:>10,.0f} msgs/s\n"
        f"  consume, pulsar-client, 1 shared         {figures['pulsar_consume_1']:>10,.0f} msgs/s\n"
        f"  consume, pulsar-client, 4 shared         {figures['pulsar_consume_4']:>10,.0f} msgs/s\n"
        f"  consume, streamlib service, 1 shared     {figures['service_consume_1']:>10,.0f} msgs/s",
        flush=True,
    )
    if args.json:
        print(json.dumps(figures))
    return 0


def add_parser(which: Any) -> None:
    parser = which.add_parser(
        "pulsar", help="the official Pulsar client through a broker's Pulsar port"
    )
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.set_defaults(run=run)
