"""docs/pulsar.md, row by row: each row of its table is checked here, with the blocking
API a pulsar-client user writes, in each mode the row names (a row of one mode: the
other refuses it with a typed error naming that mode). A row without a check, or a check
without its row, fails the test."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pytest

import streamlib
from streamlib import errors
from streamlib.schema import JsonSchema
from streamlib.stream.positions import EARLIEST, LATEST, MessageId
from tests.integration.conftest import LedgerCluster

PAGE = Path(__file__).resolve().parents[2] / "docs" / "pulsar.md"
Check = Callable[[Any, str, str], None]  # (client, mode, the URL the CLI is given)
CHECKS: dict[str, Check] = {}


def row(first_cell: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        CHECKS[first_cell] = check
        return check

    return register


def table() -> dict[str, str]:
    """The table's rows: first cell -> modes (the page's first table: the sections after
    it are about Pulsar's own clients, tested with them in tests/integration)."""
    found = {}
    for line in PAGE.read_text().split("\n## ")[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("pulsar-client", "---"):
            found[cells[0]] = cells[2]
    return found


def sent(client: Any, stream: str, *payloads: bytes, **options: Any) -> list[MessageId]:
    producer = client.create_producer(stream, **options)
    ids = [producer.send(p) for p in payloads]
    producer.close()
    return ids


def received(consumer: Any, count: int) -> list[Any]:
    messages = [consumer.receive(timeout=30) for _ in range(count)]
    for message in messages:
        consumer.acknowledge(message)
    return messages


def cli(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "streamlib", *argv], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclasses.dataclass
class Record:
    n: int


# -- the client, producers --------------------------------------------------------------


@row('`pulsar.Client("pulsar://host:6650")`')
def _connect(client: Any, mode: str, url: str) -> None:
    assert isinstance(sent(client, "r-connect", b"x")[0], MessageId)


@row("`client.create_producer(topic)`")
def _create_producer(client: Any, mode: str, url: str) -> None:
    sent(client, "r-made", b"x")
    assert "r-made" in client.streams.list()


@row(
    "`access_mode=ProducerAccessMode.Shared` (`Exclusive`, `WaitForExclusive`, `ExclusiveWithFencing`)"
)
def _access_mode(client: Any, mode: str, url: str) -> None:
    if mode == "direct":
        with pytest.raises(errors.BadRequestError, match="stream service"):
            client.create_producer("r-access", access_mode=pulsar.ProducerAccessMode.Shared)
        return
    first = client.create_producer("r-access", access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(errors.ProducerBusyError):
        client.create_producer("r-access", access_mode="shared")
    first.close()
    shared = [client.create_producer("r-access", access_mode=pulsar.ProducerAccessMode.Shared)
              for _ in range(2)]  # fmt: skip
    for producer in shared:
        producer.send(b"x")
        producer.close()


@row("`producer.send(data)` / `send_async(data, callback)`")
def _send(client: Any, mode: str, url: str) -> None:
    producer = client.create_producer("r-send")
    calls: list[tuple[Any, Any]] = []
    future = producer.send_async(b"a", callback=lambda e, m: calls.append((e, m)))
    first = future.result(timeout=30)
    producer.flush()
    assert calls == [(None, first)]
    assert producer.send(b"b") > first
    producer.close()


@row("`producer.send(data, sequence_id=n)`")
def _sequence_id(client: Any, mode: str, url: str) -> None:
    producer = client.create_producer("r-dedup", producer_name="p")
    ids = [producer.send(b"%d" % i, sequence_id=i) for i in range(3)]
    assert producer.send(b"again", sequence_id=1) == ids[1]
    producer.close()
    reader = client.create_reader("r-dedup", EARLIEST)
    assert [reader.read_next(timeout=30).data for _ in range(3)] == [b"0", b"1", b"2"]
    assert not reader.has_message_available()
    reader.close()


def _round_trip(client: Any, stream: str, **options: Any) -> None:
    data = [b"%d " % i + b"z" * 3000 for i in range(20)]
    sent(client, stream, *data, **options)
    reader = client.create_reader(stream, EARLIEST)
    assert [reader.read_next(timeout=30).data for _ in data] == data
    reader.close()


@row("`compression_type=CompressionType.ZSTD`")
def _compression(client: Any, mode: str, url: str) -> None:
    _round_trip(client, "r-zstd", compression_type=pulsar.CompressionType.ZSTD)


@row("`CompressionType.SNAPPY` / `LZ4` / `ZLib` / `ZSTD`")
def _codecs(client: Any, mode: str, url: str) -> None:
    for codec in ("snappy", "lz4", "zlib", streamlib.CompressionType.ZSTD,
                  pulsar.CompressionType.LZ4):  # fmt: skip
        _round_trip(client, f"r-codec-{str(codec).rpartition('.')[2].lower()}",
                    compression_type=codec)  # fmt: skip


@row("`producer.send(data, partition_key=k)`")
def _key(client: Any, mode: str, url: str) -> None:
    producer = client.create_producer("r-key")
    producer.send(b"x", key="k")
    producer.close()
    assert client.create_reader("r-key", EARLIEST).read_next(timeout=30).key == "k"


@row("`producer.send(data, ordering_key=k)`")
def _ordering_key(client: Any, mode: str, url: str) -> None:
    producer = client.create_producer("r-okey")
    producer.send(b"x", ordering_key="o")
    producer.close()
    assert client.create_reader("r-okey", EARLIEST).read_next(timeout=30).ordering_key() == b"o"


@row("`chunking_enabled=True`")
def _chunks(client: Any, mode: str, url: str) -> None:
    large = bytes(range(256)) * (5 * 4096 + 1)
    sent(client, "r-chunks", large, chunking_enabled=True, access_mode="exclusive_with_fencing")
    assert client.create_reader("r-chunks", EARLIEST).read_next(timeout=30).data == large


@row("`deliver_after` / `deliver_at`")
def _delayed(client: Any, mode: str, url: str) -> None:
    producer = client.create_producer("r-later")
    consumer = client.subscribe("r-later", "s")
    producer.send(b"later", deliver_after=200)
    producer.send(b"now")
    producer.close()
    assert [m.data for m in received(consumer, 2)] == [b"now", b"later"]
    consumer.close()


@row("`batching_max_messages`, `batching_max_publish_delay_ms`")
def _batching(client: Any, mode: str, url: str) -> None:
    producer = client.create_producer("r-batch", batching_max_messages=10,
                                      batching_max_publish_delay_ms=50)  # fmt: skip
    futures = [producer.send_async(b"%d" % i) for i in range(30)]
    producer.flush()
    ids = [f.result(timeout=30) for f in futures]
    producer.close()
    assert max(i.batch_index for i in ids) > 0  # several messages to an entry
    assert len({(i.ledger_id, i.entry_id) for i in ids}) >= 3  # at most 10 each


@row("`producer.flush()`")
def _flush(client: Any, mode: str, url: str) -> None:
    producer = client.create_producer("r-flush")
    futures = [producer.send_async(b"x") for _ in range(100)]
    producer.flush()
    assert all(f.done() for f in futures)
    producer.close()


# -- consumers --------------------------------------------------------------------------


@row("`client.subscribe(topic, sub, consumer_type=ConsumerType.Exclusive)`")
def _exclusive(client: Any, mode: str, url: str) -> None:
    sent(client, "r-excl", b"x")
    first = client.subscribe("r-excl", "s", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(errors.ConsumerBusyError):
        client.subscribe("r-excl", "s", consumer_type="exclusive")
    first.close()
    standby = [client.subscribe("r-excl", "f", consumer_type=pulsar.ConsumerType.Failover)
               for _ in range(2)]  # fmt: skip
    for consumer in standby:
        consumer.close()


@row("`consumer_type=ConsumerType.Shared` / `KeyShared`")
def _shared(client: Any, mode: str, url: str) -> None:
    sent(client, "r-shared", b"x")
    if mode == "direct":
        for kind in (pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared):
            with pytest.raises(errors.UnsupportedConsumerTypeError, match="stream service"):
                client.subscribe("r-shared", "s", consumer_type=kind)
        return
    consumers = [client.subscribe("r-shared", "s", "earliest", consumer_type=kind)
                 for kind in (pulsar.ConsumerType.Shared, "shared")]  # fmt: skip
    keyed = client.subscribe(
        "r-shared", "k", "earliest", consumer_type=pulsar.ConsumerType.KeyShared
    )
    assert keyed.receive(timeout=30).data == b"x"
    for consumer in [*consumers, keyed]:
        consumer.close()


@row("`initial_position=InitialPosition.Earliest` / `.Latest`")
def _initial_position(client: Any, mode: str, url: str) -> None:
    sent(client, "r-initial", b"old")
    earliest = client.subscribe("r-initial", "e", initial_position=pulsar.InitialPosition.Earliest)
    latest = client.subscribe("r-initial", "l", initial_position=streamlib.InitialPosition.Latest)
    sent(client, "r-initial", b"new")
    assert [m.data for m in received(earliest, 2)] == [b"old", b"new"]
    assert [m.data for m in received(latest, 1)] == [b"new"]
    earliest.close()
    latest.close()


@row("`client.subscribe(topic, ...)` of a topic that does not exist")
def _missing(client: Any, mode: str, url: str) -> None:
    with pytest.raises(errors.NoSuchStreamError):
        client.subscribe("r-nowhere", "s")
    assert "r-nowhere" not in client.streams.list()


@row("`client.subscribe([topic1, topic2], sub)`")
def _several(client: Any, mode: str, url: str) -> None:
    sent(client, "r-eu", b"eu")
    sent(client, "r-us", b"us")
    consumer = client.subscribe(["r-eu", "r-us"], "all", "earliest")
    assert sorted(m.data for m in received(consumer, 2)) == [b"eu", b"us"]
    consumer.consumer("r-eu").seek(EARLIEST)
    assert received(consumer, 1)[0].data == b"eu"
    consumer.close()


@row("`consumer.receive(timeout_millis=...)`")
def _receive_timeout(client: Any, mode: str, url: str) -> None:
    sent(client, "r-quiet", b"x")
    consumer = client.subscribe("r-quiet", "s")
    with pytest.raises(TimeoutError):
        consumer.receive(timeout=0.2)
    consumer.close()


@row("`consumer.acknowledge(msg)` / `negative_acknowledge(msg)`")
def _acks(client: Any, mode: str, url: str) -> None:
    sent(client, "r-acks", b"a", b"b")
    consumer = client.subscribe("r-acks", "s", "earliest", negative_ack_redelivery_delay_ms=50)
    first, second = consumer.receive(timeout=30), consumer.receive(timeout=30)
    consumer.acknowledge(first.message_id)
    consumer.negative_acknowledge(second)
    again = consumer.receive(timeout=30)
    assert (again.data, again.redelivery_count) == (b"b", 1)
    consumer.acknowledge(again)
    consumer.close()


@row("`consumer.acknowledge_cumulative(msg)`")
def _cumulative(client: Any, mode: str, url: str) -> None:
    sent(client, "r-cumul", b"a", b"b", b"c")
    consumer = client.subscribe("r-cumul", "s", "earliest")
    messages = [consumer.receive(timeout=30) for _ in range(3)]
    consumer.acknowledge_cumulative(messages[1])
    consumer.acknowledge(messages[2])
    consumer.close()
    assert client.streams.cursors("r-cumul")["s"] == messages[2].message_id


@row("`dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=3)`")
def _dead_letters(client: Any, mode: str, url: str) -> None:
    sent(client, "r-poison", b"bad")
    consumer = client.subscribe("r-poison", "s", "earliest", negative_ack_redelivery_delay_ms=20,
                                dead_letter_policy=streamlib.DeadLetterPolicy(max_redeliver_count=0))  # fmt: skip
    consumer.negative_acknowledge(consumer.receive(timeout=30))
    with pytest.raises(TimeoutError):  # (its second coming goes to the dead letters)
        consumer.receive(timeout=2)
    dead = client.subscribe("r-poison-s-DLQ", "d", "earliest")
    assert received(dead, 1)[0].properties["REAL_TOPIC"] == "r-poison"
    consumer.close()
    dead.close()


@row("`unacked_messages_timeout_ms=...`")
def _ack_timeout(client: Any, mode: str, url: str) -> None:
    sent(client, "r-slow", b"m")
    consumer = client.subscribe("r-slow", "s", "earliest", ack_timeout_ms=100,
                                negative_ack_redelivery_delay_ms=20)  # fmt: skip
    first = consumer.receive(timeout=30)
    again = consumer.receive(timeout=30)
    assert again.data == first.data and again.redelivery_count == 1
    consumer.acknowledge(again)
    consumer.close()


@row("`consumer.batch_receive()`")
def _batch_receive(client: Any, mode: str, url: str) -> None:
    sent(client, "r-batches", b"a", b"b", b"c")
    consumer = client.subscribe("r-batches", "s", "earliest")
    got: list[Any] = []
    while len(got) < 3:
        got += consumer.batch_receive(max_num_messages=3, timeout_ms=5000)
    assert [m.data for m in got] == [b"a", b"b", b"c"]
    consumer.close()


@row("`message_listener=fn`")
def _listener(client: Any, mode: str, url: str) -> None:
    seen: list[tuple[bytes, int]] = []
    done = threading.Event()

    def listener(consumer: Any, message: Any) -> None:
        seen.append((message.data, message.redelivery_count))
        if message.redelivery_count == 0:
            raise RuntimeError("not yet")
        consumer.acknowledge(message)
        done.set()

    sent(client, "r-listen", b"x")
    consumer = client.subscribe("r-listen", "s", "earliest", message_listener=listener,
                                negative_ack_redelivery_delay_ms=20)  # fmt: skip
    assert done.wait(30)
    assert seen == [(b"x", 0), (b"x", 1)]
    consumer.close()


@row("`consumer.seek(msg_id)`")
def _consumer_seek(client: Any, mode: str, url: str) -> None:
    ids = sent(client, "r-seek", b"0", b"1", b"2")
    consumer = client.subscribe("r-seek", "s", "earliest")
    received(consumer, 3)
    consumer.seek(ids[1])  # that message comes next
    assert [m.data for m in received(consumer, 2)] == [b"1", b"2"]
    consumer.seek(pulsar.MessageId.earliest)
    assert received(consumer, 1)[0].data == b"0"
    consumer.close()


@row("`consumer.unsubscribe()`")
def _unsubscribe(client: Any, mode: str, url: str) -> None:
    sent(client, "r-unsub", b"x")
    consumer = client.subscribe("r-unsub", "gone")
    consumer.unsubscribe()
    assert "gone" not in client.streams.cursors("r-unsub")


@row("`client.create_reader(topic, start, start_message_id_inclusive=...)`")
def _reader(client: Any, mode: str, url: str) -> None:
    ids = sent(client, "r-reader", b"0", b"1")
    assert client.create_reader("r-reader", ids[0]).read_next(timeout=30).data == b"1"
    inclusive = client.create_reader("r-reader", ids[0], start_message_id_inclusive=True)
    assert inclusive.read_next(timeout=30).data == b"0"
    latest = client.create_reader("r-reader", LATEST)
    sent(client, "r-reader", b"2")
    assert latest.read_next(timeout=30).data == b"2"


@row("`reader.seek(msg_id)` / `reader.seek(timestamp)`")
def _reader_seek(client: Any, mode: str, url: str) -> None:
    ids = sent(client, "r-rseek", b"0", b"1")
    time.sleep(0.01)  # (publish times apart: a time to seek to)
    middle = int(time.time() * 1000)
    time.sleep(0.01)
    sent(client, "r-rseek", b"2")
    reader = client.create_reader("r-rseek", EARLIEST)
    reader.seek(ids[0])
    assert reader.read_next(timeout=30).data == b"1"
    reader.seek(middle)
    assert reader.read_next(timeout=30).data == b"2"


@row("`reader.has_message_available()`")
def _has_message(client: Any, mode: str, url: str) -> None:
    sent(client, "r-avail", b"x")
    reader = client.create_reader("r-avail", EARLIEST)
    assert reader.has_message_available()
    reader.read_next(timeout=30)
    assert not reader.has_message_available()


def _changelog(client: Any, stream: str) -> None:
    producer = client.create_producer(stream)
    for i in range(6):
        producer.send(b"%d" % i, key=f"k{i % 2}")
    producer.close()


@row(
    "`create_reader(topic, start, is_read_compacted=True)`, "
    "`subscribe(..., is_read_compacted=True)`"
)
def _read_compacted(client: Any, mode: str, url: str) -> None:
    _changelog(client, "r-compacted")
    client.streams.compact("r-compacted")
    reader = client.create_reader("r-compacted", EARLIEST, read_compacted=True)
    assert [reader.read_next(timeout=30).data for _ in range(2)] == [b"4", b"5"]
    consumer = client.subscribe("r-compacted", "s", "earliest", read_compacted=True)
    assert [m.data for m in received(consumer, 2)] == [b"4", b"5"]
    with pytest.raises(errors.BadRequestError):
        client.subscribe("r-compacted", "t", consumer_type="shared", read_compacted=True)


@row("`client.create_table_view(topic, schema=...)`")
def _table_view(client: Any, mode: str, url: str) -> None:
    _changelog(client, "r-table")
    with client.create_table_view("r-table") as table:
        assert len(table) == 2 and table.get("k0") == b"4" and "k1" in table


@row("`pulsar-admin topics compact` / `compaction-status`")
def _compact(client: Any, mode: str, url: str) -> None:
    _changelog(client, "r-compact")
    assert "2 keys from 6" in cli("admin", "streams", "compact", "r-compact", "--metadata", url)
    assert client.streams.compact("r-compact").compacted is False  # (nothing new)
    md = client.streams.set_policies("r-compact", compaction_threshold_bytes=4096)
    assert md.compaction_threshold_bytes == 4096


@row("`MessageId.earliest` / `MessageId.latest`")
def _pulsar_ends(client: Any, mode: str, url: str) -> None:
    sent(client, "r-ends", b"x")
    assert (
        client.create_reader("r-ends", pulsar.MessageId.earliest).read_next(timeout=30).data == b"x"
    )
    latest = client.create_reader("r-ends", pulsar.MessageId.latest)
    assert not latest.has_message_available()


@row("`MessageId(partition, ledger_id, entry_id, batch_index)`")
def _pulsar_id(client: Any, mode: str, url: str) -> None:
    ids = sent(client, "r-pid", b"0", b"1")
    theirs = pulsar.MessageId(-1, ids[0].ledger_id, ids[0].entry_id, -1)  # (not batched)
    assert client.create_reader("r-pid", theirs).read_next(timeout=30).data == b"1"


@row("`msg_id.ledger_id()`, `.entry_id()`, `.batch_index()`")
def _id_fields(client: Any, mode: str, url: str) -> None:
    [mid] = sent(client, "r-fields", b"x")
    assert (mid.ledger_id, mid.entry_id, mid.batch_index) == tuple(mid)


def _one(client: Any, stream: str, **send: Any) -> Any:
    producer = client.create_producer(stream, producer_name="named")
    producer.send(b"x", **send)
    producer.close()
    return client.create_reader(stream, EARLIEST).read_next(timeout=30)


@row("`msg.data()`, `msg.properties()`, `msg.message_id()`")
def _message_fields(client: Any, mode: str, url: str) -> None:
    message = _one(client, "r-msg", properties={"a": "b"})
    assert (message.data, message.properties) == (b"x", {"a": "b"})
    assert isinstance(message.message_id, MessageId)


@row("`msg.redelivery_count()`, `msg.producer_name()`")
def _message_counts(client: Any, mode: str, url: str) -> None:
    message = _one(client, "r-msg2")
    assert (message.redelivery_count, message.producer_name) == (0, "named")


@row("`msg.partition_key()`")
def _partition_key(client: Any, mode: str, url: str) -> None:
    assert _one(client, "r-pk", key="k").partition_key() == "k"
    assert _one(client, "r-pk-none").partition_key() is None


@row("`msg.ordering_key()`")
def _msg_ordering_key(client: Any, mode: str, url: str) -> None:
    assert _one(client, "r-ok", ordering_key=b"o").ordering_key() == b"o"
    assert _one(client, "r-ok-none").ordering_key() is None


@row("`msg.publish_timestamp()`, `msg.event_timestamp()`")
def _timestamps(client: Any, mode: str, url: str) -> None:
    message = _one(client, "r-times", event_time=1234)
    assert message.event_timestamp() == message.event_time_ms == 1234
    assert message.publish_timestamp() == message.publish_time_ms > 0


@row("`msg.topic_name()`")
def _topic_name(client: Any, mode: str, url: str) -> None:
    assert _one(client, "r-topic").topic_name() == "r-topic"


@row("`schema=JsonSchema(Record)`")
def _schema(client: Any, mode: str, url: str) -> None:
    producer = client.create_producer("r-schema", schema=JsonSchema(Record))
    producer.send(Record(7))
    producer.close()
    reader = client.create_reader("r-schema", EARLIEST, schema=JsonSchema(Record))
    assert reader.read_next(timeout=30).value() == Record(7)


# -- administration ---------------------------------------------------------------------


@row("`pulsar-admin topics create-partitioned-topic -p N`")
def _partitioned(client: Any, mode: str, url: str) -> None:
    cli("admin", "streams", "create", "r-parts", "--partitions", "2", "--metadata", url)
    client.streams.create("r-parts-api", partitions=3)
    assert client.streams.partitions("r-parts") == 2
    assert client.streams.partitions("r-parts-api") == 3


@row("`pulsar-admin topics list` / `stats`")
def _list(client: Any, mode: str, url: str) -> None:
    sent(client, "r-listed", b"x")
    assert "r-listed" in cli("admin", "streams", "list", "--metadata", url)
    assert client.streams.stats("r-listed")["name"] == "r-listed"


@row("`pulsar-admin topics reset-cursor`")
def _reset(client: Any, mode: str, url: str) -> None:
    sent(client, "r-reset", b"0", b"1")
    consumer = client.subscribe("r-reset", "s", "earliest")
    received(consumer, 2)
    consumer.close()
    client.streams.reset_cursor("r-reset", "s", EARLIEST)
    again = client.subscribe("r-reset", "s")
    assert received(again, 1)[0].data == b"0"
    again.close()


@row("client metrics")
def _metrics(client: Any, mode: str, url: str) -> None:
    sent(client, "r-metrics", b"x", b"y")
    assert client.stats()["producers"]["r-metrics"]["sent"] == 2
    port = client.serve_metrics(0)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
    assert 'streamlib_client_messages_sent_total{stream="r-metrics"} 2.0' in body


def test_every_row_has_a_check_and_every_check_a_row() -> None:
    rows = table()
    assert set(rows) == set(CHECKS), set(rows) ^ set(CHECKS)
    assert set(rows.values()) <= {"both", "service", "direct"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["direct", "service"])
def test_each_row_holds_in_its_modes(cluster: LedgerCluster, mode: str) -> None:
    cluster.start_bookies(3)
    if mode == "service":
        cluster.start_brokers(1)
        url = cluster.service_url
    else:
        url = cluster.metadata_uri
    failed = []
    with streamlib.connect(url) as client:
        for first_cell, modes in table().items():
            try:
                CHECKS[first_cell](client, mode, url)
            except Exception as error:  # (every row is tried: all failures are shown)
                failed.append(f"{first_cell} [{modes}]: {type(error).__name__}: {error}")
    assert not failed, "\n".join(failed)
