"""Ledger storage: journal + write cache + entry logs + index, and per-ledger state.

The shape is BookKeeper's DbLedgerStorage. An add is checked against the ledger's
state (master key, fence, term), appended to the journal, and once its commit group
is durable the journal's writer task applies the group here: the entries enter the
write cache (which serves reads) and piggybacked LACs advance, waking long polls.
A background flush moves the cache to an entry log (one write, one fsync) and the
index (one synced LMDB transaction), then advances the journal checkpoint mark.

State changes that must be durable before their answer (a fence, a term adopted by a
read, an explicit LAC) are written to the index synchronously. State packed into a
transaction is always read from the live objects INSIDE that transaction, so a
flush racing a fence can never write back an older, unfenced copy.

Ordering of a TRUNCATE entry t: applied in journal order, it drops the ledger's
cached entries above t at once and queues the index deletion behind the flush lock
(asyncio.Lock is FIFO), so it runs before any later flush and before the checkpoint
passes the truncate record; until then reads treat indexed entries above t as gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import lmdb

from bookie.entrylog import EntryLogger
from bookie.errors import (
    InvalidTermError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadOnlyError,
    StorageIOError,
    TooManyRequestsError,
    UnauthorizedError,
)
from bookie.failpoints import crash_if
from bookie.index import LedgerIndex, LedgerState
from bookie.journal import CommitHook, Journal, JournalPosition
from bookie.records import (
    FRAME_SIZE,
    EntryHeader,
    StoredEntry,
    decode_entry,
    encode_entry,
    frame_header,
)
from bookie.wire import bookie_pb2 as pb

log = logging.getLogger(__name__)

Key = tuple[int, int]
# An entry's header, its record's frame header and body (the journal's bytes, reused by
# the flush; kept in two pieces so the hot path never concatenates a payload).
Cached = tuple[EntryHeader, bytes, bytes]


@dataclass(frozen=True)
class GarbageCollected:
    deleted: list[int]  # ledgers whose local data was deleted (their metadata is gone)
    trimmed: dict[int, int]  # ledger -> entries deleted below its first listed entry


def cached_entry(e: StoredEntry) -> Cached:
    """The cache form of a whole entry (for replay tools and tests)."""
    body = encode_entry(e)[FRAME_SIZE:]
    header = EntryHeader(
        e.ledger_id, e.entry_id, e.last_add_confirmed, e.flags, e.term, e.master_key
    )
    return header, frame_header(body), body


class LedgerStorage:
    def __init__(
        self,
        journal_dir: Path,
        data_dir: Path,
        *,
        flush_interval_s: float = 1.0,
        flush_bytes: int = 64 << 20,
        journal_max_file_bytes: int = 128 << 20,
        entrylog_max_file_bytes: int = 512 << 20,
        on_commit: CommitHook | None = None,
    ) -> None:
        self.journal = Journal(
            journal_dir,
            max_file_bytes=journal_max_file_bytes,
            on_commit=on_commit,
            on_durable=self._apply,  # type: ignore[arg-type]
        )
        self.data_dir = data_dir
        self.flush_interval_s = flush_interval_s
        self.flush_bytes = flush_bytes
        # Refuse adds past this much unflushed data: the client backs off and retries.
        self.max_cache_bytes = 4 * flush_bytes
        self._entrylog_max = entrylog_max_file_bytes
        self.index: LedgerIndex
        self.entrylog: EntryLogger
        self._cache: dict[Key, Cached] = {}
        self._cache_bytes = 0
        self._flushing: dict[Key, Cached] = {}
        self._states: dict[int, LedgerState] = {}
        self._dirty: set[int] = set()
        self._pending_truncates: dict[int, int] = {}
        # Ledger-state changes that fences and term reads wait for: counted in memory,
        # counted again once durable; one persist in flight per ledger.
        self._state_changes: dict[int, int] = {}
        self._durable_changes: dict[int, int] = {}
        self._persisting: dict[int, asyncio.Future[None]] = {}
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._applied = JournalPosition(0, 0)
        self._mark: JournalPosition | None = None
        self._flush_lock = asyncio.Lock()
        self._flush_wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._replaying = False
        self.last_flush_error: BaseException | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> int:
        """Open the stores, replay the journal from its mark, flush; the entries replayed."""
        self.index = LedgerIndex(self.data_dir / "index")
        self.entrylog = EntryLogger(self.data_dir / "ledgers", max_file_bytes=self._entrylog_max)
        self._replaying = True
        replayed = 0
        batch: list[Cached] = []
        for header, record, pos in self.journal.replay():
            batch.append((header, record[:FRAME_SIZE], record[FRAME_SIZE:]))
            replayed += 1
            if len(batch) >= 10_000:
                self._apply(batch, pos)
                batch = []
            self._applied = pos
        if batch:
            self._apply(batch, self._applied)
        self._replaying = False
        self.journal.start()
        self._applied = self.journal.position
        await self.flush()
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop(), name="flush")
        return replayed

    async def close(self) -> None:
        await self.journal.close()
        if self._flusher is not None:
            self._flusher.cancel()
            try:
                await self._flusher
            except asyncio.CancelledError:
                pass
        for task in list(self._background):
            await task
        await self.flush()
        self.entrylog.close()
        self.index.close()

    # -- ledger state -----------------------------------------------------------------

    def state(self, ledger_id: int) -> LedgerState | None:
        st = self._states.get(ledger_id)
        if st is None:
            try:
                st = self.index.get_state(ledger_id)
            except lmdb.Error as e:
                raise StorageIOError(f"ledger {ledger_id}: index unreadable: {e}") from None
            if st is not None:
                self._states[ledger_id] = st
        return st

    def _checked_state(
        self, ledger_id: int, master_key: bytes, term: int, *, create: bool
    ) -> tuple[LedgerState, bool]:
        """The ledger's state after the master-key and term rules; (state, changed)."""
        st = self.state(ledger_id)
        changed = False
        if st is None:
            if not create:
                raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
            st = LedgerState(master_key)
            self._states[ledger_id] = st
            changed = True
        elif st.master_key != master_key:
            raise UnauthorizedError(f"ledger {ledger_id}: master key does not match the ledger's")
        if term:
            if term < st.term:
                raise InvalidTermError(
                    f"ledger {ledger_id}: term {term} is lower than this bookie's term {st.term}",
                    term=st.term,
                )
            if term > st.term:
                st.term = term
                changed = True
        return st, changed

    async def _persist_state(self, ledger_id: int) -> None:
        st = self._states[ledger_id]
        try:
            await asyncio.to_thread(self.index.put_state, ledger_id, st)
        except lmdb.Error as e:
            raise StorageIOError(f"ledger {ledger_id}: could not persist its state: {e}") from None

    async def fence(self, ledger_id: int, master_key: bytes, term: int = 0) -> LedgerState:
        """Fence the ledger (creating it fenced if unknown). Returns once the fence is
        durable AND every add accepted before it is durable and readable, so the
        fencing read's answer (LAC, entries) covers each entry that can still be
        acknowledged."""
        st, changed = self._checked_state(ledger_id, master_key, term, create=True)
        if not st.fenced:
            st.fenced = True  # from here on normal adds are refused
            changed = True
        await self._settle_state(ledger_id, changed)
        return st

    async def adopt_term(self, ledger_id: int, master_key: bytes, term: int) -> LedgerState:
        """Apply the term rule for a recovery read/LAC read without the fence flag (a
        raised term, like a fence, waits for the adds accepted under the old one)."""
        st, changed = self._checked_state(ledger_id, master_key, term, create=False)
        await self._settle_state(ledger_id, changed)
        return st

    async def _settle_state(self, ledger_id: int, changed: bool) -> None:
        """Wait for the adds checked before a state change, then make the state durable;
        return only once every change made so far is on disk. One persist runs at a time
        per ledger, shielded from the callers (a read cancelled by its deadline does not
        cancel it), and a persist that failed is retried by the next caller: a fence is
        never answered while it lives in memory only."""
        if changed:
            self._state_changes[ledger_id] = self._state_changes.get(ledger_id, 0) + 1
        while True:
            task = self._persisting.get(ledger_id)
            if task is None:
                if self._state_changes.get(ledger_id, 0) <= self._durable_changes.get(ledger_id, 0):
                    await self.journal.barrier()
                    return
                task = asyncio.ensure_future(self._barrier_and_persist(ledger_id))
                self._persisting[ledger_id] = task
            await asyncio.shield(task)

    async def _barrier_and_persist(self, ledger_id: int) -> None:
        try:
            await self.journal.barrier()
            changes = self._state_changes.get(ledger_id, 0)
            await self._persist_state(ledger_id)
            self._durable_changes[ledger_id] = max(changes, self._durable_changes.get(ledger_id, 0))
        finally:
            del self._persisting[ledger_id]

    async def write_lac(self, ledger_id: int, master_key: bytes, lac: int, term: int) -> None:
        st, _ = self._checked_state(ledger_id, master_key, term, create=True)
        st.explicit_lac = max(st.explicit_lac, lac)
        await self._persist_state(ledger_id)
        self._wake(ledger_id)

    def lac(self, ledger_id: int) -> int:
        st = self.state(ledger_id)
        if st is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
        return st.lac

    # -- adds -------------------------------------------------------------------------

    def check_add(self, e: EntryHeader, *, read_only: bool) -> None:
        """Apply the add rules (and any term adoption); raises the RequestError to answer."""
        recovery = e.flags & pb.RECOVERY_ADD
        if read_only and not recovery:
            raise ReadOnlyError("this bookie is read-only; normal adds are refused")
        if self._cache_bytes > self.max_cache_bytes:
            raise TooManyRequestsError("the write cache is full; retry after the flush")
        if self.journal.pending_bytes > self.max_cache_bytes:
            raise TooManyRequestsError("the journal is behind; retry after it commits")
        st = self.state(e.ledger_id)
        if st is not None:
            if st.master_key != e.master_key:
                raise UnauthorizedError(
                    f"ledger {e.ledger_id}: master key does not match the ledger's"
                )
            if e.term and e.term < st.term:
                raise InvalidTermError(
                    f"ledger {e.ledger_id}: term {e.term} is lower than this bookie's term {st.term}",
                    term=st.term,
                )
            if st.fenced and not recovery:
                raise LedgerFencedError(f"ledger {e.ledger_id} is fenced on this bookie")
            if e.term > st.term:
                st.term = e.term  # durable with the entry's journal record
        else:
            self._states[e.ledger_id] = LedgerState(e.master_key, term=e.term)
            self._dirty.add(e.ledger_id)

    def submit(
        self, accepted: list[Cached], chunks: list[bytes], nbytes: int
    ) -> asyncio.Future[JournalPosition]:
        """Journal checked entries (``chunks``: their records' bytes, in order); the future
        resolves once they are durable and applied."""
        return self.journal.append(chunks, nbytes, accepted)  # type: ignore[arg-type]

    def _apply(self, items: list[Cached], pos: JournalPosition) -> None:
        """A durable commit group enters the write cache (in journal order)."""
        cache = self._cache
        raised: set[int] = set()
        nbytes = 0
        lid = -1
        st = LedgerState(b"")
        for item in items:
            e = item[0]
            if e.ledger_id != lid:  # batches are mostly one ledger: look its state up once
                lid = e.ledger_id
                st = self._states.get(lid) or self.state(lid) or LedgerState(e.master_key)
                # Absent only on replay, or when the ledger was garbage-collected meanwhile.
                self._states[lid] = st
                self._dirty.add(lid)
            if e.term > st.term:
                st.term = e.term
            if e.flags & pb.TRUNCATE:
                self._truncate(lid, e.entry_id, st)
            cache[(lid, e.entry_id)] = item
            nbytes += FRAME_SIZE + len(item[2])
            if e.last_add_confirmed > st.piggyback_lac:
                st.piggyback_lac = e.last_add_confirmed
                raised.add(lid)
        self._cache_bytes += nbytes
        self._applied = pos
        for lid in raised:
            self._wake(lid)
        if self._cache_bytes >= self.flush_bytes:
            self._flush_wake.set()

    def _truncate(self, ledger_id: int, entry_id: int, st: LedgerState) -> None:
        self._drop_cached(ledger_id, above=entry_id)
        st.piggyback_lac = min(st.piggyback_lac, entry_id)
        st.explicit_lac = min(st.explicit_lac, entry_id)
        if self._replaying:
            self.index.delete_entries(ledger_id, above=entry_id)
            return
        self._pending_truncates[ledger_id] = entry_id
        task = asyncio.get_running_loop().create_task(self._truncate_index(ledger_id, entry_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _drop_cached(self, ledger_id: int, above: int = -1) -> None:
        """Forget cached entries of a ledger with id > ``above`` (rare: truncate and GC)."""
        for cache in (self._cache, self._flushing):
            for key in [k for k in cache if k[0] == ledger_id and k[1] > above]:
                item = cache.pop(key)
                if cache is self._cache:
                    self._cache_bytes -= FRAME_SIZE + len(item[2])

    async def _truncate_index(self, ledger_id: int, entry_id: int) -> None:
        async with self._flush_lock:
            await asyncio.to_thread(self.index.delete_entries, ledger_id, entry_id)
            if self._pending_truncates.get(ledger_id) == entry_id:
                del self._pending_truncates[ledger_id]

    # -- reads ------------------------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int) -> StoredEntry:
        """The stored entry; NoSuchEntry/NoSuchLedger only when truly absent, else IO error."""
        key = (ledger_id, entry_id)
        hit = self._cache.get(key) or self._flushing.get(key)
        if hit is not None:
            return decode_entry(hit[2])
        truncated_at = self._pending_truncates.get(ledger_id)
        if truncated_at is not None and entry_id > truncated_at:
            raise NoSuchEntryError(f"entry {ledger_id}:{entry_id} was truncated")
        try:
            loc = self.index.get(ledger_id, entry_id)
        except lmdb.Error as e:
            raise StorageIOError(f"entry {ledger_id}:{entry_id}: index unreadable: {e}") from None
        if loc is None:
            if self.state(ledger_id) is None:
                raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
            raise NoSuchEntryError(f"entry {ledger_id}:{entry_id} is not on this bookie")
        return self.entrylog.read(*loc)

    def _wake(self, ledger_id: int) -> None:
        for fut in self._waiters.pop(ledger_id, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait_for_lac(self, ledger_id: int, previous_lac: int, timeout_s: float) -> int:
        """The LAC once it passes ``previous_lac``, or the current LAC after the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            lac = self.lac(ledger_id)
            remaining = deadline - time.monotonic()
            if lac > previous_lac or remaining <= 0:
                return lac
            fut = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(ledger_id, []).append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                waiters = self._waiters.get(ledger_id)
                if waiters and fut in waiters:
                    waiters.remove(fut)

    # -- flush --------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._flush_wake.wait(), self.flush_interval_s)
            except TimeoutError:
                pass
            self._flush_wake.clear()
            try:
                await self.flush()
                self.last_flush_error = None
            except OSError as e:
                self.last_flush_error = e
                log.error("flush failed; entries stay in the journal and cache: %s", e)

    async def flush(self) -> None:
        """Write the cache to an entry log + index, then advance the checkpoint mark."""
        async with self._flush_lock:
            if not self._cache and not self._dirty and self._mark == self._applied:
                return
            self._flushing, self._cache = self._cache, {}
            flushed_bytes, self._cache_bytes = self._cache_bytes, 0
            dirty, self._dirty = self._dirty, set()
            mark = self._applied
            states = {lid: self._states[lid] for lid in dirty if lid in self._states}
            try:
                await asyncio.to_thread(self._write_flush, self._flushing, states, mark)
            except (OSError, lmdb.Error) as e:
                # Nothing is lost: the journal still holds it all. Put it back for the next try.
                self._flushing.update(self._cache)
                self._cache = self._flushing
                self._cache_bytes += flushed_bytes
                self._dirty |= dirty
                raise OSError(f"flush failed: {e}") from e
            finally:
                self._flushing = {}
            self._mark = mark

    def _write_flush(
        self, flushing: dict[Key, Cached], states: dict[int, LedgerState], mark: JournalPosition
    ) -> None:
        keys = sorted(flushing)
        if keys:
            items = [flushing[k] for k in keys]
            parts = [part for _, head, body in items for part in (head, body)]
            sizes = [FRAME_SIZE + len(body) for _, _, body in items]
            log_id, offsets = self.entrylog.append(parts, sizes)
            crash_if("flush-after-entrylog")
            self.index.write_flush(log_id, keys, offsets, sizes, states, {log_id: sum(sizes)})
            crash_if("flush-after-index")
        elif states:
            self.index.write_flush(0, [], [], [], states, {})
        self.journal.write_mark(mark)

    # -- garbage collection and compaction ----------------------------------------------

    def ledger_ids(self) -> set[int]:
        return set(self.index.ledger_ids()) | set(self._states)

    async def collect_garbage(
        self, first_entry: Callable[[int], Awaitable[int | None]]
    ) -> GarbageCollected:
        """Delete the local data of every ledger whose metadata is gone, and the entries
        below the first one its metadata still lists (fragment retention).

        ``first_entry(ledger)`` gives that first entry, or None when the metadata is
        gone; raising aborts the round before anything is deleted: a metadata outage
        must never look like "every ledger was deleted". (A ledger's first entry only
        ever grows, so what is below it can never be needed again.)
        """
        firsts = {lid: await first_entry(lid) for lid in sorted(self.ledger_ids())}
        gone = [lid for lid, first in firsts.items() if first is None]
        trimmed: dict[int, int] = {}
        async with self._flush_lock:
            for lid in gone:
                self._drop_cached(lid)
                self._states.pop(lid, None)
                self._state_changes.pop(lid, None)
                self._durable_changes.pop(lid, None)
                self._dirty.discard(lid)
                self._wake(lid)
                await asyncio.to_thread(self.index.delete_ledger, lid)
            for lid, first in firsts.items():
                if first:
                    self._drop_cached_below(lid, first)
                    n = await asyncio.to_thread(self.index.delete_entries_below, lid, first)
                    if n:
                        trimmed[lid] = n
        return GarbageCollected(gone, trimmed)

    def _drop_cached_below(self, ledger_id: int, first: int) -> None:
        for cache in (self._cache, self._flushing):
            for key in [k for k in cache if k[0] == ledger_id and k[1] < first]:
                item = cache.pop(key)
                if cache is self._cache:
                    self._cache_bytes -= FRAME_SIZE + len(item[2])

    async def compact(self, min_live_fraction: float = 0.5) -> list[int]:
        """Rewrite entry logs whose live bytes fell below the fraction; the log ids removed."""
        async with self._flush_lock:
            return await asyncio.to_thread(self._compact_sync, min_live_fraction)

    def _compact_sync(self, min_live_fraction: float) -> list[int]:
        log_sizes = self.index.log_sizes()
        by_log: dict[int, list[tuple[int, int, tuple[int, int, int]]]] = defaultdict(list)
        live: dict[int, int] = defaultdict(int)
        for ledger, entry, loc in self.index.all_locations():
            by_log[loc[0]].append((ledger, entry, loc))
            live[loc[0]] += loc[2]
        removed = []
        for log_id, total in sorted(log_sizes.items()):
            if log_id >= self.entrylog.current_id or total <= 0:
                continue
            if live[log_id] / total >= min_live_fraction:
                continue
            moved = by_log[log_id]
            try:
                records = [self.entrylog.read_record(*loc) for _, _, loc in moved]
            except StorageIOError as e:
                # Keep the damaged log: its entries must keep answering IO_ERROR.
                log.error("not compacting entry log %d: %s", log_id, e)
                continue
            keys = [(ledger, entry) for ledger, entry, _ in moved]
            record_sizes = [len(r) for r in records]
            new_log, offsets = self.entrylog.append(records, record_sizes) if records else (0, [])
            self.index.move_entries(new_log, keys, offsets, record_sizes, log_id)
            self.entrylog.delete(log_id)
            removed.append(log_id)
        return removed

    @property
    def cache_bytes(self) -> int:
        return self._cache_bytes
