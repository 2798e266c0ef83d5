"""Publish and subscribe with the blocking client (no asyncio needed).

    streamlib sandbox &                      # a local cluster, in another terminal
    python examples/pubsub.py [METADATA_URI] # default: the sandbox's

A producer publishes ten messages with a key and a property; a durable subscription
receives and acknowledges them; a second subscribe on the same subscription resumes
after what was acknowledged, so nothing comes twice.
"""

from __future__ import annotations

import sys
import uuid

import streamlib
from streamlib.sandbox import default_metadata_uri


def main(uri: str) -> int:
    stream = f"example-pubsub-{uuid.uuid4().hex[:8]}"  # fresh each run: reruns are independent
    with streamlib.connect(uri) as client:
        producer = client.create_producer(stream)
        ids = [
            producer.send(f"order {i}".encode(), key=f"customer-{i % 3}", properties={"n": str(i)})
            for i in range(10)
        ]
        producer.close()
        print(f"published 10 messages to {stream!r}: {ids[0]} .. {ids[-1]}")

        consumer = client.subscribe(stream, "audit", initial_position="earliest")
        for _ in range(6):
            message = consumer.receive(timeout=30)
            print(f"received {message.message_id} key={message.key} {message.data.decode()}")
            consumer.acknowledge(message)
        consumer.close()  # persists the cursor: 6 acknowledged
        print("closed the subscription after acknowledging 6 messages")

        consumer = client.subscribe(stream, "audit")
        rest = [consumer.receive(timeout=30) for _ in range(4)]
        for message in rest:
            consumer.acknowledge(message)
        consumer.close()
        resumed = [m.data.decode() for m in rest]
        print(f"resubscribed: the cursor resumed with {resumed}")
        if resumed != [f"order {i}" for i in range(6, 10)]:
            print("unexpected messages after resuming", file=sys.stderr)
            return 1
        client.streams.delete(stream)
    print("pubsub example: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else default_metadata_uri()))
