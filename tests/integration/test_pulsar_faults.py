"""pulsar-client across a broker's death: two brokers serve Pulsar's protocol, a
pulsar-client producer of a fixed name sends continuously and a pulsar-client consumer
receives, and the broker that owns the topic is killed (SIGKILL). The other takes the
topic over; pulsar-client reconnects on its own. Afterwards every message the producer
saw acknowledged is stored exactly once, in order (the broker's deduplication of the
resends), and the consumer got every one at least once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from metadata.services.brokers import BrokerRegistry
from streamlib.stream.positions import EARLIEST
from tests.integration.pulsar_programs import Programs

pytestmark = pytest.mark.timeout(240)

COUNT = 800
NAME = "through-a-kill"
TOPIC = f"persistent://public/default/{NAME}"


@pytest.fixture
async def programs(tmp_path: Path) -> Any:
    async with Programs(tmp_path) as start:
        yield start


def pulsar_urls(brokers: list) -> str:
    return "pulsar://" + ",".join(b.pulsar_url.split("://", 1)[1] for b in brokers)


async def settled(program: Any, at_least: int, timeout_s: float = 60.0) -> dict:
    """The background sends once at least `at_least` are settled (bounded)."""
    async with asyncio.timeout(timeout_s):
        while (state := await program.run("background"))["settled"] < at_least:
            await asyncio.sleep(0.05)  # (polling the program's count: bounded above)
    return state


async def consume_until(program: Any, consumer: str, want: set[str], deadline_s: float) -> list:
    """Receive (acknowledging) until every one of `want` came at least once; every
    delivery, in the order they came."""
    deliveries: list[str] = []
    async with asyncio.timeout(deadline_s):
        while not want <= set(deliveries):
            got = await program.drain(consumer, timeout_ms=500)
            deliveries += [m["data"] for m in got]
    return deliveries


@pytest.mark.parametrize("sequence_ids", ["explicit", "automatic"])
async def test_a_broker_killed_under_a_pulsar_client_producer_and_consumer(
    cluster, programs, sequence_ids
):
    cluster.start_bookies(3)
    brokers = cluster.start_brokers(2, pulsar=True)
    url = pulsar_urls(brokers)
    producing = await programs()
    client = await producing.client(url)
    producer, _ = await producing.producer(
        client, TOPIC, producer_name="steady", batching_enabled=sequence_ids == "automatic",
        block_if_queue_full=True, max_pending_messages=100, send_timeout_millis=60_000,
    )  # fmt: skip
    consuming = await programs()
    consumer_client = await consuming.client(url)
    consumer = await consuming.subscribe(consumer_client, TOPIC, "all", initial_position="Earliest")

    await producing.run("send_background", producer=producer, count=COUNT, prefix="m",
                        explicit_sequence_ids=sequence_ids == "explicit", interval_ms=5)  # fmt: skip
    everything = {f"m-{i}" for i in range(COUNT)}
    consuming_task = asyncio.ensure_future(consume_until(consuming, consumer, everything, 150))
    before = await settled(producing, COUNT // 4)
    assert before["settled"] < COUNT, "the broker is killed while the producer sends"
    owner = await BrokerRegistry((await cluster.client()).store).owner(NAME)
    assert owner is not None
    [lost] = [b for b in brokers if b.broker_id == owner.broker_id]
    lost.kill()
    state = await settled(producing, COUNT, timeout_s=150)
    results = state["results"]
    failed = [(i, r[0]) for i, r in enumerate(results) if r[0] != "Ok"]
    assert not failed, f"sends that failed: {failed[:10]}\n{producing.log_tail()}"
    ids = [tuple(r[1][:3]) for r in results]
    assert ids == sorted(ids), "acknowledged in the order sent"
    moved = await BrokerRegistry((await cluster.client()).store).owner(NAME)
    assert moved is not None and moved.broker_id != lost.broker_id

    # Stored: each acknowledged message once, in the order sent.
    direct = await cluster.client()
    reader = await direct.create_reader(NAME, EARLIEST)
    stored = []
    while await reader.has_message_available():
        stored.append(await reader.read_next(timeout=30))
    assert [m.data.decode() for m in stored] == [f"m-{i}" for i in range(COUNT)]
    assert {m.producer_name for m in stored} == {"steady"}
    if sequence_ids == "explicit":
        assert [m.sequence_id for m in stored] == list(range(COUNT))

    # The consumer got everything, at least once, across the kill.
    deliveries = await consuming_task
    assert len(set(deliveries)) == COUNT
    first_seen = list(dict.fromkeys(deliveries))
    assert first_seen == [f"m-{i}" for i in range(COUNT)], "first deliveries in order"
