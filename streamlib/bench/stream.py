"""`streamlib bench stream`: the latency of a blocking send (one in flight, the blocking
API), publish throughput (batching on), publish and end-to-end publish -> consume latency
at a low and at a higher fixed rate, and catch-up read throughput, on three local bookies
with E3/Qw3/Qa2 (every entry fsync'd by the bookies' journals)."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from streamlib.bench import p50_p99_ms
from streamlib.bench.cluster import local_cluster
from streamlib.client import Client
from streamlib.stream.positions import EARLIEST


async def _publish_throughput(
    client: Client, args: argparse.Namespace, stream: str = "bench-throughput"
) -> float:
    await client.streams.create(stream, 3, 3, 2)
    producer = await client.create_producer(stream, batching_max_publish_delay_ms=2)
    payload = b"x" * args.message_bytes
    start = time.perf_counter()
    last = None
    for _ in range(args.messages):
        last = await producer.send_async(payload)
    assert last is not None
    await last
    elapsed = time.perf_counter() - start
    await producer.close()
    return args.messages / elapsed


def blocking_sends(uri: str, args: argparse.Namespace, options: dict[str, Any]) -> list[float]:
    """Latencies of producer.send() through the blocking API, one message in flight."""
    import streamlib

    with streamlib.connect(uri, **options) as client:
        client.streams.create("bench-blocking", 3, 3, 2)
        producer = client.create_producer("bench-blocking")
        payload = b"x" * args.message_bytes
        for _ in range(50):  # warm up: connections, the first ledger's bookies
            producer.send(payload)
        latencies = []
        for _ in range(args.blocking_sends):
            t0 = time.perf_counter()
            producer.send(payload)
            latencies.append(time.perf_counter() - t0)
        producer.close()
    return sorted(latencies)


def blocking_send_async(
    uri: str, args: argparse.Namespace, options: dict[str, Any], compression: str = "none"
) -> float:
    """Throughput of a blocking-API loop of producer.send_async (no callback), msgs/s."""
    import streamlib

    with streamlib.connect(uri, **options) as client:
        stream = f"bench-blocking-async-{compression}"
        client.streams.create(stream, 3, 3, 2)
        producer = client.create_producer(
            stream, batching_max_publish_delay_ms=2, compression_type=compression
        )
        payload = b"x" * args.message_bytes
        producer.send(payload)  # warm up
        start = time.perf_counter()
        # (The last future kept, as the asyncio phase keeps the last: durable in order.)
        for _ in range(args.messages):
            last = producer.send_async(payload)
        last.result()
        elapsed = time.perf_counter() - start
        producer.close()
    return args.messages / elapsed


def blocking_receive(uri: str, args: argparse.Namespace, options: dict[str, Any]) -> float:
    """Throughput of a blocking-API loop of consumer.receive() + acknowledge() over what
    the asyncio throughput phase wrote (a subscription of its own), msgs/s."""
    import streamlib

    with streamlib.connect(uri, **options) as client:
        consumer = client.subscribe(
            "bench-throughput", "bench-blocking", "earliest", receiver_queue_size=10_000
        )
        start = time.perf_counter()
        size = 0
        for _ in range(args.messages):
            message = consumer.receive(timeout=60)
            size += len(message.data)
            consumer.acknowledge(message)
        assert size == args.messages * args.message_bytes
        elapsed = time.perf_counter() - start
        consumer.close()
    return args.messages / elapsed


async def fixed_rate(
    client: Any,
    args: argparse.Namespace,
    rate: int,
    consumer_client: Any = None,
    *,
    stream: str | None = None,
) -> tuple[list[float], list[float]]:
    """Publish at rate msgs/s while a consumer tails; (publish, end-to-end) latencies.
    The consumer shares the producer's client (it learns each entry from the producer's
    writer, as a Pulsar broker's cursors do) unless consumer_client is another one (it
    long-polls the bookies, as a consumer in another process does). With stream given,
    the clients are the stream service's, and the broker made the stream (E3/Qw3/Qa2 by
    the defaults `bench service` set)."""
    if stream is None:
        stream = f"bench-latency-{rate}" + ("-other" if consumer_client is not None else "")
        await client.streams.create(stream, 3, 3, 2)
    producer = await client.create_producer(stream)
    consumer = await (consumer_client or client).subscribe(
        stream, "bench", initial_position="latest"
    )
    payload = b"x" * args.message_bytes
    total = int(rate * args.seconds)
    publish: list[float] = []
    end_to_end: list[float] = []
    sent_at: dict[int, float] = {}

    async def consume() -> None:
        for _ in range(total):
            message = await consumer.receive(timeout=60)
            end_to_end.append(time.perf_counter() - sent_at[int(message.properties["n"])])
            consumer.acknowledge(message)

    consuming = asyncio.ensure_future(consume())
    start = time.perf_counter()
    pending = []
    for n in range(total):
        due = start + n / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the load, not synchronisation
        sent_at[n] = time.perf_counter()
        future = await producer.send_async(payload, properties={"n": str(n)})

        def acked(_: object, t0: float = sent_at[n]) -> None:
            publish.append(time.perf_counter() - t0)

        future.add_done_callback(acked)
        pending.append(future)
    await asyncio.gather(*pending)
    await asyncio.wait_for(consuming, 120)
    await producer.close()
    await consumer.close()
    return publish, end_to_end


async def _catch_up(client: Client, args: argparse.Namespace) -> float:
    reader = await client.create_reader("bench-throughput", EARLIEST, receiver_queue_size=10_000)
    start = time.perf_counter()
    size = 0
    for _ in range(args.messages):
        size += len((await reader.read_next(timeout=60)).data)  # a reader looks at data
    assert size == args.messages * args.message_bytes
    elapsed = time.perf_counter() - start
    await reader.close()
    return args.messages / elapsed


async def _consumer_catch_up(client: Client, args: argparse.Namespace) -> float:
    """The same read by a durable subscription that acknowledges every message."""
    consumer = await client.subscribe(
        "bench-throughput",
        "bench-catch-up",
        initial_position="earliest",
        receiver_queue_size=10_000,
    )
    start = time.perf_counter()
    size = 0
    for _ in range(args.messages):
        message = await consumer.receive(timeout=60)
        size += len(message.data)
        consumer.acknowledge(message)
    assert size == args.messages * args.message_bytes
    elapsed = time.perf_counter() - start
    await consumer.close()
    return args.messages / elapsed


async def _run(
    uri: str, args: argparse.Namespace, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    client = await Client.connect(uri, **(options or {}))
    other = await Client.connect(uri, **(options or {}))
    figures: dict[str, Any] = {}
    try:
        # The latency phases first: after the throughput phase the bookies spend seconds
        # flushing and indexing its 100 MB, which would show in the low rate's tail.
        for name, rate in (("low", args.low_rate), ("high", args.rate)):
            publish, end_to_end = await fixed_rate(client, args, rate)
            figures.update(p50_p99_ms(f"{name}_publish", publish))
            figures.update(p50_p99_ms(f"{name}_e2e", end_to_end))
            _, end_to_end = await fixed_rate(client, args, rate, other)
            figures.update(p50_p99_ms(f"{name}_e2e_other", end_to_end))
        figures["publish_msgs_per_s"] = await _publish_throughput(client, args)
        figures["catch_up_msgs_per_s"] = await _catch_up(client, args)
        figures["consumer_catch_up_msgs_per_s"] = await _consumer_catch_up(client, args)
    finally:
        await other.close()
        await client.close()
    return figures


async def _publish_again(uri: str, args: argparse.Namespace, options: dict[str, Any]) -> float:
    client = await Client.connect(uri, **options)
    try:
        return await _publish_throughput(client, args, "bench-throughput-again")
    finally:
        await client.close()


def _measure(uri: str, args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    blocking = blocking_sends(uri, args, options)
    figures = asyncio.run(_run(uri, args, options))
    figures["blocking_receive_msgs_per_s"] = blocking_receive(uri, args, options)
    # Last: its 100 MB would keep the bookies flushing through the latency phases. The
    # asyncio publish again right after it: the two in the same state of the bookies
    # (flushing what the phases before wrote), for the blocking API's share of it.
    figures["blocking_send_async_msgs_per_s"] = blocking_send_async(uri, args, options)
    figures["publish_again_msgs_per_s"] = asyncio.run(_publish_again(uri, args, options))
    for codec in ("lz4", "zstd"):
        figures[f"blocking_send_async_{codec}_msgs_per_s"] = blocking_send_async(
            uri, args, options, codec
        )
    figures.update(p50_p99_ms("blocking", blocking))
    return figures


def _secure_run(args: argparse.Namespace) -> dict[str, Any]:
    """The same phases on a secure sandbox: TLS on every bookie, token authentication and
    roles (the writer's token), as `streamlib sandbox --secure` runs them."""
    import tempfile
    from pathlib import Path

    from streamlib.sandbox import Sandbox

    with tempfile.TemporaryDirectory(prefix="streamlib-bench-secure-") as tmp:
        sandbox = Sandbox(Path(tmp), bookies=3, port_base=0, secure=True).start()
        try:
            return _measure(sandbox.metadata_uri, args, sandbox.client_options("writer"))
        finally:
            sandbox.stop()


_ROWS = (
    ("blocking send p50", "blocking_p50_ms", "ms"),
    ("blocking send p99", "blocking_p99_ms", "ms"),
    ("publish throughput", "publish_msgs_per_s", "msgs/s"),
    ("blocking send_async", "blocking_send_async_msgs_per_s", "msgs/s"),
    ("blocking catch-up", "blocking_receive_msgs_per_s", "msgs/s"),
    ("end-to-end p50, low", "low_e2e_p50_ms", "ms"),
    ("end-to-end p99, low", "low_e2e_p99_ms", "ms"),
    ("end-to-end p50, high", "high_e2e_p50_ms", "ms"),
    ("end-to-end p99, high", "high_e2e_p99_ms", "ms"),
    ("catch-up reads", "catch_up_msgs_per_s", "msgs/s"),
    ("consumer catch-up", "consumer_catch_up_msgs_per_s", "msgs/s"),
)


def run(args: argparse.Namespace) -> int:
    with local_cluster(3) as cluster:
        r = _measure(cluster.metadata_uri, args, {})
    print(
        f"stream: {args.message_bytes} B messages, E3/Qw3/Qa2 (fsync), 3 local bookies\n"
        f"  blocking send        p50 {r['blocking_p50_ms']:.2f} ms  p99 {r['blocking_p99_ms']:.2f} ms"
        f"  (producer.send(), one in flight, {args.blocking_sends} sends)\n"
        f"  publish throughput   {r['publish_msgs_per_s']:,.0f} msgs/s ({args.messages} messages,"
        " send_async)\n"
        f"  blocking send_async  {r['blocking_send_async_msgs_per_s']:,.0f} msgs/s (a loop of the"
        f" blocking API's send_async; with lz4 {r['blocking_send_async_lz4_msgs_per_s']:,.0f},"
        f" with zstd {r['blocking_send_async_zstd_msgs_per_s']:,.0f}); the asyncio loop right"
        f" after it {r['publish_again_msgs_per_s']:,.0f} msgs/s: the blocking API at"
        f" {r['blocking_send_async_msgs_per_s'] / r['publish_again_msgs_per_s']:.0%} of it\n",
        end="",
    )
    for name, rate in (("low", args.low_rate), ("high", args.rate)):
        print(
            f"  at {rate:>5,} msgs/s       publish p50 {r[name + '_publish_p50_ms']:.2f} ms"
            f"  p99 {r[name + '_publish_p99_ms']:.2f} ms;  end-to-end (a consumer tailing)"
            f" p50 {r[name + '_e2e_p50_ms']:.2f} ms  p99 {r[name + '_e2e_p99_ms']:.2f} ms;"
            f"  a consumer of another client p50 {r[name + '_e2e_other_p50_ms']:.2f} ms"
            f"  p99 {r[name + '_e2e_other_p99_ms']:.2f} ms"
        )
    print(
        f"  catch-up reads       {r['catch_up_msgs_per_s']:,.0f} msgs/s (Reader)\n"
        f"  consumer catch-up    {r['consumer_catch_up_msgs_per_s']:,.0f} msgs/s"
        " (receive + acknowledge each)\n"
        f"  blocking catch-up    {r['blocking_receive_msgs_per_s']:,.0f} msgs/s (the same loop"
        " through the blocking API: "
        f"{r['blocking_receive_msgs_per_s'] / r['consumer_catch_up_msgs_per_s']:.0%} of it)",
        flush=True,
    )
    if args.secure:
        s = _secure_run(args)
        print("\nthe same with TLS + token authentication + roles (sandbox --secure):")
        print(f"  {'':22}{'plaintext':>17}{'secure':>17}{'cost':>8}")
        for label, key, unit in _ROWS:
            plain, secure = r[key], s[key]
            # Throughput lost, or latency added, as a share of the plaintext figure.
            cost = (plain - secure) / plain if unit == "msgs/s" else (secure - plain) / plain
            digits = 1 if unit == "ms" else 0
            print(
                f"  {label:22}{plain:>10,.{digits}f} {unit:<6}{secure:>10,.{digits}f} {unit:<6}"
                f"{cost:>+8.0%}"
            )
    return 0


def add_parser(which: Any) -> None:
    parser = which.add_parser("stream", help="publish / consume throughput and latency")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--rate", type=int, default=2000, help="msgs/s of the higher-rate phase")
    parser.add_argument("--low-rate", type=int, default=100, help="msgs/s of the low-rate phase")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each rate phase")
    parser.add_argument(
        "--blocking-sends", type=int, default=1000, help="sends of the blocking-send phase"
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="then run it again on a secure sandbox (TLS, tokens, roles) and print the cost",
    )
    parser.set_defaults(run=run)
