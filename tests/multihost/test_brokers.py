"""The stream service across hosts: brokers on hosts k1 and k2 (bound to the wildcard,
advertising their own address), bookies b1..b3, a publishing client on c1. The host of
the broker that owns the stream loses its link while the broker runs on: its ZooKeeper
session expires, the other broker takes the stream over by fencing, the client follows
on its own -- and when the link comes back, the deposed broker serves nothing of it.
Nothing acknowledged is lost or written twice."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from tests.multihost.conftest import HOSTS, Cluster
from tests.multihost.hosts import Network, Proc, running_network

BROKER_HOSTS = ("k1", "k2")


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """This module's hosts: the usual ones and two for brokers."""
    with running_network((*HOSTS, *BROKER_HOSTS), tmp_path_factory.mktemp("brokers")) as net:
        yield net


def start_broker(cluster: Cluster, host: str, session_s: float = 2) -> Proc:
    argv = [sys.executable, "-m", "streamlib", "broker", "--metadata", cluster.uri,
            "--host", "0.0.0.0", "--port", "6650", "--session-timeout", str(session_s),
            "--log-level", "INFO"]  # fmt: skip
    proc = cluster.net[host].popen(argv, label=f"broker-{host}")
    line = proc.wait_line(lambda x: x.startswith("broker "), 60)
    assert line.endswith(f"listening on {cluster.net[host].address}:6650"), line
    return proc


# Publishes COUNT messages as producer "P" through the service, one JSON line per event:
# {"owner": address} first, {"acked": n} every 100, {"done": acked, "failed": n}, then
# {"owner_after": address}.
PUBLISHER = """
import asyncio, json, sys, streamlib

async def main(url, count):
    client = await streamlib.Client.connect(url)
    print(json.dumps({"owner": await client.lookup("moving")}), flush=True)
    producer = await client.create_producer("moving", producer_name="P")
    acked = failed = 0
    def done(future):
        nonlocal acked, failed
        if future.exception() is None:
            acked += 1
            if acked % 100 == 0:
                print(json.dumps({"acked": acked}), flush=True)
        else:
            failed += 1
    for i in range(count):
        (await producer.send_async(b"%d" % i)).add_done_callback(done)
        if i % 50 == 49:
            await asyncio.sleep(0.02)  # (a steady rate: the partition comes mid-way)
    await producer.flush()
    print(json.dumps({"done": acked, "failed": failed}), flush=True)
    print(json.dumps({"owner_after": await client.lookup("moving")}), flush=True)
    await client.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def events(proc: Proc) -> list[dict]:
    return [json.loads(line) for line in proc.lines if line.startswith("{")]


def test_a_partitioned_owner_is_fenced_and_its_stream_moves(cluster: Cluster) -> None:
    cluster.start_bookies(["b1", "b2", "b3"])
    cluster.create_stream("moving", ensemble=3, write_quorum=2, ack_quorum=2)
    for host in BROKER_HOSTS:
        start_broker(cluster, host)
    url = "streamlib://" + ",".join(f"{cluster.net[h].address}:6650" for h in BROKER_HOSTS)
    count = 3000
    publisher = cluster.net["c1"].popen([sys.executable, "-c", PUBLISHER, url, str(count)],
                                        label="publisher")  # fmt: skip
    owner = json.loads(publisher.wait_line(lambda x: x.startswith('{"owner"'), 60))["owner"]
    [owner_host] = [h for h in BROKER_HOSTS if owner.startswith(cluster.net[h].address + ":")]
    publisher.wait_line(lambda x: x == '{"acked": 500}', 60)

    cluster.net[owner_host].partition()  # the broker runs on, cut off from everything
    publisher.wait_line(lambda x: x == '{"acked": 1500}', 120)  # through the other broker
    cluster.net[owner_host].heal()
    done = json.loads(publisher.wait_line(lambda x: x.startswith('{"done"'), 120))
    assert done == {"done": count, "failed": 0}, publisher.tail()
    after = json.loads(publisher.wait_line(lambda x: x.startswith('{"owner_after"'), 60))
    assert after["owner_after"] != owner  # the stream moved, and stays moved after the heal
    assert publisher.wait(30) == 0

    stored = [int(m["data"]) for m in cluster.read("c2", "moving")]
    assert stored == list(range(count))  # every acknowledged message once, in order


def test_a_killed_owner_on_another_host_is_replaced_before_its_session_ends(
    cluster: Cluster,
) -> None:
    """On ZooKeeper, across hosts: the owner's process is SIGKILLed (its host answers,
    its port refuses), and the other broker deletes its lease -- another session's
    ephemeral node -- long before the dead one's 60 s session would have ended."""
    cluster.start_bookies(["b1", "b2", "b3"])
    cluster.create_stream("moving", ensemble=3, write_quorum=2, ack_quorum=2)
    brokers = {host: start_broker(cluster, host, session_s=60) for host in BROKER_HOSTS}
    url = "streamlib://" + ",".join(f"{cluster.net[h].address}:6650" for h in BROKER_HOSTS)
    count = 3000
    publisher = cluster.net["c1"].popen([sys.executable, "-c", PUBLISHER, url, str(count)],
                                        label="publisher")  # fmt: skip
    owner = json.loads(publisher.wait_line(lambda x: x.startswith('{"owner"'), 60))["owner"]
    [owner_host] = [h for h in BROKER_HOSTS if owner.startswith(cluster.net[h].address + ":")]
    publisher.wait_line(lambda x: x == '{"acked": 500}', 60)

    brokers[owner_host].kill()
    # Bounded well below the dead broker's session: only evidence can have moved it.
    done = json.loads(publisher.wait_line(lambda x: x.startswith('{"done"'), 30))
    assert done == {"done": count, "failed": 0}, publisher.tail()
    after = json.loads(publisher.wait_line(lambda x: x.startswith('{"owner_after"'), 30))
    assert after["owner_after"] != owner
    assert publisher.wait(30) == 0
    stored = [int(m["data"]) for m in cluster.read("c2", "moving")]
    assert stored == list(range(count))
