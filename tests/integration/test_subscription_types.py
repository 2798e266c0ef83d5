"""Subscription types enforced through the metadata store (sqlite and ZooKeeper), with
real bookie processes: one exclusive consumer per subscription, failover standbys that
take over from the durable cursor when the active consumer closes or its process dies,
and clear refusals for what direct mode cannot do."""

from __future__ import annotations

import asyncio
import builtins

import pytest
from kazoo.client import KazooClient

import streamlib
import streamlib.errors as errors
from streamlib.stream.subscription import ConsumerType
from tests.integration.conftest import script_process

pytestmark = pytest.mark.timeout(120)


async def publish(client, stream: str, count: int) -> None:
    producer = await client.create_producer(stream, batching_max_messages=4)
    for i in range(count):
        await producer.send_async(b"%d" % i)
    await producer.flush()
    await producer.close()


async def test_a_second_exclusive_consumer_is_refused_until_the_first_closes(any_cluster):
    any_cluster.start_bookies(3)
    client, other = await any_cluster.client(), await any_cluster.client()
    await publish(client, "ex", 6)
    first = await client.subscribe("ex", "sub", "earliest", consumer_name="first")
    for spelling in (
        "exclusive",
        "Exclusive",
        ConsumerType.Exclusive,
        streamlib.ConsumerType.Exclusive,
    ):
        with pytest.raises(errors.ConsumerBusyError) as refused:
            await other.subscribe("ex", "sub", consumer_type=spelling)
        assert "already has an active consumer (exclusive, first)" in str(refused.value)
    # Another subscription of the same stream is its own.
    elsewhere = await other.subscribe("ex", "other-sub", "earliest")
    assert (await elsewhere.receive(timeout=30)).data == b"0"
    for i in range(3):
        message = await first.receive(timeout=30)
        assert message.data == b"%d" % i
        first.acknowledge(message)
    await first.close()  # persists the cursor, then frees the subscription

    second = await other.subscribe("ex", "sub")
    assert [(await second.receive(timeout=30)).data for _ in range(3)] == [b"3", b"4", b"5"]


async def test_a_failover_standby_takes_over_from_the_cursor_when_the_active_one_closes(
    any_cluster,
):
    any_cluster.start_bookies(3)
    client, other = await any_cluster.client(), await any_cluster.client()
    await publish(client, "fo", 20)
    active = await client.subscribe("fo", "sub", "earliest", consumer_type="failover")
    received = []
    for _ in range(10):
        message = await active.receive(timeout=30)
        received.append(message.data)
        active.acknowledge(message)
    assert received == [b"%d" % i for i in range(10)]
    assert active.is_active

    standby = await other.subscribe("fo", "sub", consumer_type="Failover")
    assert not standby.is_active
    with pytest.raises(errors.TimeoutError) as waited:  # a standby holds no messages
        await standby.receive(timeout=0.5)
    assert isinstance(waited.value, builtins.TimeoutError)  # `except TimeoutError` works
    assert isinstance(waited.value, errors.StreamlibError)

    await active.close()
    rest = [(await standby.receive(timeout=30)).data for _ in range(10)]
    assert rest == [b"%d" % i for i in range(10, 20)]  # nothing acknowledged came again
    assert standby.is_active


async def test_a_close_cancelled_halfway_still_hands_the_subscription_to_the_standby(
    any_cluster,
):
    """Cancelling the task that closes a consumer (a broker's RPC ending under it, a
    Ctrl-C in the blocking API) stops that task's wait, never the close: the cursor is
    persisted and the line left, and the standby takes over. (A close cut off before
    it left the line kept the lock's node for the session's life: the broker's next
    reader of the subscription waited behind it for good, and a seek through the
    service lost its messages.)"""
    any_cluster.start_bookies(3)
    client = await any_cluster.client()
    await publish(client, "cut", 6)
    active = await client.subscribe("cut", "sub", "earliest", consumer_type="failover")
    for _ in range(3):
        active.acknowledge(await active.receive(timeout=30))
    standby = await client.subscribe("cut", "sub", consumer_type="failover")
    assert not standby.is_active
    closing = asyncio.ensure_future(active.close())
    await asyncio.sleep(0)  # (one turn of the loop: the close has begun, and waits)
    assert not closing.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    rest = [(await standby.receive(timeout=30)).data for _ in range(3)]
    assert rest == [b"3", b"4", b"5"]  # after the cursor the cut-off close persisted
    await asyncio.wait_for(active.close(), 30)  # (again: waits for the same close)
    with pytest.raises(errors.ClientClosedError):
        await active.receive(timeout=1)


