"""Network faults no process fault can make, on hosts made of network namespaces.

Each test is one scenario on a fresh ZooKeeper chroot with bookies b1..b4 and client
workers on c1 / c2; the observer on ob watches registrations and metadata. Figures
(how long things took, how much got through) are printed: run with -s to see them.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from tests.multihost.conftest import BOOKIE_HOSTS, Cluster
from tests.multihost.hosts import Worker, WorkerError


def figure(name: str, value: float | int, unit: str = "") -> None:
    shown = f"{value:.2f}" if isinstance(value, float) else str(value)
    print(f"[multihost] {name}: {shown}{(' ' + unit) if unit else ''}")


def pairs(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["id"], e["data"]) for e in events]


def test_the_readme_recipe_works_across_hosts(cluster: Cluster) -> None:
    cluster.start_bookies()
    addresses = cluster.observer.request("bookies")["bookies"]
    assert addresses == {f"{h}:3181": f"{cluster.net[h].address}:3181" for h in BOOKIE_HOSTS}
    cluster.create_stream("orders", ensemble=3, write_quorum=2, ack_quorum=2)

    producer = cluster.producer("c1", "orders", "producer")
    sent = producer.request("send", count=200, prefix="order", timeout_s=120)
    producer.request("close")
    acks = producer.of("ack")
    assert sent["acked"] == 200 and sent["failed"] == 0, producer.tail()
    figure("README recipe: 200 sends, one at a time", acks[-1]["t"] - acks[0]["t"], "s")

    received = cluster.consume("c2", "orders", "audit", 200)
    assert pairs(received) == pairs(acks)  # nothing lost, nothing twice, in order
    (ledger,) = cluster.ledgers("orders")
    assert len(ledger["fragments"][0]["bookies"]) == 3


def host_of(bookie_id: str) -> str:
    return bookie_id.split(":", 1)[0]


def largest_gap(events: list[dict[str, Any]]) -> float:
    times = [e["t"] for e in events]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def current_ensemble(producer: Worker) -> list[str]:
    bookies: list[str] = producer.request("ensemble")["fragments"][-1]["bookies"]
    return bookies


def test_a_bookie_cut_off_while_written_to_is_replaced_and_rejoins(cluster: Cluster) -> None:
    cluster.start_bookies()
    cluster.create_stream("events", ensemble=3, write_quorum=2, ack_quorum=2)
    producer = cluster.producer("c1", "events", "producer")
    sending = producer.ask("send", count=300, prefix="event", interval_s=0.01)
    producer.wait_for(lambda e: e.get("data") == "event-29", 30)
    victim = current_ensemble(producer)[0]
    cut = cluster.net[host_of(victim)]

    cut.partition()
    cut_at = time.monotonic()
    gone = cluster.wait_registration(victim, present=False, timeout_s=30)
    sent = producer.answer(sending, timeout_s=120)
    assert sent == {**sent, "acked": 300, "failed": 0}, producer.tail()
    healed_at = time.monotonic()
    cut.heal()
    back = cluster.wait_registration(victim, present=True, timeout_s=90)
    producer.request("close")

    acks = producer.of("ack")
    figure(
        "bookie partition: messages acknowledged while it was cut off",
        sum(e["t"] > cut_at for e in acks),
    )
    figure("bookie partition: longest wait for an acknowledgement", largest_gap(acks), "s")
    figure("bookie partition: its registration vanished after", gone["t"] - cut_at, "s")
    figure("bookie partition: re-registered after the heal in", back["t"] - healed_at, "s")
    (ledger,) = cluster.ledgers("events")
    assert len(ledger["fragments"]) >= 2, ledger  # an ensemble change
    assert victim not in ledger["fragments"][-1]["bookies"], ledger
    assert pairs(cluster.read("c2", "events")) == pairs(acks)


def test_a_partitioned_writer_is_fenced_not_split_brained(cluster: Cluster) -> None:
    cluster.start_bookies()
    cluster.create_stream("ledger-of-record", ensemble=3, write_quorum=2, ack_quorum=2)
    first = cluster.producer("c1", "ledger-of-record", "writer-1")
    assert first.request("send", count=20, prefix="w1")["acked"] == 20

    cluster.net["c1"].partition()
    # A send made while cut off: it must never be acknowledged.
    in_flight = first.ask("send", count=1, prefix="w1-cut-off")
    cut_at = time.monotonic()
    second = cluster.producer("c2", "ledger-of-record", "writer-2")
    assert second.request("send", count=20, prefix="w2")["acked"] == 20
    try:  # the cut-off writer's add times out (3 s) and it tries to reach ZooKeeper
        first.answer(in_flight, timeout_s=cut_at + 8 - time.monotonic())
    except WorkerError:
        pass  # still trying when the cable comes back
    healed_at = time.monotonic()
    cluster.net["c1"].heal()
    first.answer(in_flight, timeout_s=120)
    first.request("send", count=1, prefix="w1-healed", timeout_s=120)

    outcomes = {e["data"]: e for e in first.of("error") + first.of("ack")}
    print(
        f"[multihost] the cut-off writer's outcomes: {outcomes['w1-cut-off-0']}, "
        f"{outcomes['w1-healed-0']}"
    )
    assert outcomes["w1-cut-off-0"]["event"] == "error"
    fenced = outcomes["w1-healed-0"]
    assert fenced["event"] == "error", fenced
    assert fenced["error"] in ("StreamFencedError", "LedgerFencedError"), fenced
    figure(
        "writer partition: the new writer took over in", second.of("ready")[0]["takeover_s"], "s"
    )
    figure(
        "writer partition: the send in flight failed after the cut, in",
        outcomes["w1-cut-off-0"]["t"] - cut_at,
        "s",
    )
    figure(
        "writer partition: after the heal, the old writer's next send failed in",
        fenced["t"] - healed_at,
        "s",
    )
    second.request("close")
    expected = first.of("ack") + second.of("ack")
    assert pairs(cluster.read("ob", "ledger-of-record")) == pairs(expected)


@pytest.mark.parametrize(
    "direction",
    [
        "out",  # the client's adds never reach the bookie
        "in",  # the bookie stores the adds, but its answers never come back
    ],
)
def test_a_client_cut_off_from_one_bookie_writes_on_around_it(
    cluster: Cluster, direction: str
) -> None:
    cluster.start_bookies()
    cluster.create_stream("clicks", ensemble=3, write_quorum=2, ack_quorum=2)
    producer = cluster.producer("c1", "clicks", "producer")
    sending = producer.ask("send", count=200, prefix="click", interval_s=0.01)
    producer.wait_for(lambda e: e.get("data") == "click-19", 30)
    victim = current_ensemble(producer)[0]
    since = len(cluster.observer.events)

    cluster.net["c1"].block(cluster.net[host_of(victim)], direction)
    blocked_at = time.monotonic()
    sent = producer.answer(sending, timeout_s=120)
    assert sent == {**sent, "acked": 200, "failed": 0}, producer.tail()
    producer.request("close")

    acks = producer.of("ack")
    figure(
        f"client cut off from a bookie ({direction}): messages acknowledged meanwhile",
        sum(e["t"] > blocked_at for e in acks),
    )
    figure(
        f"client cut off from a bookie ({direction}): longest wait for an ack",
        largest_gap(acks),
        "s",
    )
    (ledger,) = cluster.ledgers("clicks")
    assert victim not in ledger["fragments"][-1]["bookies"], ledger
    # ZooKeeper still hears the bookie: it stays registered throughout.
    seen = cluster.observer.of("bookies", since)
    assert all(victim in e["present"] for e in seen), seen
    assert victim in cluster.registered()
    assert pairs(cluster.read("c2", "clicks")) == pairs(acks)


def test_a_bookie_cut_off_from_zookeeper_serves_reads_and_rejoins(cluster: Cluster) -> None:
    cluster.start_bookies()
    cluster.create_stream("archive", ensemble=3, write_quorum=3, ack_quorum=3)
    producer = cluster.producer("c1", "archive", "producer")
    assert producer.request("send", count=50, prefix="doc")["acked"] == 50
    ensemble = current_ensemble(producer)
    producer.request("close")
    victim, others = ensemble[0], ensemble[1:]
    zk_host, cut = cluster.net["zk"], cluster.net[host_of(victim)]

    cut.block(zk_host)
    cut_at = time.monotonic()
    gone = cluster.wait_registration(victim, present=False, timeout_s=30)
    # A reader that can reach only the unregistered bookie still reads everything.
    for other in others:
        cluster.net["c2"].block(cluster.net[host_of(other)])
    read = cluster.read("c2", "archive", label="reader-of-the-unregistered")
    assert pairs(read) == pairs(producer.of("ack"))
    for other in others:
        cluster.net["c2"].unblock(cluster.net[host_of(other)])
    healed_at = time.monotonic()
    cut.unblock(zk_host)
    back = cluster.wait_registration(victim, present=True, timeout_s=90)
    figure("bookie cut off from ZooKeeper: registration vanished after", gone["t"] - cut_at, "s")
    figure(
        "bookie cut off from ZooKeeper: re-registered after the heal in", back["t"] - healed_at, "s"
    )


LOST_BOOKIE_DELAY_S = 8.0
AUTORECOVERY = [
    "--autorecovery",
    f"--autorecovery-option=--lost-bookie-delay={LOST_BOOKIE_DELAY_S}",
    "--autorecovery-option=--grace-period=2",
    # The nodes' own sessions as short as the bookies': a cut-off auditor hands over soon.
    "--autorecovery-option=--session-timeout=2",
]
POLL_S = 0.2  # between two looks at the metadata while waiting on auto-recovery


def ensembles(cluster: Cluster, stream: str) -> list[list[str]]:
    (ledger,) = cluster.ledgers(stream)
    return [f["bookies"] for f in ledger["fragments"]]


def test_auto_recovery_waits_out_the_lost_bookie_delay(cluster: Cluster) -> None:
    cluster.start_bookies(extra=AUTORECOVERY)
    cluster.create_stream("vault", ensemble=3, write_quorum=3, ack_quorum=2)
    producer = cluster.producer("c1", "vault", "producer")
    assert producer.request("send", count=30, prefix="deed")["acked"] == 30
    producer.request("close")
    before = ensembles(cluster, "vault")
    victim = before[-1][0]
    cut = cluster.net[host_of(victim)]

    # Away for less than the delay: nothing is re-replicated.
    cut.partition()
    gone = cluster.wait_registration(victim, present=False, timeout_s=30)
    cut.heal()
    back = cluster.wait_registration(victim, present=True, timeout_s=90)
    figure("auto-recovery: a short absence lasted", back["t"] - gone["t"], "s")
    assert back["t"] - gone["t"] < LOST_BOOKIE_DELAY_S
    watch_until = gone["t"] + LOST_BOOKIE_DELAY_S + 3
    while time.monotonic() < watch_until:
        assert cluster.observer.request("under_replicated")["ledgers"] == []
        assert ensembles(cluster, "vault") == before
        time.sleep(POLL_S)  # watching a window in which nothing may happen

    # Away for longer: the auditor marks the ledger, a worker copies it elsewhere.
    cut.partition()
    gone = cluster.wait_registration(victim, present=False, timeout_s=30)
    marked_at = replicated_at = None
    deadline = time.monotonic() + LOST_BOOKIE_DELAY_S + 60
    while replicated_at is None and time.monotonic() < deadline:
        if marked_at is None and cluster.observer.request("under_replicated")["ledgers"]:
            marked_at = time.monotonic()
        if all(victim not in bookies for bookies in ensembles(cluster, "vault")):
            replicated_at = time.monotonic()
        time.sleep(POLL_S)  # bounded polling of the metadata
    assert replicated_at is not None, f"still on {victim}: {ensembles(cluster, 'vault')}"
    assert replicated_at - gone["t"] >= LOST_BOOKIE_DELAY_S
    if marked_at is not None:
        figure("auto-recovery: marked under-replicated after the loss", marked_at - gone["t"], "s")
    figure("auto-recovery: re-replicated after the loss", replicated_at - gone["t"], "s")
    healed_at = time.monotonic()
    cut.heal()
    back = cluster.wait_registration(victim, present=True, timeout_s=90)
    figure("auto-recovery: after a long partition, re-registered in", back["t"] - healed_at, "s")
    assert pairs(cluster.read("c2", "vault")) == pairs(producer.of("ack"))


LONG_PARTITION_S = 40.0
# Session (2 s) + connecting + registering: what a client that keeps trying would need.
PROMPT_REREGISTRATION_S = 3.0


def test_a_bookie_healed_after_a_long_partition_rejoins_promptly(cluster: Cluster) -> None:
    cluster.start_bookies(names=["b1"])
    cut = cluster.net["b1"]
    cut.partition()
    cut_at = time.monotonic()
    cluster.wait_registration("b1:3181", present=False, timeout_s=30)
    # The fault's length, not a synchronisation: the cable stays out this long.
    time.sleep(max(0.0, cut_at + LONG_PARTITION_S - time.monotonic()))
    healed_at = time.monotonic()
    cut.heal()
    back = cluster.wait_registration("b1:3181", present=True, timeout_s=180)
    took = back["t"] - healed_at
    figure(
        f"after a {LONG_PARTITION_S:.0f} s partition, re-registered after the heal in", took, "s"
    )
    log = cluster.bookies["b1"].proc
    assert took < PROMPT_REREGISTRATION_S, (
        f"b1 re-registered {took:.1f}s after the heal: while cut off, its ZooKeeper client "
        f"waited ever longer between reconnect attempts{log.tail(2500) if log else ''}"
    )
