"""Brokers that balance themselves, on real processes: a broker started in a loaded
cluster receives streams from the others (the elected load manager moves them) while
named producers publish and consumers read -- nothing lost or duplicated; a pinned
stream never moves, and a stream pinned elsewhere goes to its pin; `admin broker load`
shows every broker's report."""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from collections.abc import Awaitable, Callable

import pytest

from metadata.services.broker_moves import LoadManagerElection, StreamMoves
from metadata.services.brokers import BrokerRegistry
from streamlib.stream.positions import EARLIEST

pytestmark = pytest.mark.timeout(300)

STREAMS = 16
# Reports every second, a shedding pass every two (the defaults: 10 s and 60 s); a
# session longer than the other tests' 2 s (this test moves streams, not brokers: a
# broker whose session lapses on a busy host would move them too).
FAST_BALANCING = ["--load-report-interval", "1", "--load-shed-interval", "2",
                  "--session-timeout", "5"]  # fmt: skip


async def eventually(
    what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 60.0
) -> None:
    """Wait (bounded) until check() holds."""
    try:
        async with asyncio.timeout(timeout_s):
            while not await check():
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s:g} s: {what}") from None


async def admin(cluster, *arguments: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamlib", "admin", "broker", *arguments,
        "--metadata", cluster.metadata_uri,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def owners(registry: BrokerRegistry) -> dict[str, str]:
    found = {}
    for i in range(STREAMS):
        owner = await registry.owner(f"bal-{i}")
        if owner is not None:
            found[f"bal-{i}"] = owner.broker_id
    return found


async def test_a_new_broker_receives_streams_and_nothing_is_lost_or_duplicated(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(2, extra=FAST_BALANCING)
    client = await cluster.service_client()
    direct = await cluster.client()
    registry = BrokerRegistry(direct.store)
    names = [f"bal-{i}" for i in range(STREAMS)]
    producers = [await client.create_producer(s, producer_name=f"named-{s}") for s in names]
    # (cursors persisted once a second, not ten times: 16 of them on one sqlite file)
    consumers = [
        await client.subscribe(s, "balance", "earliest", cursor_persist_interval_ms=1000)
        for s in names
    ]
    # (the two may already be balancing: a stream being moved has no owner for a moment)
    await eventually("every stream owned", lambda: _all_owned(registry))
    before = await owners(registry)
    assert len(collections.Counter(before.values())) == 2
    pinned = "bal-0"
    await admin(cluster, "pin", pinned, before[pinned])
    assert f"{pinned} {before[pinned]}" in await admin(cluster, "pins")

    sent: dict[str, list[bytes]] = {s: [] for s in names}
    received: dict[str, set[bytes]] = {s: set() for s in names}
    stop = asyncio.Event()

    async def publish(stream: str, producer) -> None:
        n = 0
        while not stop.is_set():
            data = f"{stream}-{n}".encode()
            await producer.send(data)
            sent[stream].append(data)
            n += 1
            await asyncio.sleep(0.02)  # (a steady rate, not a flood: a timer)

    async def consume(stream: str, consumer) -> None:
        while True:
            message = await consumer.receive()
            received[stream].add(message.data)
            consumer.acknowledge(message)

    publishing = [asyncio.create_task(publish(s, p)) for s, p in zip(names, producers, strict=True)]
    consuming = [asyncio.create_task(consume(s, c)) for s, c in zip(names, consumers, strict=True)]
    try:
        await eventually("every stream has messages", _all_sent(sent, 20))
        [third] = cluster.start_brokers(1, extra=FAST_BALANCING)

        async def third_has_its_share() -> bool:
            return list((await owners(registry)).values()).count(third.broker_id) >= 4

        await eventually("the new broker owns 4 streams", third_has_its_share)
        # Every producer publishes after the moves: each stream is served again.
        counts = {s: len(sent[s]) for s in names}
        await eventually("every stream takes messages again", _all_sent(sent, 10, counts))

        # The pinned stream was never shed (on a busy host a broker's session may
        # lapse: then its streams go elsewhere, and a pinned one is moved back to its pin).
        async def pinned_at_its_broker() -> bool:
            owner = await registry.owner(pinned)
            return owner is not None and owner.broker_id == before[pinned]

        await eventually("the pinned stream is at its broker", pinned_at_its_broker)
        move = await StreamMoves(direct.store).get(pinned)
        assert move is None or move[0].reason == "pin", move
        after = await owners(registry)

        # `admin broker load`: every broker's report, as a table and as JSON.
        table = await admin(cluster, "load")
        assert "MSGS_IN/S" in table and "LOAD" in table
        reports: list[dict] = []

        async def every_broker_reports() -> bool:
            reports[:] = map(json.loads, (await admin(cluster, "load", "--json")).splitlines())
            return {r["broker_id"] for r in reports} == {b.broker_id for b in cluster.brokers}

        await eventually("every broker in admin broker load", every_broker_reports)
        assert all(r["reported"] > 0 and r["address"] for r in reports)
        assert sum(r["msgs_in_rate"] for r in reports) > 0
        assert sum(r["streams"] for r in reports) <= STREAMS

        # A stream pinned to another broker goes there.
        elsewhere = next(s for s, b in after.items() if b != third.broker_id and s != pinned)
        await admin(cluster, "pin", elsewhere, third.broker_id)

        async def at_its_pin() -> bool:
            return (await owners(registry)).get(elsewhere) == third.broker_id

        await eventually("the stream pinned to the new broker is there", at_its_pin)
        counts = {s: len(sent[s]) for s in names}
        await eventually("every stream takes messages again", _all_sent(sent, 5, counts))
        assert "was not pinned" not in await admin(cluster, "unpin", elsewhere)
        assert elsewhere not in await admin(cluster, "pins")
    finally:
        stop.set()
        await asyncio.gather(*publishing)
        for task in consuming:
            task.cancel()
        await asyncio.gather(*consuming, return_exceptions=True)

    # Each stream holds what was sent, exactly once, in order (dedup across the moves:
    # the producers are named); its consumer received all of it.
    for stream in names:
        reader = await direct.create_reader(stream, EARLIEST)
        stored = [(await reader.read_next(timeout=30)).data for _ in sent[stream]]
        assert stored == sent[stream], stream
        assert not await reader.has_message_available()
        await reader.close()
    for stream, consumer in zip(names, consumers, strict=True):
        async with asyncio.timeout(60):
            while len(received[stream]) < len(sent[stream]):
                message = await consumer.receive()
                received[stream].add(message.data)
                consumer.acknowledge(message)
        assert received[stream] == set(sent[stream]), stream


async def _all_owned(registry: BrokerRegistry) -> bool:
    return len(await owners(registry)) == STREAMS


def _all_sent(
    sent: dict[str, list[bytes]], more: int, since: dict[str, int] | None = None
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(len(m) >= (since or {}).get(s, 0) + more for s, m in sent.items())

    return check


async def test_a_broker_that_joins_gets_streams_without_waiting_for_the_shed_interval(
    any_cluster,
):
    """The leader runs a pass once a newcomer has reported, not a shed interval later;
    a leader that stops hands the election on (on each real metadata store: the
    election is kazoo's on ZooKeeper)."""
    cluster = any_cluster
    cluster.start_bookies(3)
    slow = ["--load-report-interval", "1", "--load-shed-interval", "600",
            "--session-timeout", "5"]  # fmt: skip
    cluster.start_brokers(2, extra=slow)
    client = await cluster.service_client()
    direct = await cluster.client()
    registry = BrokerRegistry(direct.store)
    producers = [await client.create_producer(f"bal-{i}") for i in range(8)]
    for producer in producers:
        await producer.send(b"before")
    [third] = cluster.start_brokers(1, extra=slow)

    async def third_owns_some() -> bool:
        return third.broker_id in (await owners(registry)).values()

    await eventually("the new broker owns a stream", third_owns_some, timeout_s=60)
    for producer in producers:  # (each follows its stream wherever it went)
        await asyncio.wait_for(producer.send(b"after"), 60)

    # The leader stops (SIGTERM: it gives its streams up and resigns); another leads.
    election = LoadManagerElection(direct.store, "test")
    leader = await election.leader()
    stopping = next(b for b in cluster.brokers if b.broker_id == leader)
    assert await asyncio.to_thread(stopping.stop) == 0

    async def another_leads() -> bool:
        return await election.leader() not in (None, leader)

    await eventually("another broker leads", another_leads)
    for producer in producers:
        await asyncio.wait_for(producer.send(b"after the leader stopped"), 60)
