"""Nothing waits on a timer when nothing else is coming: a lone message goes at once
(adaptive batching), and a quiet writer's last entry reaches tailing readers without an
explicit-LAC timer (prompt LAC). Behaviour only: the timers are set so long that the old
code would wait out the test's timeout."""

from __future__ import annotations

import asyncio

import pytest

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
