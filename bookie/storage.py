"""Ledger storage: journal + write cache + entry logs + index, and per-ledger state.

The shape is BookKeeper's DbLedgerStorage. An add is checked against the ledger's
state (master key, fence, term), appended to the journal, and once its commit group
is durable the journal's writer task applies the group here: the entries enter the
write cache (which serves reads) and piggybacked LACs advance, waking long polls.
A background flush moves the cache to an entry log (one write, one fsync) and the
index (one synced LMDB transaction), then advances the journal checkpoint mark.

The ledger-state rules (master key, fence, term, TRUNCATE, rewrites, explicit LAC) are
decided in ``ledger_rules.py``; this module looks the state up, applies the outcome and
makes it durable.

Faults: a flush that fails for any reason puts its batch back (the journal still
holds it) and the flush loop goes on; a failed journal or flush write sets
:attr:`LedgerStorage.fault` (the bookie is read-only until the disk takes writes again,
see :meth:`heal`).

State changes that must be durable before their answer (a fence, a term adopted by a
read, an explicit LAC) are written to the index synchronously. State packed into a
transaction is always read from the live objects INSIDE that transaction, so a
flush racing a fence can never write back an older, unfenced copy.

Ordering of a TRUNCATE entry t: applied in journal order, it drops the ledger's
cached entries above t at once; the index deletion is done by the next flush that
starts after it, in the same transaction as (and before) the entries written after t,
and before the checkpoint passes the truncate record; until then reads treat indexed
entries above t as gone. (A separate deletion task could run after a flush that was
already waiting for the lock, deleting acknowledged entries written after t.)

Work under the flush lock that runs in a thread is shielded from cancellation: a
stopping server's cancel returns at once, but the lock is held until the thread ends,
so two threads never write the entry log or the index at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lmdb

from bookie import ledger_rules as rules
from bookie.entrylog import EntryLogger
from bookie.errors import (
    GcRefusedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    RequestError,
    StorageIOError,
    TooManyRequestsError,
)
from bookie.failpoints import crash_if, fail_if
from bookie.index import LedgerIndex, Location
from bookie.journal import CommitHook, Journal, JournalPosition
from bookie.ledger_rules import LedgerState
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
T = TypeVar("T")
# Range reads that need the disk run here rather than in asyncio's default pool: that
# pool also runs the journal's writes, and a burst of reads must not queue an fsync.
READ_THREADS = 4
# Compaction moves entries in batches of at most this many records / bytes.
COMPACTION_BATCH_ENTRIES = 10_000
COMPACTION_BATCH_BYTES = 64 << 20
_read_pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="bookie-read")
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
        journal_prealloc_bytes: int = 16 << 20,
        journal_inline_sync_s: float = 0.002,
        entrylog_max_file_bytes: int = 512 << 20,
        on_commit: CommitHook | None = None,
        ledger_exists: Callable[[int], Awaitable[bool]] | None = None,
        on_fault: Callable[[str | None], None] | None = None,
    ) -> None:
        self.journal = Journal(
            journal_dir,
            max_file_bytes=journal_max_file_bytes,
            prealloc_bytes=journal_prealloc_bytes,
            inline_sync_s=journal_inline_sync_s,
            on_commit=on_commit,
            on_durable=self._apply,  # type: ignore[arg-type]
            on_fault=self._on_journal_fault,
        )
        # Asked before fencing a ledger unknown here (ledger_rules.check_fence).
        self.ledger_exists = ledger_exists
        self.on_fault = on_fault
        self.flush_fault: BaseException | None = None
        self.data_dir = data_dir
        self.flush_interval_s = flush_interval_s
        self.flush_bytes = flush_bytes
        # Refuse adds past this much unflushed data: the client backs off and retries.
        self.max_cache_bytes = 4 * flush_bytes
        self._entrylog_max = entrylog_max_file_bytes
        # An idle journal file holding this much checkpointed data is replaced and deleted.
        self.journal_reclaim_bytes = 1 << 20
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
        self._stopping = False
        self._fault: str | None = None

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
        """Commit, flush, close. A flush that fails here loses nothing (the journal
        holds every entry and the next start replays it): say so, do not raise."""
        await self.journal.close()
        self._stopping = True
        self._flush_wake.set()
        if self._flusher is not None:
            await self._flusher  # never cancelled mid-flush: its thread would run on
        for task in list(self._background):
            await task
        try:
            await self.flush()
        except OSError as e:
            log.error(
                "the last flush failed (%s); the journal keeps the entries for the next start", e
            )
        self.entrylog.close()
        self.index.close()

    # -- faults -------------------------------------------------------------------------

    @property
    def fault(self) -> str | None:
        """Why the disk refuses writes now (a journal or flush failure), or None."""
        return self._fault

    def _update_fault(self) -> None:
        reasons = []
        if self.journal.fault is not None:
            reasons.append(f"journal write failed: {self.journal.fault}")
        if self.flush_fault is not None:
            reasons.append(f"flush failed: {self.flush_fault}")
        fault = "; ".join(reasons) or None
        if fault != self._fault:
            self._fault = fault
            if self.on_fault is not None:
                self.on_fault(fault)

    def _on_journal_fault(self, error: OSError | None) -> None:
        self._update_fault()

    async def reclaim_journal(self) -> None:
        """Flush, then have the journal delete every file the checkpoint covers (GC calls
        this so the space it freed shows in the next disk check)."""
        await self.flush()
        if self._mark == self._applied:
            await self.journal.reclaim(self._applied, 0)

    async def heal(self) -> str | None:
        """Retry what failed (a flush; a journal probe, which repairs a torn file first)
        and return the fault that remains, or None."""
        if self.journal.fault is not None:
            try:
                await self.journal.probe()
            except OSError:
                pass  # still failing: the fault stays
        if self.flush_fault is not None:
            try:
                await self.flush()
            except OSError:
                pass
        return self._fault

    # -- ledger state -----------------------------------------------------------------

    def state(self, ledger_id: int) -> LedgerState | None:
        st = self._states.get(ledger_id)
        if st is None:
            try:
                st = self.index.get_state(ledger_id)
                if st is not None:
                    # Every entry of a ledger whose state is not in memory is indexed:
                    # the write cache only holds entries of ledgers in _states.
                    st.highest_entry = self.index.last_entry(ledger_id)
            except lmdb.Error as e:
                raise StorageIOError(f"ledger {ledger_id}: index unreadable: {e}") from None
            if st is not None:
                self._states[ledger_id] = st
        return st

    async def _persist_state(self, ledger_id: int) -> None:
        st = self._states[ledger_id]
        try:
            await asyncio.to_thread(self.index.put_state, ledger_id, st)
        except lmdb.Error as e:
            raise StorageIOError(f"ledger {ledger_id}: could not persist its state: {e}") from None

    async def fence(self, ledger_id: int, master_key: bytes, term: int = 0) -> LedgerState:
        """Fence the ledger (ledger_rules.check_fence). Returns once the fence is
        durable AND every add accepted before it is durable and readable, so the
        fencing read's answer (LAC, entries) covers each entry that can still be
        acknowledged."""
        in_metadata = await self._in_metadata(ledger_id)
        # Looked up again: an add may have created the ledger during the await.
        st, changed = rules.check_fence(
            ledger_id, self.state(ledger_id), master_key, term, in_metadata=in_metadata
        )
        self._states[ledger_id] = st  # from here on normal adds are refused
        await self._settle_state(ledger_id, changed)
        return st

    async def adopt_term(self, ledger_id: int, master_key: bytes, term: int) -> LedgerState:
        """Apply the term rule for a recovery read/LAC read without the fence flag (a
        raised term, like a fence, waits for the adds accepted under the old one)."""
        in_metadata = await self._in_metadata(ledger_id)
        st, changed = rules.check_term_read(
            ledger_id, self.state(ledger_id), master_key, term, in_metadata=in_metadata
        )
        self._states[ledger_id] = st
        await self._settle_state(ledger_id, changed)
        return st

    async def _in_metadata(self, ledger_id: int) -> bool | None:
        """Whether the metadata store holds a ledger unknown here (None: known here, or
        no store to ask)."""
        if self.state(ledger_id) is not None or self.ledger_exists is None:
            return None
        try:
            return await self.ledger_exists(ledger_id)
        except Exception as e:  # any store failure: the request cannot be decided now
            raise StorageIOError(
                f"ledger {ledger_id}: cannot check the metadata store before fencing: {e}"
            ) from None

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
        known = self.state(ledger_id)
        term_before = known.term if known is not None else 0
        st, changed = rules.check_write_lac(ledger_id, known, master_key, term, lac)
        if not changed:
            return
        self._wake(ledger_id)  # long polls first
        if st.term != term_before:
            await self._persist_state(ledger_id)  # an adopted term fences: durable now
        else:
            # An explicit LAC alone is advisory (readers stop at it; losing it in a crash
            # only makes them wait for the next entry): it goes to disk with the next
            # flush, not in a synced write per call -- a writer sends one whenever it
            # goes quiet, which at one add in flight is once per add.
            self._dirty.add(ledger_id)

    def lac(self, ledger_id: int) -> int:
        st = self.state(ledger_id)
        if st is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
        return st.lac

    # -- adds -------------------------------------------------------------------------

    def check_add(self, e: EntryHeader, *, read_only: bool) -> LedgerState:
        """Apply the add rules (and any term adoption); raises the RequestError to answer.
        The caller then tells a new entry (above ``highest_entry``) from a possible
        rewrite (:meth:`check_rewrite`)."""
        if not (read_only and not e.flags & pb.RECOVERY_ADD):
            if self._cache_bytes > self.max_cache_bytes:
                raise TooManyRequestsError("the write cache is full; retry after the flush")
            if self.journal.pending_bytes > self.max_cache_bytes:
                raise TooManyRequestsError("the journal is behind; retry after it commits")
        known = self.state(e.ledger_id)
        st, _ = rules.check_add(
            e.ledger_id, known, e.master_key, e.flags, e.term, read_only=read_only
        )
        # A raised term is durable with the entry's journal record (replay re-applies it).
        if known is None:
            self._states[e.ledger_id] = st
            self._dirty.add(e.ledger_id)
        return st

    def unapplied(self) -> dict[Key, Cached]:
        """Entries accepted into the journal and not yet applied, the latest copy of each
        (built once per request that holds a rewrite: the rewrite path's index)."""
        out: dict[Key, Cached] = {}
        for item in reversed(self.journal.unapplied_items()):  # oldest first
            h = item[0]  # type: ignore[index]
            out[(h.ledger_id, h.entry_id)] = item  # type: ignore[assignment]
        return out

    def check_rewrite(self, e: EntryHeader, new: rules.Copy, pending: Mapping[Key, Cached]) -> None:
        """An add at or below the ledger's highest entry: compare with the copy this
        bookie holds or has on its way (``pending``: earlier in this request or in the
        journal; then the cache, then the entry logs). A copy that cannot be read is no
        reason to refuse: the new one repairs it."""
        key = (e.ledger_id, e.entry_id)
        stored: StoredEntry | None = None
        item = pending.get(key)
        if item is not None:
            stored = decode_entry(item[2])
        if stored is None:
            try:
                stored = self.read_entry(*key)
            except (NoSuchEntryError, NoSuchLedgerError, StorageIOError):
                return
        old = rules.Copy(stored.payload, stored.length, stored.flags, stored.term)
        rules.check_rewrite(e.ledger_id, e.entry_id, old, new)

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
                st = (
                    self._states.get(lid)
                    or self.state(lid)
                    or LedgerState(e.master_key, highest_entry=-1)
                )
                # Absent only on replay, or when the ledger was garbage-collected meanwhile.
                self._states[lid] = st
                self._dirty.add(lid)
            if e.term > st.term:
                st.term = e.term
            if e.flags & pb.TRUNCATE:
                self._truncate(lid, e.entry_id, st)
            elif e.entry_id > st.highest_entry:  # replay (the add path counted it already)
                st.highest_entry = e.entry_id
            cache[(lid, e.entry_id)] = item
            nbytes += FRAME_SIZE + len(item[2])
            if e.last_add_confirmed > st.piggyback_lac or st.explicit_lac > st.piggyback_lac:
                # The LAC may rise: a piggybacked one, or an explicit one this entry reaches.
                st.piggyback_lac = max(st.piggyback_lac, e.last_add_confirmed)
                raised.add(lid)
        self._cache_bytes += nbytes
        self._applied = pos
        for lid in raised:
            self._wake(lid)
        if self._cache_bytes >= self.flush_bytes:
            self._flush_wake.set()

    def _truncate(self, ledger_id: int, entry_id: int, st: LedgerState) -> None:
        self._drop_cached(ledger_id, above=entry_id)
        rules.truncated(st, entry_id)
        if self._replaying:
            self.index.delete_entries(ledger_id, above=entry_id)
            return
        # The index deletion goes into the next flush's transaction, ahead of the entries
        # written after the TRUNCATE and of the checkpoint that passes it; until then
        # reads treat indexed entries above it as gone.
        self._pending_truncates[ledger_id] = min(
            entry_id, self._pending_truncates.get(ledger_id, entry_id)
        )

    def _drop_cached(self, ledger_id: int, above: int = -1) -> None:
        """Forget cached entries of a ledger with id > ``above`` (rare: truncate and GC)."""
        for cache in (self._cache, self._flushing):
            for key in [k for k in cache if k[0] == ledger_id and k[1] > above]:
                item = cache.pop(key)
                if cache is self._cache:
                    self._cache_bytes -= FRAME_SIZE + len(item[2])

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
        return self._read_indexed(ledger_id, entry_id)

    async def read_entries(
        self, ledger_id: int, first: int, last: int, max_bytes: int
    ) -> list[tuple[int, StoredEntry | RequestError]]:
        """Entries ``first``..``last`` in order, each the stored entry or the error to
        answer for it (as :meth:`read_entry`); stops before an entry whose payload would
        take the total past ``max_bytes``, unless it would be the first answer. What the
        write cache holds is read here; the rest in a worker thread, so the event loop
        never waits for the disk."""
        out: list[tuple[int, StoredEntry | RequestError]] = []
        total = 0
        cache, flushing = self._cache, self._flushing
        eid = first
        while eid <= last:
            hit = cache.get((ledger_id, eid)) or flushing.get((ledger_id, eid))
            if hit is None:
                break
            e = decode_entry(hit[2])
            if out and total + len(e.payload) > max_bytes:
                return out
            total += len(e.payload)
            out.append((eid, e))
            eid += 1
        if eid > last:
            return out
        # Snapshot what the cache holds of the rest NOW, before any await: an entry leaves
        # the cache only once its index transaction is done (the flush keeps it in
        # _flushing until then), so whatever is not in the snapshot is in the index, or
        # absent. The worker thread reads nothing the event loop mutates.
        cached: dict[int, bytes] = {}
        for i in range(eid, last + 1):
            hit = cache.get((ledger_id, i)) or flushing.get((ledger_id, i))
            if hit is not None:
                cached[i] = hit[2]
        truncated_at = self._pending_truncates.get(ledger_id)

        def read_rest() -> list[tuple[int, StoredEntry | RequestError]]:
            nonlocal total
            for i in range(eid, last + 1):
                got: StoredEntry | RequestError
                body = cached.get(i)
                try:
                    if body is not None:
                        got = decode_entry(body)
                    elif truncated_at is not None and i > truncated_at:
                        raise NoSuchEntryError(f"entry {ledger_id}:{i} was truncated")
                    else:
                        got = self._read_indexed(ledger_id, i)
                except RequestError as err:
                    got = err
                if isinstance(got, StoredEntry):
                    if out and total + len(got.payload) > max_bytes:
                        break
                    total += len(got.payload)
                out.append((i, got))
            return out

        return await asyncio.get_running_loop().run_in_executor(_read_pool, read_rest)

    def _read_indexed(self, ledger_id: int, entry_id: int) -> StoredEntry:
        """The entry the index points at, read from its entry log. Safe off the event
        loop: it touches neither the cache nor the ledger states (reads only)."""
        loc = self._locate(ledger_id, entry_id)
        for _ in range(3):
            if loc is None:
                if ledger_id not in self._states and self._indexed_state(ledger_id) is None:
                    raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
                raise NoSuchEntryError(f"entry {ledger_id}:{entry_id} is not on this bookie")
            try:
                e = self.entrylog.read(*loc)
                if e.ledger_id == ledger_id and e.entry_id == entry_id:
                    return e
                error = StorageIOError(
                    f"entry log {loc[0]:08x} offset {loc[1]} holds entry "
                    f"{e.ledger_id}:{e.entry_id}, not {ledger_id}:{entry_id}"
                )
            except StorageIOError as err:
                error = err
            # Compaction runs beside reads: it may have moved the entry and deleted the
            # log between the lookup and the read. Only a location that stays put is
            # damaged.
            moved = self._locate(ledger_id, entry_id)
            if moved == loc:
                raise error
            loc = moved
        raise error

    def _locate(self, ledger_id: int, entry_id: int) -> Location | None:
        try:
            return self.index.get(ledger_id, entry_id)
        except lmdb.Error as e:
            raise StorageIOError(f"entry {ledger_id}:{entry_id}: index unreadable: {e}") from None

    def _indexed_state(self, ledger_id: int) -> LedgerState | None:
        try:
            return self.index.get_state(ledger_id)
        except lmdb.Error as e:
            raise StorageIOError(f"ledger {ledger_id}: index unreadable: {e}") from None

    def lac_raised(self, ledger_id: int) -> None:
        """The add path raised a ledger's LAC (service._check_adds): answer its long
        polls."""
        self._wake(ledger_id)

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
                async with asyncio.timeout(remaining):  # not wait_for: it can drop a cancel
                    await fut
            except TimeoutError:
                pass
            finally:
                waiters = self._waiters.get(ledger_id)
                if waiters and fut in waiters:
                    waiters.remove(fut)

    # -- flush --------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._flush_wake.wait(), self.flush_interval_s)
            except TimeoutError:
                pass
            self._flush_wake.clear()
            if self._stopping:
                return
            try:
                await self.flush()
            except Exception as e:  # whatever it was, the batch is back: keep flushing
                log.error("flush failed; entries stay in the journal and cache: %s", e)

    async def flush(self) -> None:
        """Write the cache to an entry log + index, then advance the checkpoint mark.

        Shielded: a caller cancelled meanwhile (a stopping server) gets CancelledError,
        but the flush itself runs to its end, so its thread never writes the entry log
        while a later flush does, and its bookkeeping matches what the thread did."""
        await asyncio.shield(self._flush())

    async def _flush(self) -> None:
        async with self._flush_lock:
            if not self._cache and not self._dirty and self._mark == self._applied:
                self.journal.reclaim(self._applied, self.journal_reclaim_bytes)
                return
            self._flushing, self._cache = self._cache, {}
            self._cache_bytes = 0
            dirty, self._dirty = self._dirty, set()
            mark = self._applied
            states = {lid: self._states[lid] for lid in dirty if lid in self._states}
            truncates = dict(self._pending_truncates)
            # The thread gets its own sorted copy: a TRUNCATE or GC applied meanwhile
            # drops keys from _flushing (readers must stop seeing them at once); such a
            # TRUNCATE's index deletion goes into the next flush, ahead of its entries.
            items = sorted(self._flushing.items())
            try:
                await asyncio.to_thread(self._write_flush, items, states, mark, truncates)
            except Exception as e:
                # Nothing is lost: the journal still holds it all. Put back what is still
                # wanted (not what a TRUNCATE dropped meanwhile) for the next try.
                self._flushing.update(self._cache)
                self._cache = self._flushing
                self._cache_bytes = sum(FRAME_SIZE + len(item[2]) for item in self._cache.values())
                self._dirty |= dirty
                self._flushing = {}
                self.flush_fault = e
                self._update_fault()
                raise OSError(f"flush failed: {e}") from e
            for lid, at in truncates.items():  # applied in the index: readers may look again
                if self._pending_truncates.get(lid) == at:
                    del self._pending_truncates[lid]
            self._flushing = {}
            self._mark = mark
            if self.flush_fault is not None:
                log.warning("flushes succeed again")
                self.flush_fault = None
                self._update_fault()
        self.journal.reclaim(mark, self.journal_reclaim_bytes)

    def _write_flush(
        self,
        flushing: list[tuple[Key, Cached]],
        states: dict[int, LedgerState],
        mark: JournalPosition,
        truncates: dict[int, int],
    ) -> None:
        if flushing:
            keys = [k for k, _ in flushing]
            parts = [part for _, (_, head, body) in flushing for part in (head, body)]
            sizes = [FRAME_SIZE + len(body) for _, (_, _, body) in flushing]
            log_id, offsets = self.entrylog.append(parts, sizes)
            crash_if("flush-after-entrylog")
            fail_if("flush-before-index")
            fail_if("index-write")
            self.index.write_flush(
                log_id, keys, offsets, sizes, states, {log_id: sum(sizes)}, truncates
            )
            crash_if("flush-after-index")
        elif states or truncates:
            fail_if("index-write")
            self.index.write_flush(0, [], [], [], states, {}, truncates)
        self.journal.write_mark(mark)

    # -- garbage collection and compaction ----------------------------------------------

    def ledger_ids(self) -> set[int]:
        return set(self.index.ledger_ids()) | set(self._states)

    async def collect_garbage(
        self,
        first_entry: Callable[[int], Awaitable[int | None]],
        *,
        max_vanished_fraction: float | None = None,
        vanish_check_min_ledgers: int = 0,
    ) -> GarbageCollected:
        """Delete the local data of every ledger whose metadata is gone, and the entries
        below the first one its metadata still lists (fragment retention).

        ``first_entry(ledger)`` gives that first entry, or None when the metadata is
        gone; raising aborts the round before anything is deleted: a metadata outage
        must never look like "every ledger was deleted". (A ledger's first entry only
        ever grows, so what is below it can never be needed again.)

        When the bookie holds at least ``vanish_check_min_ledgers`` ledgers and more than
        ``max_vanished_fraction`` of them are gone at once, GcRefusedError is raised
        before anything is deleted: that is far likelier a wrong or damaged metadata
        store than a real deletion (None: no such limit).
        """
        firsts = {lid: await first_entry(lid) for lid in sorted(self.ledger_ids())}
        gone = [lid for lid, first in firsts.items() if first is None]
        if (
            max_vanished_fraction is not None
            and len(firsts) >= vanish_check_min_ledgers
            and len(gone) > max_vanished_fraction * len(firsts)
        ):
            raise GcRefusedError(
                f"{len(gone)} of this bookie's {len(firsts)} ledgers vanished from the "
                f"metadata at once, more than --gc-max-vanished-fraction "
                f"({max_vanished_fraction:.0%}) allows: a wrong or damaged metadata store, or "
                f"a mass deletion.",
                reason="mass_vanish",
            )
        trimmed: dict[int, int] = {}

        async def delete() -> None:
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
                        # Entries not flushed yet count too: they are deleted as surely.
                        n = self._drop_cached_below(lid, first)
                        n += await asyncio.to_thread(self.index.delete_entries_below, lid, first)
                        if n:
                            trimmed[lid] = n

        await asyncio.shield(delete())  # see _locked: the lock is never left to a thread
        return GarbageCollected(gone, trimmed)

    async def _locked(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in a worker thread under the flush lock, shielded: a cancelled
        caller (a stopping server) returns at once, but the lock is held until the
        thread is done, so no flush ever writes the entry log or index beside it."""

        async def run() -> T:
            async with self._flush_lock:
                return await asyncio.to_thread(fn, *args)

        return await asyncio.shield(run())

    def _drop_cached_below(self, ledger_id: int, first: int) -> int:
        """Drop cached entries below first; how many were waiting for a flush (those
        are nowhere else: the index never had them)."""
        unflushed = 0
        for cache in (self._cache, self._flushing):
            for key in [k for k in cache if k[0] == ledger_id and k[1] < first]:
                item = cache.pop(key)
                if cache is self._cache:
                    self._cache_bytes -= FRAME_SIZE + len(item[2])
                    unflushed += 1
        return unflushed

    async def compact(
        self,
        min_live_fraction: float = 0.5,
        *,
        batch_entries: int = COMPACTION_BATCH_ENTRIES,
        batch_bytes: int = COMPACTION_BATCH_BYTES,
    ) -> list[int]:
        """Rewrite entry logs whose live bytes fell below the fraction; the log ids removed.

        Streamed, so its memory does not grow with the index: one pass sums the live
        bytes of each log (one number per log), then the chosen logs' entries move in
        batches of at most ``batch_entries`` records and ``batch_bytes`` bytes (read,
        appended to the current log, re-pointed in the index), each batch under the
        flush lock so flushes go on between batches. Only logs before the current one
        are rewritten (nothing is appended to them any more). A log is deleted once all
        its entries moved; a log with a record that cannot be read is kept, so that
        entry keeps answering IO_ERROR (its readable entries move)."""
        current, sizes, live = await asyncio.to_thread(self._log_usage)

        def sparse(log_id: int) -> bool:
            total = sizes.get(log_id, 0)
            return total > 0 and live.get(log_id, 0) / total < min_live_fraction

        if sparse(current):
            # The log being written holds dead data (its ledgers were deleted): start the
            # next one, so this one can be compacted now rather than after 512 MiB more.
            async with self._flush_lock:
                if self.entrylog.current_id == current:
                    self.entrylog.roll()
            # Counted again: flushes may have put live entries in it since the count.
            current, sizes, live = await asyncio.to_thread(self._log_usage)
        targets = {log_id for log_id in sizes if log_id < current and sparse(log_id)}
        damaged: set[int] = set()
        after: Key | None = None
        more = any(live.get(log_id) for log_id in targets)
        while more:
            after, more = await self._locked(
                self._compact_batch, targets, after, batch_entries, batch_bytes, damaged
            )
        removed = sorted(targets - damaged)
        if removed:
            await self._locked(self._drop_logs, removed)
        return removed

    def _log_usage(self) -> tuple[int, dict[int, int], dict[int, int]]:
        """(current entry log id, bytes in each log, bytes of each still indexed).

        The current id is read before the index: every log below it takes no more
        writes and its last flush is committed, so what is counted of those logs is
        final (a deletion can only lower it). Counted earlier, a log that flushes fill
        and roll meanwhile would look as dead as it was, and be deleted unscanned.

        A log's size is the larger of the index's count and its file's: a flush that
        failed after its write (ENOSPC, EIO, a refused index transaction) leaves bytes
        nothing counts, on a log the index may not know at all, and on a full disk
        those are the bytes GC must give back. (Bytes of a flush running now count as
        dead at most until it commits: at worst the current log is rolled early.)"""
        current = self.entrylog.current_id
        sizes, live = self.index.live_bytes()
        for log_id, nbytes in self.entrylog.file_sizes().items():
            sizes[log_id] = max(sizes.get(log_id, 0), nbytes)
        return current, sizes, live

    def _compact_batch(
        self,
        targets: set[int],
        after: Key | None,
        batch_entries: int,
        batch_bytes: int,
        damaged: set[int],
    ) -> tuple[Key | None, bool]:
        """Move the next batch of entries out of the target logs; (last key seen, more?)."""
        batch, more = self.index.locations_in(targets, after, batch_entries, batch_bytes)
        keys: list[Key] = []
        records: list[bytes] = []
        for ledger, entry, loc in batch:
            try:
                records.append(self.entrylog.read_record(*loc))
            except StorageIOError as e:
                if loc[0] not in damaged:
                    log.error("not compacting entry log %d: %s", loc[0], e)
                    damaged.add(loc[0])
                continue
            keys.append((ledger, entry))
        if records:
            record_sizes = [len(r) for r in records]
            new_log, offsets = self.entrylog.append(records, record_sizes)
            self.index.move_entries(new_log, keys, offsets, record_sizes)
        return ((batch[-1][0], batch[-1][1]) if batch else after), more

    def _drop_logs(self, log_ids: list[int]) -> None:
        for log_id in log_ids:
            # The file first: a crash in between leaves a size record with no live
            # bytes, which the next round compacts away; never a file nothing counts.
            self.entrylog.delete(log_id)
            self.index.forget_log(log_id)

    @property
    def cache_bytes(self) -> int:
        return self._cache_bytes
