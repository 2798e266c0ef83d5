"""Replication workers against real bookies: the per-ledger lock keeps them apart."""

from __future__ import annotations

import asyncio
import collections

from streamlib.autorecovery.auditor import Auditor
from streamlib.autorecovery.replicator import ReplicationWorker
from streamlib.client import Client
from streamlib.ledger.codec import metadata_from_pb, metadata_to_pb
from streamlib.protocol import LedgerMetadata
from streamlib.protocol.replication import FragmentCopy
from tests.autorecovery.conftest import RecoveryCluster, assert_fully_replicated
from tests.autorecovery.test_autorecovery import write_ledger


class ObservedWorker(ReplicationWorker):
    """A real worker that records which ledgers it is copying, to catch overlaps."""

    def __init__(
        self, name: str, client: Client, active: dict[int, set[str]], overlaps: list[object]
    ) -> None:
        super().__init__(client)
        self.name = name
        self.active = active  # shared by the workers under test: who copies which ledger
        self.overlaps = overlaps

    async def _copy_and_swap(self, md: LedgerMetadata, version: int, copy: FragmentCopy) -> int:
        holders = self.active.setdefault(md.ledger_id, set())
        holders.add(self.name)
        if len(holders) > 1:
            self.overlaps.append((md.ledger_id, set(holders)))
        try:
            await asyncio.sleep(0.05)  # widen the window another worker would race into
            return await super()._copy_and_swap(md, version, copy)
        finally:
            holders.discard(self.name)


async def test_two_workers_never_replicate_the_same_ledger_at_once(
    rcluster: RecoveryCluster,
) -> None:
    rcluster.start_bookies(4)
    client = await rcluster.client()
    written = [await write_ledger(client, 12, qw=3) for _ in range(6)]
    # The bookie most of them name (placement, avoiding a bookie slow to start, may
    # leave any one of the four out of all six).
    named: collections.Counter[str] = collections.Counter()
    for ledger_id, _ in written:
        named.update((await client.ledgers.metadata(ledger_id)).bookies())
    victim = named.most_common(1)[0][0]
    rcluster.by_id(victim).kill()
    marked = await Auditor(client).mark_ledgers_on([victim])
    assert marked
    active: dict[int, set[str]] = {}
    overlaps: list[object] = []
    workers = [
        ObservedWorker(name, await rcluster.client(), active, overlaps) for name in ("w1", "w2")
    ]

    async def drain(worker: ReplicationWorker) -> None:
        while await rcluster.marks():
            await worker.run_once()

    await asyncio.wait_for(asyncio.gather(*(drain(w) for w in workers)), 60)
    assert overlaps == []
    assert sum(w.ledgers_done for w in workers) == len(marked)
    assert await rcluster.ledgers_naming(victim) == []
    for ledger_id, expected in written:
        await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)


async def test_a_locked_ledger_is_left_alone_until_its_holder_dies(
    rcluster: RecoveryCluster,
) -> None:
    rcluster.start_bookies(4)
    client = await rcluster.client()
    ledger_id, expected = await write_ledger(client, 10, qw=3)
    victim = sorted((await client.ledgers.metadata(ledger_id)).bookies())[0]
    rcluster.by_id(victim).kill()
    await Auditor(client).mark_ledgers_on([victim])
    holder = ReplicationWorker(await rcluster.client())
    other = ReplicationWorker(await rcluster.client())
    assert await holder.underreplication.try_lock(ledger_id)
    outcome = await other.repair(ledger_id)
    assert outcome.status == "locked" and outcome.copied_entries == 0
    assert await other.run_once() == []  # the pass skips it too
    assert victim in (await client.ledgers.metadata(ledger_id)).bookies()
    # The holder's session ends (a crashed worker): its ephemeral lock goes with it.
    await holder.client.close()
    rcluster.clients.remove(holder.client)
    outcome = await other.repair(ledger_id)
    assert outcome.status == "done" and outcome.copied_entries == 10
    await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)


async def test_the_check_finds_a_live_bookie_that_lacks_its_entries(
    rcluster: RecoveryCluster,
) -> None:
    rcluster.start_bookies(4)
    client = await rcluster.client()
    ledger_id, expected = await write_ledger(client, 16, qw=2)
    stored, version = await client.context.ledgers.read(ledger_id)
    md = metadata_from_pb(stored)
    outsider = next(b.bookie_id for b in rcluster.bookies if b.bookie_id not in md.bookies())
    # The metadata names a live bookie that never received the ledger (as after a disk
    # was replaced): nothing in the registry changes, only the check can notice.
    swapped = md.with_fragment_bookie_replaced(0, md.fragments[0].ensemble[1], outsider)
    await client.context.ledgers.write(ledger_id, metadata_to_pb(swapped), version)
    assert await Auditor(client).check_all() == {ledger_id: [outsider]}
    outcome = await ReplicationWorker(client).repair(ledger_id)
    assert outcome.status == "done"
    assert await Auditor(client).check_all() == {}
    await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)
