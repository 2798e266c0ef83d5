"""The official Pulsar Python client (pulsar-client, the C++ client inside), unmodified,
against `streamlib broker --pulsar-port` on real bookies: each test drives pulsar-client
programs in processes of their own (tests/integration/pulsar_programs/driver.py) as a
user's program would, and checks exactly what they print, and -- where streamlib's own
clients take part -- what those read and write.

One cluster (3 bookies, 2 brokers serving Pulsar's protocol) serves the whole module:
each test has topics of its own, and the pulsar-client programs are given both brokers
(lookups redirect them to each topic's owner). A broker that died during a test fails
that test and is started again for the next."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamlib.pulsar import PulsarApi_pb2 as api
from streamlib.stream.partitioned import partition_of
from streamlib.stream.positions import EARLIEST
from tests.integration.conftest import LedgerCluster
from tests.integration.pulsar_programs import Program, ProgramError, Programs, payload

pytestmark = pytest.mark.timeout(120)

EVENT_TIME_MS = 1_700_000_000_000  # messages' event times count up from here


class SharedCluster(LedgerCluster):
    """A test's view of the module's cluster: its streamlib clients are closed at the
    end of the test, its processes go on."""

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    @property
    def pulsar_urls(self) -> str:
        """Every broker's Pulsar port, as a pulsar-client service URL lists them."""
        return "pulsar://" + ",".join(b.pulsar_url.split("://", 1)[1] for b in self.brokers)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerCluster]:
    root = tmp_path_factory.mktemp("pulsar-cluster")
    cluster = LedgerCluster(root, f"sqlite://{root / 'meta.db'}")
    try:
        cluster.start_bookies(3)
        cluster.start_brokers(2, pulsar=True)
        yield cluster
    finally:
        for process in [*cluster.brokers, *cluster.bookies]:
            process.kill()


@pytest.fixture
async def cluster(shared_cluster: LedgerCluster) -> Any:
    view = SharedCluster(shared_cluster.root, shared_cluster.metadata_uri)
    view.bookies, view.brokers = shared_cluster.bookies, shared_cluster.brokers
    try:
        yield view
    finally:
        await view.close()
    died = [b for b in view.brokers if b.proc is None or b.proc.poll() is not None]
    for broker in died:
        tail = broker.stderr_tail()
        broker.start()
        pytest.fail(f"broker {broker.broker_id} died during the test:\n{tail}")


@pytest.fixture
async def programs(tmp_path: Path) -> Any:
    """`await programs()`: a pulsar-client program, stopped at the end of the test."""
    async with Programs(tmp_path) as start:
        yield start


def topic(name: str) -> str:
    return f"persistent://public/default/{name}"


def messages(prefix: str, count: int, keys: int = 3) -> list[dict[str, Any]]:
    """count messages with every field pulsar-client sends set, each different."""
    return [
        {
            "data": f"{prefix}-{i}",
            "properties": {"index": str(i), "prefix": prefix},
            "partition_key": f"{prefix}-key-{i % keys}",
            "ordering_key": f"order-{i % 2}",
            "event_timestamp": EVENT_TIME_MS + i,
        }
        for i in range(count)
    ]


