"""Brokers that die (SIGKILL) or stop past their session (SIGSTOP) while producer
processes publish through them and shared or key_shared consumers receive: the stream moves to
another broker by fencing, clients follow on their own, and nothing acknowledged is
lost, duplicated or reordered (deduplication by producer name and sequence id)."""

from __future__ import annotations

import asyncio
import collections

import pytest

from metadata.services.brokers import BrokerRegistry
from streamlib.stream.positions import EARLIEST
from tests.integration.conftest import _cluster, script_process

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path):
    """SIGKILL on sqlite, SIGSTOP on ZooKeeper. A broker stopped for good inside one of its
    sqlite write transactions (a few ms each, many a second) would hold the file's lock
    for good: every process of the cluster stalls, as the README's sqlite section says.
    ZooKeeper has no such lock; a stopped process only stops heartbeating."""
    fault = request.node.callspec.params["fault"]
    async for c in _cluster(request, tmp_path, "zk" if fault == "sigstop" else "sqlite"):
        yield c


# Publishes COUNT messages as producer NAME; says "half" once the first half is
# acknowledged and waits for a line on stdin (the fault is made meanwhile); says "done"
# once every one is acknowledged.
PRODUCER_SCRIPT = """
import sys, streamlib
client = streamlib.connect(sys.argv[1])
name, count = sys.argv[3], int(sys.argv[4])
producer = client.create_producer(sys.argv[2], producer_name=name)
futures = []
for i in range(count):
    futures.append(producer.send_async(b"%s-%d" % (name.encode(), i), key="k%d" % (i % 7)))
    if i == count // 2:
        producer.flush()
        print("half", flush=True)
        sys.stdin.readline()
producer.flush()
assert all(f.done() and f.exception() is None for f in futures)
print("done", flush=True)
client.close()
"""


async def next_line(proc) -> str:
    return (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 180)).strip()


async def owner_of(cluster, stream: str):
    registry = BrokerRegistry((await cluster.client()).store)
    return await registry.owner(stream)


async def check_stream(cluster, stream: str, names: list[str], count: int) -> None:
    """Every producer's messages exactly once, in its order, and nothing else."""
    client = await cluster.client()
    reader = await client.create_reader(stream, EARLIEST)
    seen = collections.defaultdict(list)
    for _ in range(len(names) * count):
        message = await reader.read_next(timeout=30)
        seen[message.producer_name].append(message.data)
    assert not await reader.has_message_available()
    for name in names:
        assert seen[name] == [b"%s-%d" % (name.encode(), i) for i in range(count)], name


async def consume(
    consumer, into: collections.Counter, stop: asyncio.Event, want: int, log: list
) -> None:
    """Receive and acknowledge until `want` distinct messages came (to either); `log`
    gets (key, message id, data) of each delivery, in the order they came (both
    consumers run on this loop: one order)."""
    while not stop.is_set():
        try:
            message = await consumer.receive(timeout=0.5)
        except TimeoutError:
            continue
        log.append((message.key, message.message_id, message.data))
        into[message.data] += 1
        consumer.acknowledge(message)
        if len(into) >= want:
            stop.set()


def first_deliveries_in_stream_order_per_key(log: list) -> None:
    """Key_Shared: each key's messages are first delivered in stream order (a message
    delivered again after a failover is not a first delivery)."""
    seen: set[bytes] = set()
    last: dict[str, object] = {}
    for key, message_id, data in log:
        if data in seen:
            continue
        seen.add(data)
        assert key not in last or last[key] < message_id, (key, last[key], message_id)
        last[key] = message_id


@pytest.mark.parametrize(
    ("fault", "kind"),
    [("sigkill", "shared"), ("sigstop", "shared"), ("sigkill", "key_shared"),
     ("sigstop", "key_shared")],
)  # fmt: skip
async def test_a_broker_lost_while_producers_publish_and_consumers_share(cluster, fault, kind):
    cluster.start_bookies(3)
    brokers = cluster.start_brokers(2)
    url = cluster.service_url
    client = await cluster.service_client()
    await client.streams.create("jobs")
    received: collections.Counter[bytes] = collections.Counter()
    stop = asyncio.Event()
    consumers = [
        await client.subscribe("jobs", "workers", "earliest", consumer_type=kind) for _ in range(2)
    ]
    count = 1500
    log: list = []
    tasks = [
        asyncio.get_running_loop().create_task(consume(c, received, stop, 2 * count, log))
        for c in consumers
    ]
    async with (
        script_process(PRODUCER_SCRIPT, url, "jobs", "A", str(count), ready="half") as a,
        script_process(PRODUCER_SCRIPT, url, "jobs", "B", str(count), ready="half") as b,
    ):
        owner = await owner_of(cluster, "jobs")
        [lost] = [p for p in brokers if p.broker_id == owner.broker_id]
        if fault == "sigkill":
            lost.kill()
        else:
            lost.pause()  # past its 2 s session: another broker takes the stream over
        for proc in (a, b):
            proc.stdin.write("go on\n")
            proc.stdin.flush()
        assert await next_line(a) == "done"
        assert await next_line(b) == "done"
        moved = await owner_of(cluster, "jobs")
        assert moved is not None and moved.broker_id != lost.broker_id
        if fault == "sigstop":
            lost.resume()  # it was fenced: it can acknowledge nothing more
    await check_stream(cluster, "jobs", ["A", "B"], count)
    everything = {b"%s-%d" % (n, i) for n in (b"A", b"B") for i in range(count)}
    await asyncio.wait_for(stop.wait(), 60)
    await asyncio.gather(*tasks)
    assert set(received) == everything  # every message delivered, at least once
    if kind == "key_shared":
        first_deliveries_in_stream_order_per_key(log)
    if fault == "sigstop":
        # The old owner, running again, does not serve the stream.
        assert (await owner_of(cluster, "jobs")).broker_id != lost.broker_id
