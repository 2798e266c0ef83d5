"""The end-to-end demo `streamlib sandbox --demo` runs against a fresh cluster: publish
and consume on a stream, a tailing consumer, a writer takeover that fences the old
producer, and a replay from the durable cursor; it prints what happened at each step."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from streamlib.client import Client
from streamlib.errors import StreamFencedError, UnauthorizedError
from streamlib.stream.reader import Message

STREAM = "demo-orders"


async def _demo(
    uri: str, messages: int, writer: dict[str, Any], reader: dict[str, Any] | None
) -> None:
    """writer / reader: Client.connect options of the producers and of the subscriber
    (a secure sandbox's TLS CA and tokens; reader None: the same as writer)."""
    publisher, subscriber, successor = (
        await Client.connect(uri, **writer),
        await Client.connect(uri, **(writer if reader is None else reader)),
        await Client.connect(uri, **writer),
    )
    try:
        if reader is not None:
            print(
                "secure sandbox: TLS to every bookie; producers hold a writer token, "
                "the subscriber a reader token"
            )
        await publisher.streams.create(STREAM, ensemble=3, write_quorum=3, ack_quorum=2)
        print(f"created stream {STREAM!r}: every entry on 3 bookies, acknowledged at 2 fsyncs")
        consumer = await subscriber.subscribe(STREAM, "billing", initial_position="earliest")
        producer = await publisher.create_producer(STREAM)
        start = time.perf_counter()
        futures = [
            await producer.send_async(b"order %d" % i, key=f"customer-{i % 7}")
            for i in range(messages)
        ]
        ids = await asyncio.gather(*futures)
        elapsed = time.perf_counter() - start
        entries = len({(m.ledger_id, m.entry_id) for m in ids})
        print(
            f"published {messages} messages in {elapsed * 1000:.0f} ms, batched into {entries} "
            f"entries; first id {ids[0]}, last id {ids[-1]}"
        )
        received: list[Message] = []
        while len(received) < messages:
            message = await consumer.receive(timeout=30)
            received.append(message)
            if len(received) % 2 == 0:
                consumer.acknowledge_cumulative(message)
        assert [m.data for m in received] == [b"order %d" % i for i in range(messages)]
        print(
            f"subscription 'billing' received all {messages} in order "
            f"(last: {received[-1].data!r}, key {received[-1].key!r}) and acknowledged them"
        )
        await consumer.close()
        if reader is not None:
            try:
                await subscriber.create_producer(STREAM)
                raise SystemExit("a reader took the stream over: this must never happen")
            except UnauthorizedError as e:
                print(f"the reader token may not produce: UnauthorizedError ({e})")

        taker = await successor.create_producer(STREAM)
        print("a second producer took the stream over (it fenced the first one's ledger)")
        try:
            await producer.send(b"late order")
            raise SystemExit("the old producer was not fenced: this must never happen")
        except StreamFencedError:
            print("the old producer's next send was refused: StreamFencedError")
        new_id = await taker.send(b"order from the new writer")
        await taker.close()
        print(f"the new producer published {new_id}")

        again = await subscriber.subscribe(STREAM, "billing")
        resumed = await again.receive(timeout=30)
        print(
            f"the subscription resumed from its durable cursor: next message "
            f"{resumed.data!r} ({resumed.message_id}); nothing acknowledged came again"
        )
        again.acknowledge(resumed)
        await again.close()
        stats = await publisher.streams.stats(STREAM)
        print(
            f"stream stats: {len(stats['ledgers'])} ledgers, {stats['entries']} entries, "
            f"backlog of 'billing': {stats['subscriptions']['billing']['backlog_entries']} entries"
        )
    finally:
        for client in (publisher, subscriber, successor):
            await client.close()


SERVICE_STREAM = "demo-jobs"
# (Credentials reach the producer processes in their environment, STREAMLIB_TOKEN and
# STREAMLIB_TLS_CA, never on their command line: every local user can read that.)
PRODUCER_SCRIPT = """
import sys, streamlib
client = streamlib.connect(sys.argv[1])
producer = client.create_producer(sys.argv[2], producer_name=sys.argv[3])
for i in range(int(sys.argv[4])):
    producer.send_async(b"%s job %d" % (sys.argv[3].encode(), i))
producer.flush()
client.close()
"""


async def _service_demo(
    metadata_uri: str, service_url: str, messages: int, writer: dict[str, Any]
) -> None:
    """Two producer processes on one stream through the broker, and a shared
    subscription with two consumers splitting the work."""
    import os
    import subprocess
    import sys

    # Made first, as a secure cluster wants (its brokers create no stream on first use).
    async with await Client.connect(metadata_uri, **writer) as direct:
        if SERVICE_STREAM not in await direct.streams.list():
            await direct.streams.create(SERVICE_STREAM)
    client = await Client.connect(service_url, **writer)
    environment = dict(os.environ)
    if "token" in writer:
        environment["STREAMLIB_TOKEN"] = writer["token"]
    if "tls_ca" in writer:
        environment["STREAMLIB_TLS_CA"] = writer["tls_ca"]
    try:
        consumers = [
            await client.subscribe(SERVICE_STREAM, "workers", "earliest", consumer_type="shared")
            for _ in range(2)
        ]
        print(f"stream service at {service_url}: two producer processes publish to "
              f"{SERVICE_STREAM!r}, two shared consumers split the work")  # fmt: skip
        per_producer = messages // 2
        producers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    PRODUCER_SCRIPT,
                    service_url,
                    SERVICE_STREAM,
                    name,
                    str(per_producer),
                ],
                env=environment,
            )
            for name in ("web-1", "web-2")
        ]
        counts = [0, 0]
        seen: set[bytes] = set()

        async def work(index: int) -> None:
            while len(seen) < 2 * per_producer:
                try:
                    message = await consumers[index].receive(timeout=0.5)
                except TimeoutError:
                    continue
                seen.add(message.data)
                counts[index] += 1
                consumers[index].acknowledge(message)

        await asyncio.wait_for(asyncio.gather(work(0), work(1)), 120)
        for process in producers:
            if await asyncio.to_thread(process.wait, 60) != 0:
                raise SystemExit("a producer process failed")
        print(f"both producers' {2 * per_producer} messages arrived once each; consumer 1 "
              f"handled {counts[0]}, consumer 2 handled {counts[1]}")  # fmt: skip
    finally:
        await client.close()


def run_demo(
    metadata_uri: str,
    messages: int = 1000,
    *,
    writer: dict[str, Any] | None = None,
    reader: dict[str, Any] | None = None,
    service_url: str | None = None,
) -> int:
    asyncio.run(_demo(metadata_uri, messages, writer or {}, reader))
    if service_url is not None:
        asyncio.run(_service_demo(metadata_uri, service_url, messages, writer or {}))
    print("demo finished: OK")
    return 0
