"""The auditor: finds under-replicated ledgers and marks them.

Only the elected auditor runs :meth:`Auditor.run`. It watches the bookie registry; a
bookie that disappears is given ``lost_bookie_delay_s`` to come back (a restart, a
brief session loss) before every ledger with a fragment on it is marked. Every
``check_interval_s`` it also checks every ledger: a fragment on an unregistered bookie,
or a live bookie that lacks the entries it should hold, gets the ledger marked.
:meth:`check_all` is also what ``streamlib admin autorecovery audit-now`` runs.

Streams are looked after here too, as Pulsar's brokers do on a timer: every
``retention_interval_s`` each stream's retention and the sweep of leaked ledgers, and
every ``compaction_interval_s`` the compaction of each stream whose rolled ledgers past
its compaction horizon passed its threshold (streamlib.protocol.compaction).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from bookie.wire import bookie_pb2 as pb
from metadata.errors import MetadataError
from metadata.errors import NoSuchLedgerError as MetadataNoSuchLedger
from metadata.services.bookies import BookieRegistry
from metadata.services.underreplication import UnderReplicationManager
from streamlib.client import Client
from streamlib.ledger.codec import metadata_from_pb
from streamlib.protocol import LedgerMetadata
from streamlib.protocol.compaction import should_compact
from streamlib.protocol.errors import BookieUnavailableError, StreamlibError
from streamlib.protocol.replication import (
    FragmentRange,
    entries_on_bookie,
    fragment_ranges,
    still_referenced,
)

log = logging.getLogger(__name__)

LEADER_CHECK_S = 5.0


@dataclass
class AuditorConfig:
    lost_bookie_delay_s: float = 30.0
    check_interval_s: float = 3600.0  # 0 disables the periodic check
    # Stream retention for every stream, idle ones included (writers also apply it when
    # they roll), and the sweep of leaked ledgers; 0 disables it.
    retention_interval_s: float = 300.0
    leak_grace_s: float = 300.0
    # Compaction of the streams past their compaction threshold (Pulsar's compaction
    # monitor: 60 s); 0 disables it.
    compaction_interval_s: float = 60.0


class Auditor:
    def __init__(self, client: Client, config: AuditorConfig | None = None) -> None:
        self.client = client
        self.config = config or AuditorConfig()
        self.registry: BookieRegistry = client.registry
        self.underreplication = UnderReplicationManager(client.store)
        self.pending_lost: dict[str, asyncio.Task[None]] = {}
        self._known: set[str] = set()  # bookies whose loss would be news
        self.checks = 0
        self.retention_rounds = 0
        self.compaction_rounds = 0

    # -- one-shot audits (also used by the admin commands) ------------------------------

    async def all_ledgers(self) -> list[tuple[LedgerMetadata, int]]:
        found = []
        for ledger_id in await self.client.context.ledgers.list():
            try:
                stored, version = await self.client.context.ledgers.read(ledger_id)
            except MetadataNoSuchLedger:
                continue  # deleted meanwhile
            found.append((metadata_from_pb(stored), version))
        return found

    async def mark_ledgers_on(self, bookies: Collection[str]) -> list[int]:
        """Mark every ledger with a fragment on one of `bookies`; the marked ids."""
        marked = []
        for md, _ in await self.all_ledgers():
            on = still_referenced(md, bookies)
            if on:
                await self.underreplication.mark(md.ledger_id, sorted(on))
                marked.append(md.ledger_id)
        if marked:
            log.warning("marked %d ledgers under-replicated (bookies %s)", len(marked), bookies)
        return marked

    async def check_all(self, skip: Collection[str] = ()) -> dict[int, list[str]]:
        """Check every ledger's fragments against the live bookies (probing what each
        should hold) and mark what is missing; {ledger id: missing bookies}. Bookies
        in `skip` (lost, still within their delay) are left alone."""
        self.checks += 1
        live = {info.bookie_id for info in await self.registry.list()}
        found: dict[int, list[str]] = {}
        for md, _ in await self.all_ledgers():
            missing: set[str] = set()
            for fragment in fragment_ranges(md):
                for bookie in fragment.ensemble:
                    if bookie in skip or bookie in missing:
                        continue
                    if bookie not in live or not await self._holds(md, fragment, bookie):
                        missing.add(bookie)
            if missing:
                await self.underreplication.mark(md.ledger_id, sorted(missing))
                found[md.ledger_id] = sorted(missing)
        if found:
            log.warning("check: %d ledgers under-replicated: %s", len(found), found)
        return found

    async def _holds(self, md: LedgerMetadata, fragment: FragmentRange, bookie: str) -> bool:
        """Probe a live bookie for the first and last entry it should hold of a sealed
        fragment. Only a clean negative counts as missing: an unreachable bookie is
        the registry's business."""
        if not fragment.is_sealed or fragment.is_empty:
            return True
        entries = entries_on_bookie(md, fragment, bookie)
        if not entries:
            return True
        await self.client.pool.prepare([bookie])
        client = self.client.pool.get(bookie)
        for entry_id in {entries[0], entries[-1]}:
            request = pb.ReadRequest(
                ledger_id=md.ledger_id, first_entry_id=entry_id, last_entry_id=entry_id
            )
            try:
                response = await client.read(request)
            except BookieUnavailableError:
                return True
            if response.status == pb.NO_SUCH_LEDGER:
                return False
            if response.status == pb.OK and any(
                r.status == pb.NO_SUCH_ENTRY for r in response.results
            ):
                return False
        return True

    async def apply_retention(self) -> dict[str, list[int]]:
        """Apply every stream's retention now (ledgers, or the fragments of an unbounded
        stream's ledger) and sweep leaked ledgers. Returns {stream: ledgers deleted},
        with the swept leaks under "" . A stream that fails is logged and skipped."""
        streams = self.client.streams
        done: dict[str, list[int]] = {}
        for name in await streams.list():
            try:
                deleted = await streams.trim(name)
            except (StreamlibError, MetadataError) as exc:
                log.warning("retention of stream %s failed: %s", name, exc)
                continue
            if deleted:
                done[name] = deleted
        swept = await streams.sweep(grace_s=self.config.leak_grace_s)
        if swept:
            done[""] = swept
        if done:
            log.info("retention: %s", done)
        self.retention_rounds += 1
        return done

    async def apply_compaction(self) -> dict[str, int]:
        """Compact every stream whose backlog past its horizon passed its compaction
        threshold (compaction.should_compact). Returns {stream: view ledger} of those
        compacted; a stream that fails (another compactor's view came first, a bookie
        out) is logged and tried again next round."""
        streams = self.client.streams
        done: dict[str, int] = {}
        for name in await streams.list():
            try:
                md, _ = await streams.read(name)
                threshold = md.compaction_threshold_bytes
                if not threshold:
                    continue
                backlog = await streams.compaction_backlog(name)
                if not should_compact(threshold, backlog):
                    continue
                result = await streams.compact(name)
            except (StreamlibError, MetadataError) as exc:
                log.warning("compaction of stream %s failed: %s", name, exc)
                continue
            if result.compacted:
                done[name] = result.ledger_id
        if done:
            log.info("compaction: %s", done)
        self.compaction_rounds += 1
        return done

    # -- the elected auditor's loop ------------------------------------------------------

    async def run(self, still_leader: Callable[[], bool] = lambda: True) -> None:
        """Audit until cancelled or until still_leader() says the caller lost the
        election (checked on every event and at least every LEADER_CHECK_S)."""
        watch = self.registry.watch()
        try:
            # Bookies that vanished before this auditor was elected are only known
            # from the ledgers that still name them.
            self._known = {b for md, _ in await self.all_ledgers() for b in md.bookies()}
            next_check = time.monotonic() + self.config.check_interval_s
            next_retention = time.monotonic() + self.config.retention_interval_s
            next_compaction = time.monotonic() + self.config.compaction_interval_s
            while still_leader():
                live = {info.bookie_id for info in await self.registry.list()}
                for bookie in live & set(self.pending_lost):
                    log.info("bookie %s came back within the delay: audit cancelled", bookie)
                    self.pending_lost.pop(bookie).cancel()
                for bookie in self._known - live - set(self.pending_lost):
                    log.info(
                        "bookie %s lost; marking its ledgers in %.1fs unless it returns",
                        bookie,
                        self.config.lost_bookie_delay_s,
                    )
                    self.pending_lost[bookie] = asyncio.create_task(self._lost(bookie))
                self._known = live | set(self.pending_lost)
                if self.config.check_interval_s > 0 and time.monotonic() >= next_check:
                    await self.check_all(skip=set(self.pending_lost))
                    next_check = time.monotonic() + self.config.check_interval_s
                if self.config.retention_interval_s > 0 and time.monotonic() >= next_retention:
                    await self.apply_retention()
                    next_retention = time.monotonic() + self.config.retention_interval_s
                if self.config.compaction_interval_s > 0 and time.monotonic() >= next_compaction:
                    await self.apply_compaction()
                    next_compaction = time.monotonic() + self.config.compaction_interval_s
                timeout = LEADER_CHECK_S
                if self.config.check_interval_s > 0:
                    timeout = min(timeout, max(0.0, next_check - time.monotonic()))
                if self.config.retention_interval_s > 0:
                    timeout = min(timeout, max(0.0, next_retention - time.monotonic()))
                if self.config.compaction_interval_s > 0:
                    timeout = min(timeout, max(0.0, next_compaction - time.monotonic()))
                try:
                    await watch.next(timeout)
                except TimeoutError:
                    pass  # time for the periodic check, or to look at the leadership
        finally:
            for task in self.pending_lost.values():
                task.cancel()
            await asyncio.gather(*self.pending_lost.values(), return_exceptions=True)
            self.pending_lost.clear()
            await watch.close()

    async def _lost(self, bookie: str) -> None:
        await asyncio.sleep(self.config.lost_bookie_delay_s)  # the delay itself, a timer
        if await self.registry.get(bookie) is None:
            await self.mark_ledgers_on([bookie])
            self._known.discard(bookie)  # handled: only its return makes it news again
        self.pending_lost.pop(bookie, None)
