"""gRPC keepalive: a bookie that stops answering while its connections stay open is
noticed within the client's keepalive_time_s + keepalive_timeout_s.

SIGSTOP makes such a peer on one machine: the kernel keeps the TCP connection (and even
acknowledges the bytes sent to it), but nothing answers, as with a dead host or a
partition. The adds' own timeout is set far beyond the bound, so only keepalive can
notice in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from bookie.launcher import BookieProcess
from streamlib.ledger.bookie_client import BookieClientConfig
from tests.integration.conftest import LedgerCluster

KEEPALIVE = BookieClientConfig(
    add_timeout_s=120.0, read_timeout_s=120.0, keepalive_time_s=1.0, keepalive_timeout_s=1.0
)
# The bound the issue names, with room for a slow machine.
NOTICED_WITHIN_S = KEEPALIVE.keepalive_time_s + KEEPALIVE.keepalive_timeout_s + 10.0
# Bookies answer a client that pings more often than --min-client-ping-interval (default
# 10 s) with GOAWAY too_many_pings; these let the client ping every second.
PINGS_ALLOWED = ["--min-client-ping-interval", "0.5"]


@contextlib.contextmanager
def frozen(bookie: BookieProcess) -> Iterator[None]:
    """SIGSTOP the bookie; on the way out, whatever happened, SIGCONT and stop it."""
    assert bookie.proc is not None
    pid = bookie.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
        bookie.stop()


async def test_a_writer_notices_a_frozen_bookie_by_keepalive_and_replaces_it(
    cluster: LedgerCluster,
) -> None:
    cluster.start_bookies(4, extra=PINGS_ALLOWED)  # three for the ensemble, one spare
    client = await cluster.client(bookie_config=KEEPALIVE)
    writer = await client.ledgers.create(3, 3, 3)  # every entry needs every bookie of it
    before = [b"before %d" % i for i in range(10)]
    await writer.append_many(before)  # the add streams to the ensemble are open
    victim = cluster.by_id(writer.metadata.last_fragment.ensemble[0])

    with frozen(victim):
        try:
            entry_id = await asyncio.wait_for(writer.append(b"while frozen"), NOTICED_WITHIN_S)
        except TimeoutError:
            pytest.fail(f"the frozen bookie was not noticed within {NOTICED_WITHIN_S} s")
        assert entry_id == len(before)
        assert victim.bookie_id not in writer.metadata.last_fragment.ensemble

    closed = await writer.close()
    assert len(closed.fragments) == 2
    reader = await (await cluster.client()).ledgers.open(writer.ledger_id)
    assert await reader.read(0, entry_id) == [*before, b"while frozen"]


async def test_a_consumer_notices_a_frozen_broker_by_keepalive_and_follows_its_stream(
    cluster: LedgerCluster,
) -> None:
    """Brokers send no per-session heartbeats: the channel's keepalive (ping every 2 s,
    answer within 2 s) is what notices a broker that stops answering. The consumer's
    session must end within that bound plus slack -- not after gRPC's default 60 s ping
    timeout -- and the consumer reconnects on its own."""
    cluster.start_bookies(3)
    frozen_broker = cluster.start_brokers(1)[0]
    client = await cluster.service_client()
    await client.streams.create("kept")
    consumer = await client.subscribe("kept", "s", "earliest")
    assert consumer._source.reconnects == 0
    os.kill(frozen_broker.pid, signal.SIGSTOP)
    try:
        async with asyncio.timeout(2.0 + 2.0 + 10.0):
            while consumer._source.reconnects == 0:  # (bounded by the timeout above)
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail("the frozen broker was not noticed within 14 s")
    finally:
        os.kill(frozen_broker.pid, signal.SIGCONT)
    producer = await client.create_producer("kept")
    sent = await producer.send(b"after")
    assert (await consumer.receive(timeout=60)).message_id == sent