STANDBY_SCRIPT = r"""
import sys, streamlib
client = streamlib.connect(sys.argv[1], session_timeout_s=2)
consumer = client.subscribe("kill", "sub", "earliest", consumer_type="failover")
for i in range(5):
    consumer.acknowledge(consumer.receive(timeout=30))
consumer.persist()
print("persisted", flush=True)
sys.stdin.readline()  # wait to be killed
"""


async def test_a_failover_standby_takes_over_when_the_active_process_is_sigkilled(any_cluster):
    any_cluster.start_bookies(3)
    client = await any_cluster.client()
    await publish(client, "kill", 10)
    async with script_process(STANDBY_SCRIPT, any_cluster.metadata_uri, ready="persisted") as proc:
        standby = await client.subscribe("kill", "sub", consumer_type="failover")
        assert not standby.is_active
        proc.kill()
        proc.wait(timeout=30)
    # Active once the killed consumer's session ends; it starts after the durable cursor.
    rest = [(await standby.receive(timeout=30)).data for _ in range(5)]
    assert rest == [b"5", b"6", b"7", b"8", b"9"]


async def test_other_types_are_refused_clearly(cluster):
    cluster.start_bookies(3)
    client, other = await cluster.client(), await cluster.client()
    await publish(client, "types", 1)
    holder = await client.subscribe("types", "sub", "earliest", consumer_name="holder")
    with pytest.raises(errors.ConsumerBusyError) as mixed:
        await other.subscribe("types", "sub", consumer_type="failover")
    assert "active exclusive consumer (holder)" in str(mixed.value)
    for shared in ("shared", "key_shared", ConsumerType.KeyShared, "KeyShared"):
        with pytest.raises(errors.UnsupportedConsumerTypeError) as unsupported:
            await other.subscribe("types", "new-sub", consumer_type=shared)
        assert "needs the stream service" in str(unsupported.value)
    with pytest.raises(errors.BadRequestError) as bogus:
        await other.subscribe("types", "new-sub", consumer_type="round-robin")
    assert "consumer_type is one of" in str(bogus.value)
    # None of the refusals created a subscription or disturbed the holder.
    assert await other.streams.registry.list_cursors("types") == ["sub"]
    assert (await holder.receive(timeout=30)).data == b"0"


async def expire_session(zookeeper, client) -> None:
    """Expire the client's ZooKeeper session the standard way (a twin connection with
    its id and password, closed), and wait until the client has noticed."""
    expired = asyncio.Event()
    client.store.add_session_listener(lambda _event: expired.set())
    session_id, password = client.store._client.client_id
    twin = KazooClient(hosts=zookeeper.hosts, client_id=(session_id, password))
    await asyncio.to_thread(twin.start)
    await asyncio.to_thread(twin.stop)
    twin.close()
    await asyncio.wait_for(expired.wait(), 30)


async def test_a_consumer_whose_session_ends_stops_and_the_standby_goes_on(zk_cluster, zookeeper):
    """A stalled or partitioned active consumer loses its session: the standby takes over
    from the durable cursor, and the old one stops receiving and queues again."""
    zk_cluster.start_bookies(3)
    client = await zk_cluster.client()
    stalled = await zk_cluster.client(session_timeout_s=2)
    await publish(client, "stall", 9)
    first = await stalled.subscribe("stall", "sub", "earliest", consumer_type="failover")
    for _ in range(3):
        first.acknowledge(await first.receive(timeout=30))
    await first.persist()
    second = await client.subscribe("stall", "sub", consumer_type="failover")

    await expire_session(zookeeper, stalled)
    assert not first.is_active  # it stopped at once: what it held is the next one's
    taken = [await second.receive(timeout=30) for _ in range(3)]
    assert [m.data for m in taken] == [b"3", b"4", b"5"]
    with pytest.raises(errors.TimeoutError):
        await first.receive(timeout=0.5)  # in line again, behind the new active one
    for message in taken:
        second.acknowledge(message)
    await second.close()
    # Its turn again, from the cursor the other one left.
    assert [(await first.receive(timeout=30)).data for _ in range(3)] == [b"6", b"7", b"8"]
    assert first.is_active


async def test_an_exclusive_consumer_whose_session_ends_takes_the_subscription_back(
    zk_cluster, zookeeper
):
    zk_cluster.start_bookies(3)
    client = await zk_cluster.client()
    stalled = await zk_cluster.client(session_timeout_s=2)
    await publish(client, "back", 4)
    consumer = await stalled.subscribe("back", "sub", "earliest")
    consumer.acknowledge(await consumer.receive(timeout=30))
    await consumer.persist()
    await expire_session(zookeeper, stalled)
    # Nobody took it meanwhile: it holds it again, and goes on after the durable cursor.
    assert [(await consumer.receive(timeout=30)).data for _ in range(3)] == [b"1", b"2", b"3"]
    with pytest.raises(errors.ConsumerBusyError):
        await client.subscribe("back", "sub")
