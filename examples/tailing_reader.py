"""A reader tails a stream while a producer is still publishing (asyncio client).

    python examples/tailing_reader.py [METADATA_URI]   # default: the sandbox's

The reader starts at EARLIEST before anything exists and waits for new messages; the
producer publishes twenty messages a few milliseconds apart. The reader sees each one
shortly after it is acknowledged (an OPEN ledger's entries become visible to readers
as the writer's last-add-confirmed advances), in publish order.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

import streamlib
from streamlib.sandbox import default_metadata_uri

MESSAGES = 20


async def publish(producer: Any) -> dict[str, float]:
    sent_at = {}
    for i in range(MESSAGES):
        text = f"tick {i}"
        await producer.send(text.encode())
        sent_at[text] = time.perf_counter()
        await asyncio.sleep(0.02)  # a trickle, so the reader really tails
    return sent_at


async def main(uri: str) -> int:
    stream = f"example-tail-{uuid.uuid4().hex[:8]}"
    async with await streamlib.Client.connect(uri) as client:
        await client.streams.create(stream, ensemble=3, write_quorum=2, ack_quorum=2)
        reader = await client.create_reader(stream, streamlib.EARLIEST)
        producer = await client.create_producer(stream)
        publishing = asyncio.create_task(publish(producer))
        seen = []
        for _ in range(MESSAGES):
            message = await reader.read_next(timeout=30)
            seen.append((message.data.decode(), time.perf_counter()))
            print(f"reader got {message.message_id} {message.data.decode()}")
        sent_at = await publishing
        await reader.close()
        await producer.close()
        lags = sorted((at - sent_at[text]) * 1000 for text, at in seen)
        print(f"median lag from acknowledgement to reader: {lags[len(lags) // 2]:.0f} ms")
        in_order = [text for text, _ in seen] == [f"tick {i}" for i in range(MESSAGES)]
        await client.streams.delete(stream)
    if not in_order:
        print("the reader saw the messages out of order", file=sys.stderr)
        return 1
    print("tailing reader example: OK")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else default_metadata_uri())))
