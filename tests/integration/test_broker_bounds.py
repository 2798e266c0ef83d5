"""A broker's memory and CPU stay bounded whatever its clients do (issue 26), on real
processes: consumers that grant permits and never read hold at most the byte budgets
(read-ahead per subscription, unacknowledged bytes per consumer), sessions beyond the
caps (per broker, per principal) are refused with a retryable TooManySessionsError, and
an idle session costs the broker no messages (liveness is gRPC keepalive per connection,
not a heartbeat per session).

Memory is the broker's RSS (/proc), its growth over a baseline taken once it owns the
stream; the peak is taken while waiting (bounded) for the broker to go quiet. How the
figures are measured, and a script printing them: tests/integration/broker_load.py.
"""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import pytest

import metadata
from metadata.services.principals import PrincipalRoles
from streamlib.client import Client
from streamlib.errors import StreamlibError
from streamlib.security import make_token, new_secret_key, write_private
from streamlib.service.client import unload
from tests.integration.broker_load import (
    LOADED_BROKER,
    SCENARIO_A,
    SCENARIO_B,
    MiB,
    RawSessions,
    answer_kind,
    heard_within,
    idle_sessions_cost,
    open_many,
    publish_backlog,
    read_ahead_growth,
)

pytestmark = pytest.mark.timeout(120)

REFUSED = "error:TooManySessionsError"  # (by its code: the class is not there yet)

# -- what the broker may hold, and the bounds that follow ---------------------------------

# The budgets `streamlib broker` keeps by default (--max-read-ahead-bytes-per-subscription,
# --max-unacked-bytes-per-consumer).
# per subscription: its inner consumer's queue (RECEIVER_QUEUE_BYTES, 4 MiB) and its
# dispatch queue (4 MiB)
READ_AHEAD_BUDGET = 8 * MiB
UNACKED_BUDGET = 8 * MiB  # per consumer
# Besides its queue, the broker's inner consumer has reads from the bookies in flight:
# streamlib/stream/reader.py's READ_AHEAD (3) ranges of about READ_BYTES (4 MiB), and the
# one it is decoding.
SCANNER_IN_FLIGHT = 4 * 4 * MiB
# On its way to a consumer that does not read: a delivery of about DELIVERY_BYTES (1 MiB)
# being sent, and what gRPC holds of it.
TO_A_CONSUMER = 2 * MiB
# RSS is more than the bytes held: the allocator keeps freed memory, gRPC its buffers.
# (Payloads are held twice while a delivery is on its way: the Message kept for
# redelivery, and its protobuf copy. Measured: 1.1-1.15 x what the budgets allow.)
ALLOCATOR_SLACK = 1.3
# Fixed costs of the first sessions (channels, a dispatcher and a consumer per
# subscription, tasks): measured 10-25 MiB.
BASE_ALLOWANCE = 32 * MiB


def read_ahead_bound(subscriptions: int, unacked_per_consumer: int) -> int:
    """The most a broker may grow by with one consumer per subscription that reads
    nothing, each holding unacked_per_consumer bytes delivered and unacknowledged."""
    per_subscription = READ_AHEAD_BUDGET + SCANNER_IN_FLIGHT + unacked_per_consumer + TO_A_CONSUMER
    return int(ALLOCATOR_SLACK * subscriptions * per_subscription) + BASE_ALLOWANCE


# (a) One permit each: one message delivered and unacknowledged per consumer. About
# 136 MiB; the broker without budgets grew by 312-318 MiB (3 x the 96 MiB backlog), with
# them by 78 MiB.
BOUND_A = read_ahead_bound(SCENARIO_A["subscriptions"], SCENARIO_A["size"])
# (b) Every permit: the unacknowledged budget used up. About 386 MiB; the broker without
# budgets grew by 609-641 MiB (8 x the 62 MiB backlog, and its copies on their way out),
# with them by 313 MiB.
BOUND_B = read_ahead_bound(SCENARIO_B["subscriptions"], UNACKED_BUDGET)

