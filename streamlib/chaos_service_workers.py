"""The worker processes of `streamlib chaos --brokers N` (streamlib/chaos_service.py):
clients of the stream service that log, one JSON object per line, what they were
acknowledged or received.

    python -m streamlib.chaos_service_workers produce URL STREAM NAME LOG
    python -m streamlib.chaos_service_workers consume URL STREAM SUBSCRIPTION TYPE LOG

A producer sends "NAME-SEQ" with its own sequence ids (a restarted one goes on after
the last its name published: the broker tells it) and logs each acknowledgement; on
SIGTERM it flushes, logs "stopped" and exits. A consumer logs and acknowledges every
message it receives until SIGTERM.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
import time
from typing import Any


class Log:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the worker
        self._lock = threading.Lock()

    def write(self, **event: Any) -> None:
        with self._lock:
            self._file.write(json.dumps(event) + "\n")


def produce(url: str, stream: str, name: str, path: str) -> int:
    import streamlib

    log = Log(path)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = streamlib.connect(url)
    producer = client.create_producer(stream, producer_name=name, max_pending_messages=500)
    sequence = producer.last_sequence_id + 1
    log.write(e="start", seq=sequence)

    def acked(error: BaseException | None, message_id: Any, seq: int) -> None:
        if error is None:
            log.write(e="ack", seq=seq, id=list(message_id))
        else:
            log.write(e="fail", seq=seq, error=f"{type(error).__name__}: {error}")

    while not stop.is_set():
        for _ in range(20):
            seq = sequence
            producer.send_async(
                b"%s-%d" % (name.encode(), seq),
                callback=functools.partial(_settled, acked, seq),
                key=f"k{seq % 11}",
                sequence_id=seq,
            )
            sequence += 1
        time.sleep(0.01)  # (a steady rate: about 2,000 msgs/s per producer)
    producer.flush()
    log.write(e="stopped", last=sequence - 1)
    client.close()
    return 0


def consume(url: str, stream: str, subscription: str, kind: str, path: str) -> int:
    import streamlib

    log = Log(path)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = streamlib.connect(url)
    consumer = client.subscribe(stream, subscription, "earliest", consumer_type=kind)
    log.write(e="start")
    while not stop.is_set():
        for message in consumer.batch_receive(200, 200):
            log.write(e="got", data=message.data.decode(), id=list(message.message_id),
                      rc=message.redelivery_count, key=message.key)  # fmt: skip
            consumer.acknowledge(message)
    consumer.close()
    client.close()
    return 0


def _settled(acked: Any, seq: int, error: BaseException | None, message_id: Any) -> None:
    acked(error, message_id, seq)


def main(argv: list[str]) -> int:
    if argv[:1] == ["produce"] and len(argv) == 5:
        return produce(*argv[1:])
    if argv[:1] == ["consume"] and len(argv) == 6:
        return consume(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
