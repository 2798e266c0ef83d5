"""Failover bounded by evidence, not by session timeouts (streamlib.protocol.ownership):
a broker or a consumer whose process is provably gone gives its place up at once; one
that is only stopped keeps it until its session ends.

Every metadata session here is 60 s long, and every wait for the takeover is bounded
well below that (30 s): a takeover that waited for the session would fail the test."""

from __future__ import annotations

import asyncio
import signal

import pytest

from metadata.services.brokers import BrokerRegistry
from streamlib.protocol.errors import ConsumerBusyError
from tests.integration.conftest import script_process
from tests.integration.test_broker_faults import PRODUCER_SCRIPT, check_stream, owner_of

pytestmark = pytest.mark.timeout(240)

LONG_SESSION = ["--session-timeout", "60"]
BEFORE_THE_SESSION_ENDS_S = 30.0


async def line_of(proc, timeout_s: float = BEFORE_THE_SESSION_ENDS_S) -> str:
    return (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)).strip()


def go_on(proc) -> None:
    proc.stdin.write("go on\n")
    proc.stdin.flush()


async def test_a_killed_owner_is_replaced_and_restarted_before_its_session_ends(any_cluster):
    cluster = any_cluster  # (sqlite and ZooKeeper: another session's nodes deleted)
    cluster.start_bookies(3)
    brokers = cluster.start_brokers(2, extra=LONG_SESSION)
    client = await cluster.service_client()
    await client.streams.create("orders")
    async with script_process(
        PRODUCER_SCRIPT, cluster.service_url, "orders", "A", "600", ready="half"
    ) as producer:
        owner = await owner_of(cluster, "orders")
        [dead] = [b for b in brokers if b.broker_id == owner.broker_id]
        dead.kill()  # its port refuses: evidence; its session lives on for 60 s
        go_on(producer)
        assert await line_of(producer) == "done"  # every send acknowledged, via the other
        moved = await owner_of(cluster, "orders")
        assert moved is not None and moved.broker_id != dead.broker_id
        # The same id, restarted: its dead predecessor's registration is no obstacle.
        dead.start(timeout_s=BEFORE_THE_SESSION_ENDS_S)
        registry = BrokerRegistry((await cluster.client()).store)
        found = await registry.registered(dead.broker_id)
        assert found is not None and found[0].pid == dead.pid
    await check_stream(cluster, "orders", ["A"], 600)


async def test_a_restarted_broker_replaces_its_dead_predecessor_itself(cluster):
    """Its predecessor owned nothing, so no lookup evicted it: the restarted process's
    own start finds it gone (it ran on this host, its pid runs no more)."""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=LONG_SESSION)
    first_pid = broker.pid
    broker.kill()
    broker.start(timeout_s=BEFORE_THE_SESSION_ENDS_S)
    registry = BrokerRegistry((await cluster.client()).store)
    found = await registry.registered(broker.broker_id)
    assert found is not None and found[0].pid == broker.pid != first_pid


async def test_a_stopped_owner_keeps_its_streams_until_its_session_ends(cluster):
    """SIGSTOP gives no evidence: its port still accepts. Lookups through the other
    broker keep naming it, and it serves on once continued."""
    cluster.start_bookies(3)
    brokers = cluster.start_brokers(2, extra=LONG_SESSION)
    client = await cluster.service_client()
    await client.streams.create("orders")
    async with script_process(
        PRODUCER_SCRIPT, cluster.service_url, "orders", "A", "400", ready="half"
    ) as producer:
        owner = await owner_of(cluster, "orders")
        [stopped] = [b for b in brokers if b.broker_id == owner.broker_id]
        [other] = [b for b in brokers if b is not stopped]
        stopped.pause()
        try:
            lookups = await cluster.client_at(f"streamlib://{other.address}")
            for _ in range(5):  # each one weighs the evidence, and finds none
                assert await lookups.lookup("orders") == stopped.address
            still = await owner_of(cluster, "orders")
            assert still is not None and still.incarnation == owner.incarnation
        finally:
            stopped.resume()
        go_on(producer)
        assert await line_of(producer, 120) == "done"
    assert (await owner_of(cluster, "orders")).incarnation == owner.incarnation
    await check_stream(cluster, "orders", ["A"], 400)


# An exclusive consumer with a 60 s metadata session; says "ready" once subscribed.
EXCLUSIVE_CONSUMER = """
import sys, streamlib
client = streamlib.connect(sys.argv[1], session_timeout_s=60)
consumer = client.subscribe(sys.argv[2], "audit", "earliest", consumer_type="exclusive")
print("ready", flush=True)
sys.stdin.readline()
"""


async def test_a_restarted_exclusive_consumer_takes_its_killed_predecessors_place(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("events")
    async with script_process(
        EXCLUSIVE_CONSUMER, cluster.metadata_uri, "events", ready="ready"
    ) as first:
        with pytest.raises(ConsumerBusyError):  # (alive: the subscription is its)
            await client.subscribe("events", "audit", "earliest", consumer_type="exclusive")
        first.kill()
        first.wait()
        consumer = await client.subscribe("events", "audit", "earliest", consumer_type="exclusive")
        await consumer.close()


async def test_a_stopped_exclusive_consumer_keeps_its_subscription(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("events")
    async with script_process(
        EXCLUSIVE_CONSUMER, cluster.metadata_uri, "events", ready="ready"
    ) as first:
        first.send_signal(signal.SIGSTOP)  # no evidence
        try:
            with pytest.raises(ConsumerBusyError):
                await client.subscribe("events", "audit", "earliest", consumer_type="exclusive")
        finally:
            first.send_signal(signal.SIGCONT)