IDLE_SESSIONS = 2000
# An idle session is a gRPC call, its handler's generator and tasks and an empty queue:
# measured ~32 KiB each, with or without heartbeats (2000 of them: +63-65 MiB).
IDLE_SESSION_BYTES = 40 * 1024
IDLE_ALLOWANCE = 16 * MiB
BOUND_IDLE_RSS = IDLE_SESSIONS * IDLE_SESSION_BYTES + IDLE_ALLOWANCE  # about 94 MiB
# Idle sessions cost no CPU: only keepalive pings per connection (one in 10 s each) and
# the broker's own metadata session. With a heartbeat per session per second, 2000
# sessions took ~32% of a core; without, ~2%.
BOUND_IDLE_CPU_SHARE = 0.10
SILENCE_WINDOW_S = 3.0  # an idle session hears nothing this long (a heartbeat came every 1 s)


# -- read-ahead and unacknowledged bytes -------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "bound"),
    [(SCENARIO_A, BOUND_A), (SCENARIO_B, BOUND_B)],
    ids=["one permit each", "every permit"],
)
async def test_consumers_that_never_read_hold_only_the_byte_budgets(cluster, scenario, bound):
    """(a) one permit: the read-ahead budget; (b) 2**32-1 permits: the unacknowledged
    budget too -- never the backlog, however large."""
    cluster.start_bookies(3)
    await publish_backlog(cluster, "backlog", scenario["count"], scenario["size"])
    [broker] = cluster.start_brokers(1, extra=LOADED_BROKER)
    growth = await read_ahead_growth(
        broker, "backlog", scenario["subscriptions"], scenario["permits"]
    )
    assert growth.rss < bound, f"{growth}; bound {bound / MiB:.0f} MiB"


# -- session caps --------------------------------------------------------------------------


async def admitted_again(open_one, timeout_s: float = 15.0) -> str:
    """Open until admitted (the broker notices the closed calls' ends soon after):
    bounded, the last answer's kind."""
    deadline = time.monotonic() + timeout_s
    while (kind := answer_kind(await open_one())) == REFUSED and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return kind


async def test_a_principal_past_its_session_cap_is_refused_until_one_of_its_sessions_ends(
    cluster, monkeypatch
):
    """Auth off: every caller is the one anonymous principal. Producers, consumers and
    readers all count."""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=["--max-sessions-per-principal", "50"])
    sessions = RawSessions(broker.address)
    try:
        kinds = await open_many([sessions.produce("capped", f"p{i}") for i in range(20)])
        kinds += await open_many(  # (after the producers: a reader needs the stream)
            [sessions.consume("capped", "s", consumer_type="shared") for _ in range(25)]
            + [sessions.consume("capped") for _ in range(5)]  # readers
        )
        assert collections.Counter(kinds) == {"ready": 50}
        assert answer_kind(await sessions.produce("capped", "p-one-too-many")) == REFUSED
        assert answer_kind(await sessions.consume("capped", "s", consumer_type="shared")) == REFUSED
        assert answer_kind(await sessions.consume("capped")) == REFUSED

        # The service client retries a refusal, and its first connection gives up with it.
        import streamlib.service.connection

        monkeypatch.setattr(streamlib.service.connection, "FIRST_CONNECT_S", 3.0)
        client = await cluster.service_client()
        started = time.monotonic()
        with pytest.raises(StreamlibError) as refused:
            await client.subscribe("capped", "s", consumer_type="shared")
        assert type(refused.value).__name__ == "TooManySessionsError"
        assert time.monotonic() - started >= 2.5  # (it tried again, for FIRST_CONNECT_S)

        sessions.close(5)  # five end: five more may come
        kind = await admitted_again(lambda: sessions.consume("capped", "s", consumer_type="shared"))
        assert kind == "ready"
        consumer = await client.subscribe("capped", "s", consumer_type="shared")
        producer = await client.create_producer("capped")
        await producer.send(b"admitted")
        await consumer.close()
        await producer.close()
    finally:
        await sessions.aclose()


