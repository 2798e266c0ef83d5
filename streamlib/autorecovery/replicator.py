"""The replication worker: repairs under-replicated ledgers one at a time.

For each marked ledger it takes the ledger's lock (an ephemeral node, so a dead
worker frees it and two workers never repair one ledger at once), asks
streamlib.protocol.replication what to do, copies each bad fragment's entries from
surviving replicas (digests verified by the read) to a replacement bookie with
recovery adds, CASes the swapped ensemble into the metadata, and finally clears the
mark. Failures worth retrying (is_retriable: the error's class says) are retried with
backoff (streamlib.retry.REPLICATION); then the lock is released and the mark stays.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

from bookie.wire import bookie_pb2 as pb
from metadata.errors import BadVersionError, MetadataError
from metadata.errors import NoSuchLedgerError as MetadataNoSuchLedger
from metadata.services.underreplication import UnderReplicationManager
from streamlib.autorecovery.errors import ReplicationCopyError
from streamlib.client import Client
from streamlib.ledger.bookie_client import AddHandler
from streamlib.ledger.codec import metadata_from_pb, metadata_to_pb
from streamlib.ledger.handles import ReadHandle
from streamlib.protocol import LedgerMetadata
from streamlib.protocol.actions import EntryData, rewrite_flags
from streamlib.protocol.digest import master_key
from streamlib.protocol.errors import StreamlibError
from streamlib.protocol.replication import (
    FragmentCopy,
    choose_replacement,
    plan_replication,
    still_referenced,
)
from streamlib.retry import REPLICATION, RetryPolicy

log = logging.getLogger(__name__)

COPY_BATCH_ENTRIES = 256
COPY_WRITES_IN_FLIGHT = 4


@dataclass
class WorkerConfig:
    grace_period_s: float = 30.0
    retry: RetryPolicy = REPLICATION  # per ledger and pass, before the lock is released


@dataclass(frozen=True)
class Outcome:
    """What one pass over a ledger achieved."""

    ledger_id: int
    status: str  # "done", "locked" (another worker has it), "waiting" (writer's grace)
    copied_entries: int = 0
    wait_until_ms: int | None = None


class ReplicationWorker:
    def __init__(self, client: Client, config: WorkerConfig | None = None) -> None:
        self.client = client
        self.config = config or WorkerConfig()
        self.underreplication = UnderReplicationManager(client.store)
        self.copied_entries = 0
        self.ledgers_done = 0

    async def run_once(self) -> list[Outcome]:
        """One pass over every marked ledger nobody else is repairing."""
        outcomes = []
        for record in await self.underreplication.list():
            if await self.underreplication.is_locked(record.ledger_id):
                continue
            try:
                outcomes.append(await self.repair(record.ledger_id))
            except (StreamlibError, MetadataError) as exc:
                # The mark stays: a later pass (of any worker) tries again.
                log.warning("ledger %d: replication failed, will retry: %s", record.ledger_id, exc)
        return outcomes

    async def repair(self, ledger_id: int) -> Outcome:
        """Lock the ledger, repair it with retries, unlock; the outcome."""
        if not await self.underreplication.try_lock(ledger_id):
            return Outcome(ledger_id, "locked")
        finished = False
        try:
            outcome = await self.config.retry.run(
                f"ledger {ledger_id}: replication", lambda: self._repair_locked(ledger_id)
            )
            finished = outcome.status == "done"
            return outcome
        finally:
            if not finished:
                await self.underreplication.release(ledger_id)

    async def _repair_locked(self, ledger_id: int) -> Outcome:
        copied = 0
        recovered = False
        while True:
            mark = await self.underreplication.get(ledger_id)
            if mark is None:
                await self.underreplication.release(ledger_id)
                return Outcome(ledger_id, "done", copied)
            try:
                md, version = await self._read(ledger_id)
            except MetadataNoSuchLedger:
                await self.underreplication.done(ledger_id)  # deleted: nothing to repair
                return Outcome(ledger_id, "done", copied)
            missing = set(mark.missing_bookies)
            plan = plan_replication(
                md,
                missing,
                now_ms=int(time.time() * 1000),
                marked_ms=mark.marked_ms,
                grace_period_ms=int(self.config.grace_period_s * 1000),
            )
            if plan.recover and recovered:
                # Recovery did not settle the last fragment (an unbounded ledger reopens
                # in a new term): give its writer another grace period.
                wait_until_ms = int((time.time() + self.config.grace_period_s) * 1000)
                return Outcome(ledger_id, "waiting", copied, wait_until_ms)
            if plan.recover:
                recovered = True
                log.info("ledger %d: fencing and recovering (writer's grace is over)", ledger_id)
                await self.client.pool.prepare(md.bookies())
                await self.client.ledgers.recover(md, version)
                continue  # CLOSED now: the last fragment's range is known
            try:
                for copy in plan.copies:
                    copied += await self._copy_and_swap(md, version, copy)
                    md, version = await self._read(ledger_id)
            except BadVersionError:
                continue  # the writer or another repair changed the ledger: plan again
            if plan.wait_until_ms is not None:
                return Outcome(ledger_id, "waiting", copied, plan.wait_until_ms)
            if still_referenced(md, missing):
                continue
            if await self._mark_grew(ledger_id, missing):
                continue  # the auditor added bookies while we worked
            await self.underreplication.done(ledger_id)
            self.ledgers_done += 1
            log.info("ledger %d fully replicated (%d entries copied)", ledger_id, copied)
            return Outcome(ledger_id, "done", copied)

    async def _mark_grew(self, ledger_id: int, missing: Collection[str]) -> bool:
        mark = await self.underreplication.get(ledger_id)
        return mark is not None and not set(mark.missing_bookies) <= set(missing)

    async def _read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        stored, version = await self.client.context.ledgers.read(ledger_id)
        return metadata_from_pb(stored), version

    async def _copy_and_swap(self, md: LedgerMetadata, version: int, copy: FragmentCopy) -> int:
        """Copy one lost bookie's entries of one fragment, then CAS the swap."""
        fragment = md.fragments[copy.fragment_index]
        writable = [c.bookie_id for c in await self.client.pool.writable()]
        replacement = choose_replacement(writable, fragment.ensemble, md.ledger_id)
        await self.client.pool.prepare([*md.bookies(), replacement])
        # The ledger's key (from its stored secret: the replicator runs with the writers'
        # metadata identity): recovery adds must carry the master key the bookies hold.
        material = await self.client.ledgers.material(md, None)
        reader = ReadHandle(md, version, self.client.context, lac=-1, material=material)
        entries = list(copy.entries)
        # Reading the next batch overlaps writing the previous ones (a few in flight).
        writes: list[asyncio.Task[None]] = []
        try:
            for start in range(0, len(entries), COPY_BATCH_ENTRIES):
                chunk = entries[start : start + COPY_BATCH_ENTRIES]
                wanted = set(chunk)
                read = await reader.read_entries(chunk[0], chunk[-1])
                batch = [e for e in read if e.entry_id in wanted]
                writes.append(asyncio.create_task(self._write(md, material, replacement, batch)))
                if len(writes) >= COPY_WRITES_IN_FLIGHT:
                    await writes.pop(0)
            for write in writes:
                await write
        finally:
            for write in writes:
                write.cancel()
            await asyncio.gather(*writes, return_exceptions=True)
        updated = md.with_fragment_bookie_replaced(copy.fragment_index, copy.bookie, replacement)
        await self.client.context.ledgers.write(md.ledger_id, metadata_to_pb(updated), version)
        self.copied_entries += len(entries)
        log.info(
            "ledger %d fragment %d: %s -> %s (%d entries)",
            md.ledger_id,
            copy.fragment_index,
            copy.bookie,
            replacement,
            len(entries),
        )
        return len(entries)

    async def _write(
        self, md: LedgerMetadata, material: bytes, bookie: str, entries: list[EntryData]
    ) -> None:
        """Recovery-add entries byte for byte (same LAC, length, digest) and wait for
        every answer."""
        if not entries:
            return
        key = master_key(material)
        adds = [
            pb.AddEntry(
                ledger_id=md.ledger_id,
                entry_id=e.entry_id,
                last_add_confirmed=e.last_add_confirmed,
                length=e.length,
                payload=e.payload,
                digest=e.digest,
                master_key=key,
                flags=rewrite_flags(e.flags),
                term=md.term,
            )
            for e in entries
        ]
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        waiting = {e.entry_id for e in entries}
        failures: list[tuple[int, int | None]] = []

        def on_results(results: list[tuple[int, int | None]]) -> None:
            for entry_id, status in results:
                waiting.discard(entry_id)
                if status != pb.OK:
                    failures.append((entry_id, status))
            if not waiting and not done.done():
                done.set_result(None)

        self.client.pool.get(bookie).add(adds, AddHandler(on_results))
        await done
        if failures:
            entry_id, status = failures[0]
            name = "no answer" if status is None else pb.StatusCode.Name(status)
            raise ReplicationCopyError(
                f"ledger {md.ledger_id}: {bookie} refused recovery add of entry {entry_id} "
                f"({name}) and {len(failures) - 1} more"
            )
