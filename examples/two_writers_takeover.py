"""Fencing at work: a second producer takes a stream over from a first one.

    python examples/two_writers_takeover.py [METADATA_URI]   # default: the sandbox's

Two clients stand for two processes. Writer A publishes and is acknowledged; writer B
(say, A's replacement after a suspected failure) creates a producer on the same
stream, which fences A's ledger and rolls to a new one. A's next send fails with
StreamFencedError: it can no longer add anything, so the two never interleave. A
reader then checks that every message either writer had acknowledged is there, once,
in order.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import streamlib
from streamlib.errors import StreamFencedError
from streamlib.sandbox import default_metadata_uri


async def main(uri: str) -> int:
    stream = f"example-takeover-{uuid.uuid4().hex[:8]}"
    client_a = await streamlib.Client.connect(uri)
    client_b = await streamlib.Client.connect(uri)
    try:
        writer_a = await client_a.create_producer(stream)
        acknowledged = [await writer_a.send(f"from A {i}".encode()) for i in range(5)]
        print(f"writer A published 5 messages, acknowledged up to {acknowledged[-1]}")

        writer_b = await client_b.create_producer(stream)
        print("writer B took the stream over: A's ledger is fenced, B writes a new ledger")
        try:
            await writer_a.send(b"from A, too late")
            print("writer A was NOT fenced: this must never happen", file=sys.stderr)
            return 1
        except StreamFencedError as error:
            print(f"writer A's next send failed: StreamFencedError ({error})")

        acknowledged += [await writer_b.send(f"from B {i}".encode()) for i in range(5)]
        await writer_b.close()
        print(f"writer B published 5 messages, acknowledged up to {acknowledged[-1]}")

        reader = await client_b.create_reader(stream, streamlib.EARLIEST)
        stored = []
        while await reader.has_message_available():
            message = await reader.read_next(timeout=30)
            stored.append((message.message_id, message.data.decode()))
        await reader.close()
        for message_id, text in stored:
            print(f"  {message_id}  {text}")
        expected = [f"from A {i}" for i in range(5)] + [f"from B {i}" for i in range(5)]
        if [text for _, text in stored] != expected or [m for m, _ in stored] != acknowledged:
            print("the stream does not hold exactly what was acknowledged", file=sys.stderr)
            return 1
        print("every acknowledged message is in the stream, once, in order; A's late one is not")
        await client_b.streams.delete(stream)
    finally:
        await client_a.close()
        await client_b.close()
    print("two writers takeover example: OK")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else default_metadata_uri())))
