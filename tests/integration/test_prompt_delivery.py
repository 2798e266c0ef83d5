"""Nothing waits on a timer when nothing else is coming: a lone message goes at once
(adaptive batching), and a quiet writer's last entry reaches tailing readers without an
explicit-LAC timer (prompt LAC). Behaviour only: the timers are set so long that the old
code would wait out the test's timeout."""

from __future__ import annotations

import asyncio

import pytest

from bookie.service import MAX_PIGGYBACK_ENTRIES
from bookie.wire import bookie_pb2 as pb
from streamlib.ledger.bookie_client import BookieClient
from tests.integration.conftest import FAST_CLIENT

pytestmark = pytest.mark.timeout(60)


async def test_a_lone_message_goes_at_once_and_the_rest_gather_while_it_is_in_flight(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("prompt", batching_max_publish_delay_ms=600_000)
    first = await asyncio.wait_for(producer.send(b"alone"), 30)  # no 10-minute linger
    gathered = [await producer.send_async(b"m%d" % i) for i in range(50)]
    # The first of these goes at once; the rest gather while it is in flight and go
    # when it is acknowledged -- not after the 10-minute delay.
    ids = await asyncio.wait_for(asyncio.gather(*gathered), 30)
    entries = {(m.ledger_id, m.entry_id) for m in ids}
    assert first.entry_id < min(e for _, e in entries)
    assert len(entries) <= 2, entries  # batched, not one entry per message
    await producer.close()


async def test_a_tailing_reader_sees_a_quiet_writers_last_entry_without_a_timer(cluster):
    cluster.start_bookies(3)
    client, other = await cluster.client(), await cluster.client()
    writer = await client.ledgers.create(3, 3, 2)
    writer._explicit_lac_interval_s = 3600.0  # no timer: only prompt publication tells
    await writer.append(b"lone")  # no later entry carries its LAC
    reader = await other.ledgers.open(writer.ledger_id, recover=False)
    for _ in range(20):  # bounded: each long poll lasts at most 1 s
        if reader.last_add_confirmed >= 0:
            break
        await reader.wait_for_more(reader.last_add_confirmed + 1, 1.0)
    assert reader.last_add_confirmed == 0
    assert await reader.read(0, 0) == [b"lone"]


async def test_a_long_poll_brings_every_entry_up_to_the_lac_within_bounds(cluster):
    (bookie,) = cluster.start_bookies(1)
    client, other = await cluster.client(), await cluster.client()
    writer = await client.ledgers.create(1, 1, 1)
    reader = await other.ledgers.open(writer.ledger_id, recover=False)
    await writer.append_many([b"e%d" % i for i in range(5)])  # then the LAC goes quiet
    for _ in range(20):  # bounded: each long poll lasts at most 1 s
        if reader.last_add_confirmed >= 4:
            break
        await reader.wait_for_more(reader.last_add_confirmed + 1, 1.0)
    # The poll that saw LAC 4 brought the entries it waited for: no read call follows.
    reads = 0
    read_from = type(reader)._read_from

    async def counting(self, bookie_id, entry_ids):
        nonlocal reads
        reads += 1
        return await read_from(self, bookie_id, entry_ids)

    type(reader)._read_from = counting  # type: ignore[method-assign]
    try:
        assert await reader.read(0, 4) == [b"e%d" % i for i in range(5)]
    finally:
        type(reader)._read_from = read_from  # type: ignore[method-assign]
    assert reads == 0

    # A client asking for more than the bookie gives gets the bookie's bound.
    await writer.append_many([b"x" * 1000] * 100)
    raw = BookieClient(bookie.bookie_id, bookie.address, FAST_CLIENT)
    try:
        # The bookie learns the last LAC of the batch from a later add or the quiet-LAC
        # message, not with the acknowledgement: wait for it with bounded long polls.
        lac = 4
        for _ in range(20):  # each long poll lasts at most 1 s
            if lac >= 104:
                break
            polled = await raw.read_lac(
                pb.ReadLacRequest(ledger_id=writer.ledger_id, previous_lac=lac, timeout_ms=1000)
            )
            lac = max(lac, polled.last_add_confirmed)
        assert lac == 104
        answer = await raw.read_lac(
            pb.ReadLacRequest(ledger_id=writer.ledger_id, previous_lac=-1,
                              piggyback_entry=True, piggyback_max_entries=2**32 - 1)
        )  # fmt: skip
    finally:
        await raw.close()
    assert answer.next_entry.entry_id == 0
    assert len(answer.more_entries) == MAX_PIGGYBACK_ENTRIES
    assert [e.entry_id for e in answer.more_entries] == list(range(1, 65))


async def test_a_quiet_writers_lac_goes_out_after_the_sends_it_acknowledged_complete(
    cluster, monkeypatch
):
    """The explicit LAC of a writer gone quiet costs the loop a stream write per bookie: it
    comes after the completions of the acknowledged send (the producer's batch, the
    caller's task), which it used to delay at every message of a low-rate writer."""
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("lac-after")
    await producer.send(b"warm-up")  # connections, the ledger
    order: list[str] = []
    send_lac = BookieClient.send_lac

    def recorded(self, request):  # type: ignore[no-untyped-def]
        order.append("lac")
        send_lac(self, request)

    monkeypatch.setattr(BookieClient, "send_lac", recorded)
    # Each send alone: nothing in flight, so each gets its LAC (the first after the 2 ms a
    # send right after another waits; the others at once, which is what is checked).
    for i in range(3):
        await producer.send(b"m%d" % i)
        order.append("sent")
        for _ in range(5000):  # bounded polling: a few loop turns (2 ms after a tight send)
            if order.count("lac") >= 3 * (i + 1):
                break
            await asyncio.sleep(0.001)
    assert order == (["sent"] + ["lac"] * 3) * 3, order
    await producer.close()
