"""A bookie reports an explicit LAC only up to the entries it holds (bookie/ledger_rules.py),
so readers must find the LAC where it lives after a fragment roll to fresh bookies."""

from __future__ import annotations

import asyncio


async def _ledger_rolled_to_fresh_bookies(client, explicit_lac_interval_s: float | None = None):
    """An unbounded E=Qw=Qa=2 ledger with 10 entries whose last fragment (no entry yet)
    shares no bookie with the first one (6 bookies: placement picks; retried until so)."""
    for _ in range(30):
        writer = await client.ledgers.create(2, 2, 2, unbounded=True)
        if explicit_lac_interval_s is not None:
            writer._explicit_lac_interval_s = explicit_lac_interval_s
        await writer.append_many([b"a%d" % i for i in range(10)])
        before = writer.metadata
        writer.roll_fragment()
        for _ in range(1000):  # bounded: the roll's CAS lands within a few round trips
            if writer.metadata is not before:
                break
            await asyncio.sleep(0.005)
        frags = writer.metadata.fragments
        if len(frags) > 1 and not set(frags[0].ensemble) & set(frags[-1].ensemble):
            return writer
        await writer.close()
    raise AssertionError("placement never rolled to fresh bookies")


async def test_a_reader_opened_after_a_roll_to_fresh_bookies_sees_the_lac(cluster) -> None:
    cluster.start_bookies(6)
    client, other = await cluster.client(), await cluster.client()
    writer = await _ledger_rolled_to_fresh_bookies(client)
    lac = await writer.release()  # publishes LAC 9: the new fragment's bookies hold nothing
    assert lac == 9
    reader = await other.ledgers.open(writer.ledger_id, recover=False)
    assert await reader.read_last_add_confirmed() == 9
    assert await reader.read(0, 9) == [b"a%d" % i for i in range(10)]


async def test_a_tailing_reader_crosses_a_roll_to_fresh_bookies(cluster) -> None:
    cluster.start_bookies(6)
    client, other = await cluster.client(), await cluster.client()
    # A slow explicit-LAC timer stands for "the roll was faster than the timer": the old
    # fragment's bookies never hear of a LAC past the entries' piggybacked ones.
    writer = await _ledger_rolled_to_fresh_bookies(client, explicit_lac_interval_s=3.0)
    reader = await other.ledgers.open(writer.ledger_id, recover=False)
    await writer.append_many([b"c%d" % i for i in range(10)])
    lac = await writer.release()
    seen = []
    for _ in range(20):  # bounded: each long poll lasts at most 1 s
        if reader.last_add_confirmed >= lac:
            break
        await reader.wait_for_more(reader.last_add_confirmed + 1, 1.0)
        seen.append(reader.last_add_confirmed)
    assert reader.last_add_confirmed == lac, seen
