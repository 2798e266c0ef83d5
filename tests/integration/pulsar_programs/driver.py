"""A program of the official Pulsar Python client (pulsar-client), driven a step at a
time: each line on stdin is one JSON command, each answer one JSON line on stdout. It
uses `import pulsar` as any user's program does -- nothing of streamlib but, for a
partitioned producer, the key's partition function as its message_router.

Commands (all fields but "op" are optional unless named): objects are kept by the "id"
the test gives them.

  client        id url [token tls_trust_certs_file_path operation_timeout_seconds ...]
  producer      id client topic [create_producer's options; enums by name]
  send          producer messages=[message] [mode=sync|async]  -> ids, callbacks
  flush, close  of producer / consumer / reader / client: id
  subscribe     id client topic subscription [subscribe's options]
  reader        id client topic start=earliest|latest|[ledger, entry, batch, partition]
  receive       id (a consumer or reader) [count timeout_ms ack=none|individual|...]
  ack           id (a consumer) refs kind=individual|cumulative|nack
  seek          id message_id=earliest|latest|[...] | timestamp=ms
  has_message_available, unsubscribe, producer_info, last_message_id: id
  table_view    id client topic                     (pulsar-client's TableView)
  table         id [wait_key wait_value wait_s]     -> entries {key: data}, once the view
                                                       holds wait_key (wait_value "": none)
  send_background producer count [prefix explicit_sequence_ids interval_ms ...]
  background    (the background sends so far) [wait_s: until all are settled]
  exit

A message to send: {"data": str} or {"seed": n, "size": n} (random.Random(seed).randbytes
(size)) or {"value": ...} (a schema producer's value; a dict makes the schema's Record),
with properties, partition_key, ordering_key, event_timestamp, sequence_id, deliver_after
(ms) as pulsar-client's send takes them. A received message is described by ref (for
ack), data (or data_b64; size and sha256 always), value (with a schema), properties,
partition_key, ordering_key, event_timestamp, publish_timestamp, id, redelivery_count,
topic, producer_name, received_at_ms (this program's clock). send mode=async answers
callbacks ([index, result, id] in the order they were called) and after_flush (how many
had been called when flush returned). An error is answered {"error": its class name,
"message": ...}.

pulsar-client's C++ core may print to stdout: the answers go to the stdout this
program started with, and fd 1 is pointed at stderr."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
import os
import random
import sys
import threading
import time
from typing import Any

import pulsar
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema

# Answers: the original stdout; whatever else writes to fd 1 lands in stderr.
_answers = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
LOG = logging.getLogger("pulsar-driver")
ENUMS = {
    "consumer_type": pulsar.ConsumerType,
    "initial_position": pulsar.InitialPosition,
    "compression_type": pulsar.CompressionType,
    "access_mode": pulsar.ProducerAccessMode,
    "batching_type": pulsar.BatchingType,
    "message_routing_mode": pulsar.PartitionsRoutingMode,
}
INLINE_BYTES = 4096  # bigger payloads are described by size and sha256 only


class Reading(Record):
    sensor = String()
    value = Integer()


SCHEMAS = {
    "string": lambda: StringSchema(),
    "json": lambda: JsonSchema(Reading),
    "avro": lambda: AvroSchema(Reading),
}


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def key_router() -> Any:
    """streamlib's partition of a key (Murmur3_32Hash, as Pulsar's) as a message_router:
    streamlib.pulsar.entries.murmur3_router where it exists, else partition_of itself."""
    try:
        from streamlib.pulsar.entries import murmur3_router
    except ImportError:
        from streamlib.stream.partitioned import partition_of

        def murmur3_router(message: Any, partitions: int) -> int:
            return partition_of(message.partition_key(), partitions)

    return murmur3_router


def result_name(result: Any) -> str:
    """A send callback's result: "Ok", or the failure's name."""
    return getattr(result, "name", None) or type(result).__name__


def options(given: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in given.items():
        if name in ENUMS:
            value = getattr(ENUMS[name], value)
        elif name == "schema":
            value = SCHEMAS[value]()
        elif name == "dead_letter_policy":
            value = pulsar.ConsumerDeadLetterPolicy(**value)
        elif name == "message_router":
            value = key_router()
        out[name] = value
    return out


def to_message_id(given: Any) -> Any:
    if given == "earliest":
        return pulsar.MessageId.earliest
    if given == "latest":
        return pulsar.MessageId.latest
    ledger, entry, batch, partition = given
    return pulsar.MessageId(partition, ledger, entry, batch)


def id_of(found: Any) -> list[int]:
    return [found.ledger_id(), found.entry_id(), found.batch_index(), found.partition()]


def plain(value: Any) -> Any:
    if isinstance(value, Record):
        return {name: getattr(value, name) for name in ("sensor", "value")}
    return value


def to_send(message: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    message = dict(message)
    if "value" in message:
        content = message.pop("value")
        if isinstance(content, dict):
            content = Reading(**content)
    elif "seed" in message:
        content = payload(message.pop("seed"), message.pop("size"))
    else:
        content = message.pop("data").encode()
    if "deliver_after" in message:
        message["deliver_after"] = datetime.timedelta(milliseconds=message["deliver_after"])
    return content, message


class Driver:
    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.schemas: dict[str, str | None] = {}
        self.received: list[Any] = []
        self.background: dict[str, Any] = {}

    def describe(self, message: Any, schema: str | None) -> dict[str, Any]:
        self.received.append(message)
        data = message.data()
        out: dict[str, Any] = {
            "ref": len(self.received) - 1,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "properties": message.properties(),
            "partition_key": message.partition_key(),
            "ordering_key": message.ordering_key(),
            "event_timestamp": message.event_timestamp(),
            "publish_timestamp": message.publish_timestamp(),
            "id": id_of(message.message_id()),
            "redelivery_count": message.redelivery_count(),
            "topic": message.topic_name(),
            "producer_name": message.producer_name(),
            "received_at_ms": int(time.time() * 1000),
        }
        if len(data) <= INLINE_BYTES:
            try:
                out["data"] = data.decode()
            except UnicodeDecodeError:
                out["data_b64"] = base64.b64encode(data).decode()
        if schema is not None:
            out["value"] = plain(message.value())
        return out

    # -- commands -------------------------------------------------------------------

    def client(self, id: str, url: str, token: str | None = None, **given: Any) -> dict:
        if token is not None:
            given["authentication"] = pulsar.AuthenticationToken(token)
        self.objects[id] = pulsar.Client(url, logger=LOG, **given)
        return {}

    def producer(self, id: str, client: str, topic: str, **given: Any) -> dict:
        producer = self.objects[client].create_producer(topic, **options(given))
        self.objects[id] = producer
        self.schemas[id] = given.get("schema")
        return self.producer_info(id)

    def producer_info(self, id: str) -> dict:
        producer = self.objects[id]
        return {"producer_name": producer.producer_name(),
                "last_sequence_id": producer.last_sequence_id()}  # fmt: skip

    def send(self, producer: str, messages: list[dict[str, Any]], mode: str = "sync") -> dict:
        target = self.objects[producer]
        if mode == "sync":
            ids = []
            for message in messages:
                content, given = to_send(message)
                ids.append(id_of(target.send(content, **given)))
            return {"ids": ids}
        # send_async: each callback says its result and id, in the order they came.
        done = threading.Event()
        callbacks: list[Any] = []

        def callback(index: int) -> Any:
            def called(result: Any, found: Any) -> None:
                callbacks.append([index, result_name(result), id_of(found)])
                if len(callbacks) == len(messages):
                    done.set()

            return called

        for index, message in enumerate(messages):
            content, given = to_send(message)
            target.send_async(content, callback(index), **given)
        target.flush()
        after_flush = len(callbacks)
        if not done.wait(60):
            raise TimeoutError(f"{len(callbacks)} of {len(messages)} callbacks in 60 s")
        return {"callbacks": callbacks, "after_flush": after_flush}

    def flush(self, id: str) -> dict:
        self.objects[id].flush()
        return {}

    def close(self, id: str) -> dict:
        self.objects.pop(id).close()
        return {}

    def subscribe(self, id: str, client: str, topic: Any, subscription: str, **given: Any) -> dict:
        self.objects[id] = self.objects[client].subscribe(topic, subscription, **options(given))
        self.schemas[id] = given.get("schema")
        return {}

    def reader(self, id: str, client: str, topic: str, start: Any, **given: Any) -> dict:
        self.objects[id] = self.objects[client].create_reader(
            topic, to_message_id(start), **options(given)
        )
        self.schemas[id] = given.get("schema")
        return {}

    def receive(
        self,
        id: str,
        count: int = 1_000_000,
        timeout_ms: int = 10_000,
        ack: str = "none",
    ) -> dict:
        """Up to count messages, each within timeout_ms (then timed_out); acknowledged
        as `ack` says, each as it comes."""
        target = self.objects[id]
        schema = self.schemas.get(id)
        reading = isinstance(target, pulsar.Reader)
        got = []
        timed_out = False
        while len(got) < count:
            try:
                if reading:
                    message = target.read_next(timeout_millis=timeout_ms)
                else:
                    message = target.receive(timeout_millis=timeout_ms)
            except pulsar.Timeout:
                timed_out = True
                break
            got.append(self.describe(message, schema))
            if ack == "individual":
                target.acknowledge(message)
            elif ack == "cumulative":
                target.acknowledge_cumulative(message)
            elif ack == "nack":
                target.negative_acknowledge(message)
        return {"messages": got, "timed_out": timed_out}

    def ack(self, id: str, refs: list[int], kind: str = "individual") -> dict:
        target = self.objects[id]
        for ref in refs:
            message = self.received[ref]
            if kind == "individual":
                target.acknowledge(message)
            elif kind == "cumulative":
                target.acknowledge_cumulative(message)
            else:
                target.negative_acknowledge(message)
        return {}

    def seek(self, id: str, message_id: Any = None, timestamp: int | None = None) -> dict:
        target = self.objects[id]
        target.seek(timestamp if message_id is None else to_message_id(message_id))
        return {}

    def has_message_available(self, id: str) -> dict:
        return {"available": self.objects[id].has_message_available()}

    def unsubscribe(self, id: str) -> dict:
        self.objects.pop(id).unsubscribe()
        return {}

    def last_message_id(self, id: str) -> dict:
        return {"id": id_of(self.objects[id].get_last_message_id())}

    def table_view(self, id: str, client: str, topic: str) -> dict:
        self.objects[id] = self.objects[client].create_table_view(topic)
        return {}

    def table(
        self, id: str, wait_key: str | None = None, wait_value: str = "", wait_s: float = 30.0
    ) -> dict:
        """The view's entries (for_each), once wait_key holds wait_value (absent: "")."""
        view = self.objects[id]
        deadline = time.monotonic() + wait_s
        while True:
            entries: dict[str, str] = {}

            def put(key: str, value: bytes, entries: dict[str, str] = entries) -> None:
                entries[key] = value.decode()

            view.for_each(put)
            if wait_key is None or entries.get(wait_key, "") == wait_value:
                return {"entries": entries, "size": len(view)}
            if time.monotonic() > deadline:
                return {"entries": entries, "size": len(view), "timed_out": True}
            time.sleep(0.05)

    def send_background(
        self,
        producer: str,
        count: int,
        prefix: str = "m",
        explicit_sequence_ids: bool = False,
        start_sequence_id: int = 0,
        interval_ms: float = 0.0,
    ) -> dict:
        """Send count messages "PREFIX-i" with send_async, interval_ms apart (a pace, so
        that a fault lands mid-stream) or as fast as the producer takes them, on a
        thread; `background` tells how they went."""
        target = self.objects[producer]
        results: list[Any] = [None] * count
        state = {"results": results, "settled": 0, "lock": threading.Lock(),
                 "done": threading.Event()}  # fmt: skip
        self.background = state

        def callback(index: int) -> Any:
            def called(result: Any, found: Any) -> None:
                with state["lock"]:
                    ok = result == pulsar.Result.Ok
                    results[index] = [result_name(result), id_of(found) if ok else None]
                    state["settled"] += 1
                    if state["settled"] == count:
                        state["done"].set()

            return called

        def run() -> None:
            for i in range(count):
                given = {"sequence_id": start_sequence_id + i} if explicit_sequence_ids else {}
                try:
                    target.send_async(f"{prefix}-{i}".encode(), callback(i), **given)
                except Exception as error:  # (queue full without blocking, closed)
                    callback(i)(error, None)
                if interval_ms:
                    time.sleep(interval_ms / 1000)

        threading.Thread(target=run, daemon=True).start()
        return {}

    def background_state(self, wait_s: float = 0.0) -> dict:
        state = self.background
        if wait_s:
            state["done"].wait(wait_s)
        with state["lock"]:
            return {"settled": state["settled"], "results": list(state["results"])}


def main() -> None:
    driver = Driver()
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "exit":
            break
        handler = driver.background_state if op == "background" else getattr(driver, op)
        try:
            answer = handler(**command)
        except Exception as error:
            LOG.info("%s failed: %r", op, error)
            answer = {"error": type(error).__name__, "message": str(error)}
        _answers.write(json.dumps(answer) + "\n")
    for found in list(driver.objects.values()):
        if isinstance(found, pulsar.Client):
            found.close()
    _answers.write(json.dumps({"bye": True}) + "\n")


if __name__ == "__main__":
    main()