def as_sent(got: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Received messages as messages() describes them."""
    fields = ("data", "properties", "partition_key", "ordering_key", "event_timestamp")
    return [{name: m[name] for name in fields} for m in got]


def datas(got: list[dict[str, Any]]) -> list[str]:
    return [m["data"] for m in got]


async def connect(programs: Any, cluster: SharedCluster) -> tuple[Program, str]:
    program = await programs()
    return program, await program.client(cluster.pulsar_urls)


def broker_logs(cluster: LedgerCluster) -> str:
    return "\n".join(f"--- {b.broker_id}:\n{b.stderr_tail(3000)}" for b in cluster.brokers)


# -- 1. produce and consume with pulsar-client ----------------------------------------------


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "unbatched"])
async def test_messages_keep_payload_properties_keys_and_event_time(cluster, programs, batching):
    name = f"roundtrip-{'batched' if batching else 'unbatched'}"
    program, client = await connect(programs, cluster)
    consumer = await program.subscribe(client, topic(name), "s", initial_position="Earliest")
    producer, info = await program.producer(client, topic(name), batching_enabled=batching)
    sent = messages(name, 30)
    if batching:  # (send_async: several messages go in one batch)
        ids = await program.send_async(producer, sent)
    else:
        ids = await program.send(producer, sent)
    got = await program.receive(consumer, 30)
    assert as_sent(got) == sent
    assert [m["id"] for m in got] == ids
    assert {m["producer_name"] for m in got} == {info["producer_name"]}
    assert all(m["topic"] == topic(name) for m in got)
    entries = {(i[0], i[1]) for i in ids}
    if batching:
        assert len(entries) < len(ids) and all(i[2] >= 0 for i in ids)
    else:
        assert len(entries) == len(ids) and all(i[2] == -1 for i in ids)
    assert await program.drain(consumer, timeout_ms=500) == []


async def test_an_exclusive_subscription_refuses_a_second_consumer(cluster, programs):
    program, client = await connect(programs, cluster)
    first = await program.subscribe(client, topic("exclusive"), "only", initial_position="Earliest")
    other, other_client = await connect(programs, cluster)
    with pytest.raises(ProgramError) as busy:
        await other.subscribe(other_client, topic("exclusive"), "only")
    assert busy.value.error == "ConsumerBusy"
    producer, _ = await program.producer(client, topic("exclusive"))
    sent = messages("exclusive", 20)
    await program.send(producer, sent)
    assert as_sent(await program.receive(first, 20)) == sent


async def test_failover_hands_the_unacknowledged_to_the_next_consumer(cluster, programs):
    a, a_client = await connect(programs, cluster)
    b, b_client = await connect(programs, cluster)
    options = {"consumer_type": "Failover", "initial_position": "Earliest"}
    consumers = [
        (a, await a.subscribe(a_client, topic("failover"), "f", consumer_name="a", **options)),
        (b, await b.subscribe(b_client, topic("failover"), "f", consumer_name="b", **options)),
    ]
    producer, _ = await a.producer(a_client, topic("failover"))
    sent = messages("failover", 20)
    await a.send(producer, sent)
    got = await asyncio.gather(*(p.drain(c, timeout_ms=2000, ack="none") for p, c in consumers))
    # One of them is active and receives everything, in order; the other nothing.
    [(active, consumer, received)] = [
        (p, c, g) for (p, c), g in zip(consumers, got, strict=True) if g
    ]
    assert as_sent(received) == sent
    [(standby, waiting)] = [(p, c) for p, c in consumers if p is not active]
    await active.run("ack", id=consumer, refs=[received[9]["ref"]], kind="cumulative")
    await active.close(consumer)
    # The standby takes over from the first message not acknowledged.
    assert as_sent(await standby.receive(waiting, 10)) == sent[10:]
    assert await standby.drain(waiting, timeout_ms=500) == []


async def test_shared_consumers_split_the_messages_without_duplicates(cluster, programs):
    a, a_client = await connect(programs, cluster)
    b, b_client = await connect(programs, cluster)
    options = {"consumer_type": "Shared", "initial_position": "Earliest", "receiver_queue_size": 5}
    consumers = [
        (a, await a.subscribe(a_client, topic("shared"), "sh", **options)),
        (b, await b.subscribe(b_client, topic("shared"), "sh", **options)),
    ]
    producer, _ = await a.producer(a_client, topic("shared"))
    sent = messages("shared", 40)
    await a.send(producer, sent)
    got = await asyncio.gather(*(p.drain(c, timeout_ms=2000) for p, c in consumers))
    together = [m["data"] for g in got for m in g]
    assert sorted(together) == sorted(datas(sent)) and len(together) == len(set(together))
    assert all(got), "each shared consumer gets some of the messages"
    by_data = {m["data"]: m for m in sent}
    for g in got:  # each message as sent, each consumer's in the order produced
        assert as_sent(g) == [by_data[m["data"]] for m in g]
        assert [m["id"] for m in g] == sorted(m["id"] for m in g)


async def test_key_shared_consumers_never_share_a_key(cluster, programs):
    a, a_client = await connect(programs, cluster)
    b, b_client = await connect(programs, cluster)
    options = {"consumer_type": "KeyShared", "initial_position": "Earliest"}
    consumers = [
        (a, await a.subscribe(a_client, topic("keyshared"), "ks", consumer_name="a", **options)),
        (b, await b.subscribe(b_client, topic("keyshared"), "ks", consumer_name="b", **options)),
    ]
    producer, _ = await a.producer(a_client, topic("keyshared"))
    sent = messages("keyshared", 60, keys=12)
    for m in sent:  # (key_shared splits by the ordering key when one is given)
        m["ordering_key"] = m["partition_key"]
    await a.send(producer, sent)
    got = await asyncio.gather(*(p.drain(c, timeout_ms=2000) for p, c in consumers))
    together = [m["data"] for g in got for m in g]
    assert sorted(together) == sorted(datas(sent)) and len(together) == len(set(together))
    keys = [{m["partition_key"] for m in g} for g in got]
    assert keys[0] and keys[1] and not keys[0] & keys[1], keys
    by_data = {m["data"]: m for m in sent}
    for g in got:  # each message as sent, each key's in the order produced
        assert as_sent(g) == [by_data[m["data"]] for m in g]
        for key in {m["partition_key"] for m in g}:
            mine = [m["data"] for m in g if m["partition_key"] == key]
            assert mine == [m["data"] for m in sent if m["partition_key"] == key]


# -- 2. pulsar-client and streamlib's clients on the same streams ----------------------------


def same_message(streamlib_message: Any, sent: dict[str, Any], pulsar_id: list[int]) -> None:
    assert streamlib_message.data == sent["data"].encode()
    assert streamlib_message.key == sent["partition_key"]
    assert streamlib_message.properties == sent["properties"]
    assert streamlib_message.event_time_ms == sent["event_timestamp"]
    assert streamlib_message.ordering_key() == sent["ordering_key"].encode()
    found = streamlib_message.message_id
    ledger, entry, batch_index, _ = pulsar_id
    assert (found.ledger_id, found.entry_id, found.batch_index) == (
        ledger, entry, max(batch_index, 0)
    )  # fmt: skip


async def test_what_pulsar_client_produces_streamlib_reads(cluster, programs):
    program, client = await connect(programs, cluster)
    batched, _ = await program.producer(client, topic("to-streamlib"), batching_enabled=True)
    single, _ = await program.producer(client, topic("to-streamlib"))
    sent = messages("to-streamlib", 20)
    ids = await program.send(single, sent[:5]) + await program.send_async(batched, sent[5:])

    direct = await cluster.client()
    reader = await direct.create_reader("to-streamlib", EARLIEST)
    for message, one, pulsar_id in zip(
        [await reader.read_next(timeout=30) for _ in sent], sent, ids, strict=True
    ):
        same_message(message, one, pulsar_id)
    assert not await reader.has_message_available()

    service = await cluster.service_client()
    consumer = await service.subscribe("to-streamlib", "sub", "earliest")
    for one, pulsar_id in zip(sent, ids, strict=True):
        message = await consumer.receive(timeout=30)
        same_message(message, one, pulsar_id)
        consumer.acknowledge(message)


@pytest.mark.parametrize("mode", ["direct", "service"])
async def test_what_streamlib_produces_pulsar_client_reads(cluster, programs, mode):
    name = f"from-streamlib-{mode}"
    streamlib = await (cluster.client() if mode == "direct" else cluster.service_client())
    producer = await streamlib.create_producer(name, producer_name=f"streamlib-{mode}")
    sent = messages(name, 20)
    futures = [
        await producer.send_async(m["data"].encode(), key=m["partition_key"],
                                  properties=m["properties"], event_time=m["event_timestamp"],
                                  ordering_key=m["ordering_key"])
        for m in sent
    ]  # fmt: skip
    await producer.flush()
    ids = [await f for f in futures]
    program, client = await connect(programs, cluster)
    consumer = await program.subscribe(client, topic(name), "s", initial_position="Earliest")
    got = await program.receive(consumer, 20)
    assert as_sent(got) == sent
    assert [(m["id"][0], m["id"][1]) for m in got] == [(i.ledger_id, i.entry_id) for i in ids]
    assert {m["producer_name"] for m in got} == {f"streamlib-{mode}"}
    assert await program.drain(consumer, timeout_ms=500) == []


async def test_one_subscription_consumed_in_turn_by_pulsar_client_and_streamlib(cluster, programs):
    """pulsar-client's and streamlib's consumers take turns on one subscription, each
    acknowledging what it took (individually or cumulatively) and closing: each takes
    up exactly where the last one's acknowledgements end."""
    name = "turns"
    program, client = await connect(programs, cluster)
    producer, _ = await program.producer(client, topic(name))
    sent = messages(name, 60)
    await program.send(producer, sent)
    service = await cluster.service_client()
    taken: list[str] = []
    for turn in range(6):
        if turn % 2 == 0:  # pulsar-client's
            consumer = await program.subscribe(client, topic(name), "turns",
                                               initial_position="Earliest")  # fmt: skip
            got = await program.receive(consumer, 10, ack="none")
            refs = [m["ref"] for m in got]
            if turn == 2:
                await program.run("ack", id=consumer, refs=refs[-1:], kind="cumulative")
            else:
                await program.run("ack", id=consumer, refs=refs)
            await program.close(consumer)
            taken += datas(got)
        else:  # streamlib's, through the brokers
            consumer = await service.subscribe(name, "turns", "earliest")
            got = [await consumer.receive(timeout=30) for _ in range(10)]
            if turn == 3:
                consumer.acknowledge_cumulative(got[-1])
            else:
                for message in got:
                    consumer.acknowledge(message)
            await consumer.close()
            taken += [m.data.decode() for m in got]
    assert taken == datas(sent)
    consumer = await program.subscribe(client, topic(name), "turns")
    assert await program.drain(consumer, timeout_ms=1000) == []


# -- 3. readers ---------------------------------------------------------------------------


async def produce_mixed(program: Program, client: str, name: str) -> tuple[list, list]:
    """20 messages: 5 alone, 10 in batches of 5, 5 alone."""
    single, _ = await program.producer(client, topic(name))
    batched, _ = await program.producer(client, topic(name), batching_enabled=True,
                                        batching_max_messages=5,
                                        batching_max_publish_delay_ms=1000)  # fmt: skip
    sent = messages(name, 20)
    ids = await program.send(single, sent[:5])
    ids += await program.send_async(batched, sent[5:15])
    ids += await program.send(single, sent[15:])
    assert [i[2] for i in ids[5:15]] == [0, 1, 2, 3, 4] * 2, ids
    return sent, ids


async def test_readers_start_at_earliest_latest_and_ids(cluster, programs):
    name = "readers"
    program, client = await connect(programs, cluster)
    sent, ids = await produce_mixed(program, client, name)

    earliest = await program.reader(client, topic(name), "earliest")
    assert (await program.run("has_message_available", id=earliest))["available"]
    assert as_sent(await program.receive(earliest, 20, ack="none")) == sent
    assert not (await program.run("has_message_available", id=earliest))["available"]
    timed_out = await program.run("receive", id=earliest, count=1, timeout_ms=500)
    assert timed_out == {"messages": [], "timed_out": True}

    # From an id: the message after it, or (inclusive) the message itself -- one alone
    # (2, 17), one inside a batch (7), one ending a batch (9).
    for index in (2, 7, 9, 17):
        after = await program.reader(client, topic(name), ids[index])
        got = await program.receive(after, 1, ack="none")
        assert datas(got) == [sent[index + 1]["data"]], index
        inclusive = await program.reader(client, topic(name), ids[index],
                                         start_message_id_inclusive=True)  # fmt: skip
        got = await program.receive(inclusive, 20 - index, ack="none")
        assert datas(got) == datas(sent[index:]), index

    latest = await program.reader(client, topic(name), "latest")
    assert not (await program.run("has_message_available", id=latest))["available"]
    producer, _ = await program.producer(client, topic(name))
    await program.send(producer, [{"data": "after latest"}])
    assert datas(await program.receive(latest, 1, ack="none")) == ["after latest"]


async def test_a_reader_seeks_to_an_id_and_to_a_time(cluster, programs):
    name = "reader-seeks"
    program, client = await connect(programs, cluster)
    sent, ids = await produce_mixed(program, client, name)
    reader = await program.reader(client, topic(name), "earliest")
    got = await program.receive(reader, 20, ack="none")
    for index in (3, 7, 0):  # (seek takes the reader back: after that message)
        await program.run("seek", id=reader, message_id=ids[index])
        again = await program.receive(reader, 19 - index, ack="none")
        assert datas(again) == datas(sent[index + 1 :]), index
    # A time: from the first message published at or after it.
    published = [m["publish_timestamp"] for m in got]
    first = next(i for i, t in enumerate(published) if t >= published[12])
    await program.run("seek", id=reader, timestamp=published[12])
    assert datas(await program.receive(reader, 20 - first, ack="none")) == datas(sent[first:])
    timed_out = await program.run("receive", id=reader, count=1, timeout_ms=500)
    assert timed_out["timed_out"]


# -- 4. acknowledgements -------------------------------------------------------------------


async def test_acknowledgements_hold_across_closing_and_subscribing_again(cluster, programs):
    name = "acks"
    program, client = await connect(programs, cluster)
    producer, _ = await program.producer(client, topic(name))
    sent = messages(name, 10)
    await program.send(producer, sent)

    async def subscribe() -> str:
        return await program.subscribe(client, topic(name), "acks", initial_position="Earliest")

    consumer = await subscribe()
    got = await program.receive(consumer, 10, ack="none")
    await program.run("ack", id=consumer, refs=[m["ref"] for m in got[::2]])  # the even ones
    await program.close(consumer)
    consumer = await subscribe()
    odd = await program.receive(consumer, 5, ack="none")
    assert datas(odd) == datas(sent[1::2])
    await program.run("ack", id=consumer, refs=[odd[2]["ref"]], kind="cumulative")  # up to 5
    await program.close(consumer)
    consumer = await subscribe()
    rest = await program.receive(consumer, 2)
    assert datas(rest) == [sent[7]["data"], sent[9]["data"]]
    await program.close(consumer)
    consumer = await subscribe()
    assert await program.drain(consumer, timeout_ms=1000) == []
    # Unsubscribed, the subscription is gone: the same name starts again where told.
    await program.run("unsubscribe", id=consumer)
    consumer = await subscribe()
    assert datas(await program.receive(consumer, 10)) == datas(sent)


async def test_a_negative_ack_comes_again_with_its_redelivery_count(cluster, programs):
    name = "nacks"
    program, client = await connect(programs, cluster)
    consumer = await program.subscribe(client, topic(name), "n", consumer_type="Shared",
                                       initial_position="Earliest",
                                       negative_ack_redelivery_delay_ms=100)  # fmt: skip
    producer, _ = await program.producer(client, topic(name))
    await program.send(producer, [{"data": d} for d in ("a", "b", "c")])
    got = await program.receive(consumer, 3, ack="none")
    await program.run("ack", id=consumer, refs=[got[0]["ref"], got[2]["ref"]])
    await program.run("ack", id=consumer, refs=[got[1]["ref"]], kind="nack")
    for count in (1, 2):
        [again] = await program.receive(consumer, 1, ack="nack" if count == 1 else "individual")
        assert (again["data"], again["redelivery_count"]) == ("b", count)
        assert again["id"] == got[1]["id"]
    assert await program.drain(consumer, timeout_ms=1000) == []


async def test_an_unacknowledged_message_times_out_and_comes_again(cluster, programs):
    name = "ack-timeout"
    program, client = await connect(programs, cluster)
    # (10 s: the least pulsar-client takes)
    consumer = await program.subscribe(client, topic(name), "t", consumer_type="Shared",
                                       initial_position="Earliest",
                                       unacked_messages_timeout_ms=10_000)  # fmt: skip
    producer, _ = await program.producer(client, topic(name))
    await program.send(producer, [{"data": "acked"}, {"data": "forgotten"}])
    first = await program.receive(consumer, 2, ack="none")
    await program.run("ack", id=consumer, refs=[first[0]["ref"]])
    [again] = await program.receive(consumer, 1, timeout_ms=30_000)
    assert (again["data"], again["redelivery_count"]) == ("forgotten", 1)
    assert await program.drain(consumer, timeout_ms=1000) == []


async def test_a_consumer_seeks_to_an_id_and_to_a_time(cluster, programs):
    name = "consumer-seeks"
    program, client = await connect(programs, cluster)
    sent, ids = await produce_mixed(program, client, name)
    consumer = await program.subscribe(client, topic(name), "s", initial_position="Earliest")
    got = await program.receive(consumer, 20)
    for index in (3, 7):  # the message after it comes next (pulsar-client's seek)
        await program.run("seek", id=consumer, message_id=ids[index])
        again = await program.receive(consumer, 19 - index)
        assert datas(again) == datas(sent[index + 1 :]), index
    published = [m["publish_timestamp"] for m in got]
    first = next(i for i, t in enumerate(published) if t >= published[16])
    await program.run("seek", id=consumer, timestamp=published[16])
    assert datas(await program.receive(consumer, 20 - first)) == datas(sent[first:])
    await program.run("seek", id=consumer, message_id="earliest")
    assert datas(await program.receive(consumer, 20)) == datas(sent)
    # Everything acknowledged: closed and subscribed again, nothing comes.
    await program.close(consumer)
    consumer = await program.subscribe(client, topic(name), "s")
    assert await program.drain(consumer, timeout_ms=1000) == []


# -- 5. dead letters, delays, chunks, compression, schemas ------------------------------------


async def test_a_message_redelivered_too_often_lands_in_the_dead_letter_topic(cluster, programs):
    name = "poisoned"
    program, client = await connect(programs, cluster)
    consumer = await program.subscribe(
        client, topic(name), "work", consumer_type="Shared", initial_position="Earliest",
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy={"max_redeliver_count": 2, "dead_letter_topic": topic(f"{name}-dlq")},
    )  # fmt: skip
    producer, _ = await program.producer(client, topic(name))
    sent = [{"data": d, "properties": {"p": d}} for d in ("fine", "poison", "also fine")]
    ids = await program.send(producer, sent)
    poison_counts = []
    good = []
    while True:
        answer = await program.run("receive", id=consumer, count=1, timeout_ms=3000)
        if answer["timed_out"]:
            break
        [message] = answer["messages"]
        if message["data"] == "poison":
            poison_counts.append(message["redelivery_count"])
            await program.run("ack", id=consumer, refs=[message["ref"]], kind="nack")
        else:
            good.append(message["data"])
            await program.run("ack", id=consumer, refs=[message["ref"]])
    assert good == ["fine", "also fine"]
    assert poison_counts == [0, 1, 2]
    dead = await program.subscribe(client, topic(f"{name}-dlq"), "inspect",
                                   initial_position="Earliest")  # fmt: skip
    [landed] = await program.receive(dead, 1)
    assert landed["data"] == "poison" and landed["properties"]["p"] == "poison"
    assert landed["properties"]["REAL_TOPIC"] == topic(name)
    # (pulsar-client writes the id as (ledger,entry,partition,batch index))
    assert landed["properties"]["ORIGIN_MESSAGE_ID"] == f"({ids[1][0]},{ids[1][1]},-1,-1)"
    assert await program.drain(dead, timeout_ms=500) == []
    # The poisoned one was acknowledged on the way: the subscription holds nothing.
    await program.close(consumer)
    again = await program.subscribe(client, topic(name), "work", consumer_type="Shared")
    assert await program.drain(again, timeout_ms=1000) == []


async def test_a_delayed_message_waits_on_a_shared_subscription(cluster, programs):
    name = "delayed"
    program, client = await connect(programs, cluster)
    consumer = await program.subscribe(client, topic(name), "later", consumer_type="Shared",
                                       initial_position="Earliest")  # fmt: skip
    producer, _ = await program.producer(client, topic(name))
    await program.send(producer, [{"data": "in 3 s", "deliver_after": 3000}, {"data": "now"}])
    first, second = await program.receive(consumer, 2)
    assert (first["data"], second["data"]) == ("now", "in 3 s")
    # Not before its time (as the broker's clock has it: its publish time + 3 s).
    assert second["received_at_ms"] >= second["publish_timestamp"] + 3000 - 50
    reader = await program.reader(client, topic(name), "earliest")  # readers do not wait
    assert datas(await program.receive(reader, 2, ack="none")) == ["in 3 s", "now"]


@pytest.mark.timeout(180)
async def test_a_12_mib_message_goes_in_chunks(cluster, programs):
    name = "chunked"
    program, client = await connect(programs, cluster)
    producer, _ = await program.producer(client, topic(name), chunking_enabled=True,
                                         batching_enabled=False)  # fmt: skip
    big = {"seed": 12, "size": 12 << 20, "properties": {"big": "yes"}}
    chunked_id, _ = await program.send(producer, [big, {"data": "small after it"}])
    expected = payload(12, 12 << 20)
    consumer = await program.subscribe(client, topic(name), "s", initial_position="Earliest")
    whole, small = await program.receive(consumer, 2, timeout_ms=60_000)
    assert whole["size"] == len(expected)
    assert whole["sha256"] == hashlib.sha256(expected).hexdigest()
    assert whole["properties"] == {"big": "yes"} and small["data"] == "small after it"
    assert whole["id"][:2] == chunked_id[:2]

    direct = await cluster.client()
    reader = await direct.create_reader(name, EARLIEST)
    message = await reader.read_next(timeout=60)
    assert message.data == expected and message.properties == {"big": "yes"}
    assert (await reader.read_next(timeout=30)).data == b"small after it"


async def test_compacted_readers_consumers_and_table_views_of_pulsar_client(cluster, programs):
    """A changelog from pulsar-client, compacted by streamlib: pulsar-client's compacted
    reader and consumer see each key once at its latest, then the updates after the
    horizon; its reader's has_message_available ends although the stream's last message
    was compacted out (a tombstone); and its TableView follows updates."""
    name = "changelog"
    program, client = await connect(programs, cluster)
    producer, _ = await program.producer(client, topic(name), batching_max_messages=7)
    updates = [{"data": f"v{i}", "partition_key": f"k{i % 5}"} for i in range(40)]
    updates += [{"data": "", "partition_key": "k3"}]  # a tombstone, the stream's last
    await program.send_async(producer, updates)
    direct = await cluster.client()
    result = await direct.streams.compact(name)
    assert result.keys == 4
    latest = {"k0": "v35", "k1": "v36", "k2": "v37", "k4": "v39"}

    reader = await program.reader(client, topic(name), "earliest", is_read_compacted=True)
    got = await program.receive(reader, 4, ack="none")
    assert {m["partition_key"]: m["data"] for m in got} == latest
    assert not (await program.run("has_message_available", id=reader))["available"]
    consumer = await program.subscribe(client, topic(name), "table", is_read_compacted=True,
                                       initial_position="Earliest")  # fmt: skip
    got = await program.receive(consumer, 4, ack="cumulative")
    assert {m["partition_key"]: m["data"] for m in got} == latest

    await program.send(producer, [{"data": "after", "partition_key": "k9"}])
    assert datas(await program.receive(reader, 1, ack="none")) == ["after"]
    assert datas(await program.receive(consumer, 1)) == ["after"]

    view = program.new_id("view")
    await program.run("table_view", id=view, client=client, topic=topic(name))
    table = await program.run("table", id=view)
    assert table["entries"] == {**latest, "k9": "after"} and table["size"] == 5
    await program.send(producer, [{"data": "later", "partition_key": "k0"}])
    table = await program.run("table", id=view, wait_key="k0", wait_value="later")
    assert "timed_out" not in table and table["entries"]["k0"] == "later"


@pytest.mark.parametrize("compression", ["LZ4", "ZLib", "ZSTD", "SNAPPY"])
async def test_compressed_batches_read_by_pulsar_client_and_streamlib(
    cluster, programs, compression
):
    name = f"compressed-{compression.lower()}"
    program, client = await connect(programs, cluster)
    producer, _ = await program.producer(client, topic(name), compression_type=compression,
                                         batching_enabled=True)  # fmt: skip
    single, _ = await program.producer(client, topic(name), compression_type=compression)
    sent = messages(name, 30)
    for m in sent:  # (something to compress)
        m["data"] = m["data"] + " and so on" * 50
    await program.send_async(producer, sent[:25])
    await program.send(single, sent[25:])
    consumer = await program.subscribe(client, topic(name), "s", initial_position="Earliest")
    assert as_sent(await program.receive(consumer, 30)) == sent
    direct = await cluster.client()
    reader = await direct.create_reader(name, EARLIEST)
    read = [await reader.read_next(timeout=30) for _ in sent]
    assert [m.data.decode() for m in read] == datas(sent)
    assert [m.properties for m in read] == [m["properties"] for m in sent]


@pytest.mark.parametrize(
    ("schema", "values"),
    [
        ("string", ["plain", "text ünïcødé", ""]),
        ("json", [{"sensor": "a", "value": 1}, {"sensor": "b", "value": -2}]),
        ("avro", [{"sensor": "a", "value": 1}, {"sensor": "b", "value": 2**31 - 1}]),
    ],
)
async def test_schema_values_round_trip(cluster, programs, schema, values):
    name = f"schema-{schema}"
    program, client = await connect(programs, cluster)
    producer, _ = await program.producer(client, topic(name), schema=schema)
    await program.send(producer, [{"value": v} for v in values])
    consumer = await program.subscribe(client, topic(name), "s", schema=schema,
                                       initial_position="Earliest")  # fmt: skip
    assert [m["value"] for m in await program.receive(consumer, len(values))] == values


async def test_a_topic_keeps_its_first_schema(cluster, programs):
    name = "schema-kept"
    program, client = await connect(programs, cluster)
    producer, _ = await program.producer(client, topic(name), schema="avro")
    await program.send(producer, [{"value": {"sensor": "a", "value": 1}}])
    with pytest.raises(ProgramError) as incompatible:
        await program.producer(client, topic(name), schema="string")
    assert incompatible.value.error == "IncompatibleSchema"


# -- 6. producers ---------------------------------------------------------------------------


async def test_exclusive_producers_refuse_fence_and_wait(cluster, programs):
    name = "exclusive-producers"
    a, a_client = await connect(programs, cluster)
    b, b_client = await connect(programs, cluster)
    first, _ = await a.producer(a_client, topic(name), access_mode="Exclusive",
                                producer_name="first")  # fmt: skip
    for mode, error in (("Exclusive", "ProducerFenced"), ("Shared", "ProducerBusy")):
        with pytest.raises(ProgramError) as refused:
            await b.producer(b_client, topic(name), access_mode=mode)
        assert refused.value.error == error, mode
    await a.send(first, [{"data": "from the first"}])

    # WaitForExclusive: created once the first one is gone.
    waiting = asyncio.ensure_future(
        b.producer(b_client, topic(name), access_mode="WaitForExclusive", producer_name="next")
    )
    await a.send(first, [{"data": "still the first's"}])  # (one round trip: it still waits)
    assert not waiting.done()
    await a.close(first)
    second, info = await asyncio.wait_for(waiting, 60)
    assert info["producer_name"] == "next"
    await b.send(second, [{"data": "from the next"}])

    # ExclusiveWithFencing: takes the topic over; the Exclusive one it fenced can send no
    # more (its reconnection is refused). (A fenced WaitForExclusive producer would wait
    # in line again instead, in Pulsar too.)
    await b.close(second)
    exclusive, _ = await b.producer(b_client, topic(name), access_mode="Exclusive",
                                    send_timeout_millis=15_000)  # fmt: skip
    await b.send(exclusive, [{"data": "from the exclusive one"}])
    third, _ = await a.producer(a_client, topic(name), access_mode="ExclusiveWithFencing")
    await a.send(third, [{"data": "from the fencing one"}])
    fenced = await b.attempt("send", producer=exclusive, messages=[{"data": "fenced"}])
    assert fenced.get("error") == "ProducerFenced", fenced
    direct = await cluster.client()
    reader = await direct.create_reader(name, EARLIEST)
    stored = [(await reader.read_next(timeout=30)).data for _ in range(5)]
    assert stored == [b"from the first", b"still the first's", b"from the next",
                      b"from the exclusive one", b"from the fencing one"]  # fmt: skip
    assert not await reader.has_message_available()


async def test_producer_names_and_sequence_ids_go_on_after_reopening(cluster, programs):
    name = "sequences"
    program, client = await connect(programs, cluster)
    given, info = await program.producer(client, topic(name), producer_name="named")
    assert info == {"producer_name": "named", "last_sequence_id": -1}
    await program.send(given, messages(name, 5))
    await program.close(given)
    again, info = await program.producer(client, topic(name), producer_name="named")
    assert info == {"producer_name": "named", "last_sequence_id": 4}
    await program.send(again, [{"data": "sixth"}])
    assert (await program.run("producer_info", id=again))["last_sequence_id"] == 5
    # An old sequence id again: acknowledged, stored nothing.
    await program.send(again, [{"data": "a resend", "sequence_id": 3}])
    await program.send(again, [{"data": "seventh", "sequence_id": 6}])

    unnamed = [await program.producer(client, topic(name)) for _ in range(2)]
    names = {info["producer_name"] for _, info in unnamed}
    assert len(names) == 2 and "" not in names and "named" not in names
    await program.send(unnamed[0][0], [{"data": "by the broker's name"}])

    direct = await cluster.client()
    reader = await direct.create_reader(name, EARLIEST)
    stored = [await reader.read_next(timeout=30) for _ in range(8)]
    assert not await reader.has_message_available()
    assert [m.data.decode() for m in stored] == [*datas(messages(name, 5)), "sixth",
                                                 "seventh", "by the broker's name"]  # fmt: skip
    assert [m.producer_name for m in stored] == ["named"] * 7 + [unnamed[0][1]["producer_name"]]
    assert [m.sequence_id for m in stored[:7]] == list(range(7))


async def test_send_async_calls_back_in_order_and_flush_waits_for_all(cluster, programs):
    name = "callbacks"
    program, client = await connect(programs, cluster)
    for batching in (True, False):
        producer, _ = await program.producer(client, topic(name), batching_enabled=batching)
        sent = [{"data": f"{batching}-{i}"} for i in range(200)]
        answer = await program.run("send", producer=producer, messages=sent, mode="async")
        callbacks = answer["callbacks"]
        assert [c[0] for c in callbacks] == list(range(200))  # in the order sent
        assert {c[1] for c in callbacks} == {"Ok"}
        assert answer["after_flush"] == 200  # flush returned once all were acknowledged
        ids = [c[2] for c in callbacks]
        assert ids == sorted(ids) and len({tuple(i) for i in ids}) == 200


# -- 8. partitioned topics ----------------------------------------------------------------


async def test_a_partitioned_topic_keeps_each_key_in_streamlibs_partition(cluster, programs):
    name = "partitioned"
    direct = await cluster.client()
    await direct.streams.create(name, partitions=3)
    program, client = await connect(programs, cluster)
    consumer = await program.subscribe(client, topic(name), "all", initial_position="Earliest")
    routed, _ = await program.producer(client, topic(name), message_router="murmur3",
                                       batching_enabled=True)  # fmt: skip
    default, _ = await program.producer(client, topic(name))
    sent = messages(name, 60, keys=9)
    by_default = messages(f"{name}-default", 30, keys=5)
    await program.send_async(routed, sent)
    await program.send(default, by_default)

    got = await program.receive(consumer, 90)
    assert sorted(datas(got)) == sorted(datas(sent + by_default))
    partitions: dict[str, set[int]] = collections.defaultdict(set)
    for m in got:
        partition = m["id"][3]
        assert m["topic"] == topic(f"{name}-partition-{partition}")
        partitions[m["partition_key"]].add(partition)
    assert all(len(found) == 1 for found in partitions.values()), partitions
    for key in {m["partition_key"] for m in sent}:  # streamlib's partition of the key
        assert partitions[key] == {partition_of(key, 3)}, key
    for key in partitions:  # each key's messages in the order sent
        mine = [m["data"] for m in got if m["partition_key"] == key]
        assert mine == [m["data"] for m in sent + by_default if m["partition_key"] == key]

    for i in range(3):  # each partition a stream of streamlib's, as it routes keys
        reader = await direct.create_reader(f"{name}-partition-{i}", EARLIEST)
        keys = set()
        while await reader.has_message_available():
            keys.add((await reader.read_next(timeout=30)).key)
        assert keys == {key for key, found in partitions.items() if found == {i}}, i


# -- 10. junk on the Pulsar port --------------------------------------------------------------


def frame(command: api.BaseCommand) -> bytes:
    body = command.SerializeToString()
    return struct.pack(">II", len(body) + 4, len(body)) + body


def connect_frame() -> bytes:
    command = api.BaseCommand(type=api.BaseCommand.CONNECT)
    command.connect.client_version = "a test's raw socket"
    command.connect.protocol_version = 21
    return frame(command)


async def closed_by_broker(port: int, junk: list[bytes], then_connected: bool = False) -> bytes:
    """Send junk (pieces in turn) on a new connection; what the broker wrote before it
    closed the connection (bounded)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        received = b""
        for piece in junk:
            writer.write(piece)
            await writer.drain()
            if then_connected and piece is junk[0]:
                (size,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 10))
                received += await asyncio.wait_for(reader.readexactly(size), 10)
        try:
            async with asyncio.timeout(20):
                while chunk := await reader.read(1 << 16):
                    received += chunk
        except TimeoutError:
            raise AssertionError(
                f"the broker kept the connection open after {junk!r:.200}"
            ) from None
        return received
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def test_junk_closes_only_its_own_connection(cluster, programs):
    name = "after-junk"
    program, client = await connect(programs, cluster)
    producer, _ = await program.producer(client, topic(name))
    await program.send(producer, [{"data": "before"}])
    port = cluster.brokers[0].pulsar_port
    rng = random.Random(10)
    junk = {
        "http": [b"GET /admin/v2/clusters HTTP/1.1\r\nHost: localhost\r\n\r\n"],
        "random bytes": [rng.randbytes(4096)],
        "a huge size": [struct.pack(">I", 0x7FFFFFF0) + b"\x00" * 64],
        "a command before connect": [frame(api.BaseCommand(type=api.BaseCommand.PING))],
        "a frame that is no command": [struct.pack(">II", 12, 8) + b"\xff" * 8],
    }
    for pieces in junk.values():  # (bounded: an AssertionError if it stays open)
        await closed_by_broker(port, pieces)
    # A good CONNECT, answered CONNECTED, then garbage: that connection is closed.
    answered = await closed_by_broker(port, [connect_frame(), rng.randbytes(512)], True)
    response = api.BaseCommand()
    (size,) = struct.unpack(">I", answered[:4])
    response.ParseFromString(answered[4 : 4 + size])
    assert response.type == api.BaseCommand.CONNECTED
    # The client connected before all this goes on, and new ones connect.
    await program.send(producer, [{"data": "after"}])
    other, other_client = await connect(programs, cluster)
    consumer = await other.subscribe(other_client, topic(name), "s", initial_position="Earliest")
    assert datas(await other.receive(consumer, 2)) == ["before", "after"]
    assert all(b.proc is not None and b.proc.poll() is None for b in cluster.brokers)
