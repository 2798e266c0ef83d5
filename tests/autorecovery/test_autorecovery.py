"""Auto-recovery on real processes: bookies, auto-recovery daemons, a sqlite store."""

from __future__ import annotations

import asyncio
import time

from bookie.launcher import BookieProcess
from bookie.wire import bookie_pb2 as pb
from streamlib.client import Client
from streamlib.stream.positions import EARLIEST
from tests.autorecovery.conftest import (
    RecoveryCluster,
    assert_fully_replicated,
    equals,
    is_empty,
    wait_for,
)

FAST = ["--lost-bookie-delay", "0.5", "--grace-period", "2", "--check-interval", "0"]


async def write_ledger(
    client: Client, entries: int, *, e: int = 3, qw: int = 2, close: bool = True
) -> tuple[int, dict[int, bytes]]:
    """A ledger of `entries` entries (Qa 2), returned once every bookie of each entry's
    write set holds it: the tests start from a fully replicated ledger. (An add is
    acknowledged by two bookies; the third copy may still be on its way -- a bookie slow
    to start takes seconds -- and the tests must not race it.)"""
    writer = await client.ledgers.create(e, qw, min(2, qw), password=b"secret")
    payloads = [
        f"ledger {writer.ledger_id} entry {i} ".encode() * (1 + i % 7) for i in range(entries)
    ]
    ids = await writer.append_many(payloads)
    if close:
        await writer.close()
    md = writer.metadata

    async def missing() -> list[tuple[str, int]]:
        await client.pool.prepare(md.bookies())
        lacking = []
        for entry_id in ids:
            for bookie in md.write_set_bookies(entry_id):
                answer = await client.pool.get(bookie).read(
                    pb.ReadRequest(
                        ledger_id=md.ledger_id, first_entry_id=entry_id, last_entry_id=entry_id
                    )
                )
                if answer.status != pb.OK or answer.results[0].status != pb.OK:
                    lacking.append((bookie, entry_id))
        return lacking

    await wait_for(lambda: is_empty(missing()), "every copy of every entry")
    return writer.ledger_id, dict(zip(ids, payloads, strict=True))


async def test_sigkilled_bookie_is_re_replicated_for_closed_and_open_ledgers(
    any_rcluster: RecoveryCluster,
) -> None:
    rcluster = any_rcluster
    # Every ledger is written to the first three bookies; the fourth joins afterwards,
    # the only possible replacement.
    rcluster.start_bookies(3)
    client = await rcluster.client()
    written = [
        await write_ledger(client, 40, qw=2),
        await write_ledger(client, 25, qw=3),
        await write_ledger(client, 30, qw=2, close=False),  # an idle writer keeps it OPEN
    ]
    # A writer that keeps going: its ensemble change seals the fragment on the victim.
    active = await client.ledgers.create(3, 2, 2, password=b"secret")
    before = [f"active {i}".encode() for i in range(15)]
    await active.append_many(before)
    rcluster.start_bookies(1)
    victim = rcluster.bookies[1].bookie_id
    # Two nodes: both work (the per-ledger lock keeps them apart), one audits.
    rcluster.start_daemon("node-a", *FAST)
    rcluster.start_daemon("node-b", *FAST)
    await wait_for(rcluster.auditor, "an auditor to be elected")
    rcluster.by_id(victim).kill()
    after = [f"active {i}".encode() for i in range(15, 30)]
    await active.append_many(after)
    await active.close()
    written.append((active.ledger_id, dict(enumerate(before + after))))
    await wait_for(
        lambda: is_empty(rcluster.ledgers_naming(victim)), f"no ledger to name {victim}", 90
    )
    await wait_for(lambda: is_empty(rcluster.marks()), "every mark to be cleared")
    reader = await rcluster.client()
    for ledger_id, expected in written:
        md = await reader.ledgers.metadata(ledger_id)
        assert victim not in md.bookies()
        await assert_fully_replicated(reader, md, expected)
        # And a plain reader sees every acknowledged entry.
        handle = await reader.ledgers.open(ledger_id, password=b"secret")
        assert await handle.read(0, max(expected)) == [expected[i] for i in sorted(expected)]


async def test_auditor_death_hands_over_to_another_node(any_rcluster: RecoveryCluster) -> None:
    rcluster = any_rcluster
    rcluster.start_bookies(4)
    client = await rcluster.client()
    ledger_id, expected = await write_ledger(client, 20)
    first = rcluster.start_daemon("node-1", *FAST)
    await wait_for(lambda: equals(rcluster.auditor(), "node-1"), "node-1 to be the auditor")
    rcluster.start_daemon("node-2", *FAST)
    first.kill()
    await wait_for(lambda: equals(rcluster.auditor(), "node-2"), "node-2 to take over", 30)
    # The new auditor does the job: a lost bookie gets its ledger repaired.
    victim = sorted((await client.ledgers.metadata(ledger_id)).bookies())[0]
    rcluster.by_id(victim).kill()
    await wait_for(lambda: is_empty(rcluster.ledgers_naming(victim)), "the ledger repaired")
    await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)