async def test_the_broker_caps_its_sessions_across_principals(cluster, tmp_path: Path):
    """Token auth, no TLS: alice and bob may each have 40 sessions, the broker 60."""
    secret = new_secret_key()
    secret_file = write_private(tmp_path / "token.key", secret)
    async with await metadata.connect(cluster.metadata_uri) as store:
        principals = PrincipalRoles(store)
        for principal in ("alice", "bob"):
            await principals.grant(principal, ["write"])
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=[
        "--auth-token-secret-file", str(secret_file),
        "--max-sessions", "60", "--max-sessions-per-principal", "40",
    ])  # fmt: skip
    async with await Client.connect(cluster.metadata_uri) as admin:
        await admin.streams.create("both")
    alice = RawSessions(broker.address, token=make_token(secret, "alice"))
    bob = RawSessions(broker.address, token=make_token(secret, "bob"))
    try:
        kinds = await open_many(
            [alice.consume("both", "s", consumer_type="shared") for _ in range(30)]
            + [alice.produce("both", f"alice-{i}") for i in range(10)]
        )
        assert collections.Counter(kinds) == {"ready": 40}
        # Alice is at her cap; bob is not, and the broker has room for 20 more.
        assert answer_kind(await alice.consume("both", "s", consumer_type="shared")) == REFUSED
        kinds = await open_many([bob.consume("both", "s", consumer_type="shared")
                                 for _ in range(20)])  # fmt: skip
        assert collections.Counter(kinds) == {"ready": 20}
        # The broker is full: bob, under his own cap, is refused too.
        assert answer_kind(await bob.consume("both", "s", consumer_type="shared")) == REFUSED
        assert answer_kind(await bob.produce("both", "bob-one-too-many")) == REFUSED

        alice.close(5)
        assert await admitted_again(lambda: bob.produce("both", "bob-later")) == "ready"
    finally:
        await alice.aclose()
        await bob.aclose()


# -- idle sessions ------------------------------------------------------------------------


async def test_idle_sessions_cost_the_broker_little_memory_and_no_cpu(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=LOADED_BROKER)
    cost = await idle_sessions_cost(broker, IDLE_SESSIONS, cpu_window_s=4.0)
    assert cost.answers == {"ready": IDLE_SESSIONS}
    assert cost.growth.rss < BOUND_IDLE_RSS, f"{cost}; bound {BOUND_IDLE_RSS / MiB:.0f} MiB"
    assert cost.cpu_share < BOUND_IDLE_CPU_SHARE, f"{cost}"


async def test_the_broker_sends_nothing_on_an_idle_session(cluster):
    """No heartbeat per session: a producer, a consumer and a reader that are idle hear
    nothing (their connection's liveness is gRPC keepalive)."""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    sessions = RawSessions(broker.address)
    try:
        assert answer_kind(await sessions.produce("quiet", "p")) == "ready"
        assert answer_kind(await sessions.consume("quiet", "s")) == "ready"
        assert answer_kind(await sessions.consume("quiet")) == "ready"  # a reader
        heard = await asyncio.gather(
            *(heard_within(call, SILENCE_WINDOW_S) for call in sessions.calls)
        )
        assert heard == [None, None, None]  # (producer, consumer, reader)
    finally:
        await sessions.aclose()


async def test_sessions_ended_with_sends_in_flight_give_their_publish_buffer_back(cluster):
    """A producer's session ended by an unload while its sends are in flight (grpc then
    cancels the handler again, while it stops): the bytes of its sends come back to the
    broker's publish buffer. Before, a second cancellation skipped that, the leaks added
    up, and once they filled the buffer every producer of the broker waited for good."""
    cluster.start_bookies(3)
    budget = 4 * MiB
    [broker] = cluster.start_brokers(1, extra=["--max-publish-buffer-bytes", str(budget)])
    client = await cluster.service_client()
    producer = await client.create_producer("moving")
    payload = b"x" * 20_000
    stop = asyncio.Event()

    async def flood() -> None:
        while not stop.is_set():
            await producer.send_async(payload)  # (waits while max_pending are in flight)

    flooding = asyncio.get_running_loop().create_task(flood())
    try:
        for _ in range(20):  # the stream moves, with sends in flight, again and again
            acknowledged = producer.sent
            async with asyncio.timeout(60):
                while producer.sent < acknowledged + 20:  # (it reconnected and publishes)
                    await asyncio.sleep(0.01)
            await unload(broker.address, "moving")
    finally:
        stop.set()
        await flooding
    await asyncio.wait_for(producer.flush(), 60)
    # Every byte came back: a burst of twice the budget still goes through.
    other = await client.create_producer("after")
    burst = [await other.send_async(payload) for _ in range(2 * budget // len(payload))]
    await asyncio.wait_for(asyncio.gather(*burst), 60)