async def test_bookie_back_within_the_delay_cancels_the_audit(rcluster: RecoveryCluster) -> None:
    delay_s = 8.0  # room for a bookie restart on a busy machine
    rcluster.start_bookies(4)
    client = await rcluster.client()
    ledger_id, _ = await write_ledger(client, 10)
    victim_id = sorted((await client.ledgers.metadata(ledger_id)).bookies())[0]
    victim: BookieProcess = rcluster.by_id(victim_id)
    daemon = rcluster.start_daemon(
        "node", "--lost-bookie-delay", str(delay_s), "--check-interval", "0"
    )
    await wait_for(rcluster.auditor, "the auditor")
    lost_at = time.monotonic()
    victim.stop()  # graceful: unregisters at once
    await wait_for(
        lambda: _logged(daemon.log_text, f"bookie {victim_id} lost"), "the auditor to see it"
    )
    victim.start()
    await wait_for(
        lambda: _logged(daemon.log_text, f"bookie {victim_id} came back"), "the cancellation"
    )
    assert time.monotonic() - lost_at < delay_s, "restart too slow for this test's delay"
    # Past the delay, nothing was marked and the ledger still names its bookie. (Waiting
    # out the delay is the point of the check: an absence has no event to wait on.)
    await asyncio.sleep(max(0.0, lost_at + delay_s + 1.0 - time.monotonic()))
    assert await rcluster.marks() == []
    assert victim_id in (await client.ledgers.metadata(ledger_id)).bookies()
    assert "marked" not in daemon.log_text()


async def _logged(text: object, needle: str) -> bool:
    return needle in text()  # type: ignore[operator]


async def test_the_auditor_compacts_a_stream_past_its_threshold_and_retention_follows(
    rcluster: RecoveryCluster,
) -> None:
    """Compaction by policy (the uncompacted backlog past N bytes), and retention
    `compacted`: the changelog keeps its latest values, not its history."""
    rcluster.start_bookies(3)
    client = await rcluster.client()
    await client.streams.create(
        "prefs", rollover={"max_entries": 4}, retention={"compacted": True},
        compaction_threshold_bytes=300,
    )  # fmt: skip
    producer = await client.create_producer("prefs", batching_max_publish_delay_ms=0)
    latest = {}
    for i in range(48):
        key, value = f"user{i % 6}", b"theme-%d" % i
        await producer.send(value, key=key)
        latest[key] = value
    await producer.close()
    before = (await client.streams.read("prefs"))[0]
    assert len(before.ledgers) >= 5
    rcluster.start_daemon("keeper", *FAST, "--compaction-interval", "0.5",
                          "--retention-interval", "0.5")  # fmt: skip

    async def compacted_and_trimmed() -> bool:
        md, _ = await client.streams.read("prefs")
        return md.HasField("compaction") and md.compaction.keys == 6 and len(md.ledgers) <= 2

    await wait_for(compacted_and_trimmed, "the compaction and the retention that follows it")
    reader = await client.create_reader("prefs", EARLIEST, read_compacted=True)
    found = {}
    while await reader.has_message_available():
        message = await reader.read_next(timeout=30)
        found[message.key] = message.data
    await reader.close()
    assert found == latest
    gone = {i.ledger_id for i in before.ledgers} - set(await client.ledgers.list())
    assert gone  # (deleted, not only unlisted)


async def test_the_auditor_applies_retention_to_idle_streams(rcluster: RecoveryCluster) -> None:
    rcluster.start_bookies(3)
    client = await rcluster.client()
    # Kept 2 s after their close: what the writer's own trims (on roll) left for later.
    retention = {"time_ms": 2000}
    await client.streams.create("idle", rollover={"max_entries": 2}, retention=retention)
    producer = await client.create_producer("idle", batching_max_publish_delay_ms=0)
    for i in range(12):
        await producer.send(b"%d" % i)
    await producer.close()  # nobody writes to the stream any more

    async def listed() -> list[int]:
        md, _ = await client.streams.read("idle")
        return [info.ledger_id for info in md.ledgers]

    ledgers = await listed()
    assert len(ledgers) >= 3
    # retention is all the daemon does here (its other loops have nothing to do)
    rcluster.start_daemon("keeper", *FAST, "--retention-interval", "0.5")
    # Everything but the current ledger goes (no cursor needs anything): first from the
    # list (the CAS), then the ledgers themselves.
    await wait_for(lambda: equals(listed(), ledgers[-1:]), "retention of the idle stream")

    async def deleted() -> bool:
        return not set(ledgers[:-1]) & set(await client.ledgers.list())

    await wait_for(deleted, "the trimmed ledgers to be deleted")
    assert ledgers[-1] in await client.ledgers.list()
