"""The journal: an append-only write-ahead log with group commit.

Why group commit: Python pays per call and a disk pays per fsync, so one writer task
takes EVERY record queued since its last commit (bounded by ``max_batch_bytes``),
does one write and one fdatasync in a worker thread (the event loop keeps receiving
meanwhile), then resolves one future shared by the whole batch. The batch being
fsync'd is the "bounded time" of the gather: while it syncs, the next one fills.

When the journal is idle -- one small group and nothing queued behind it -- and the
disk's last sync was fast (at most ``inline_sync_s``), the writer does the write and
the sync on the event loop itself: the two thread hops cost more than the sync on a
busy machine, and with nothing queued there is nothing for the loop to overlap. A
slow sync (a busy or failing disk) sends the following groups to the thread again,
until a sync is fast once more; ``inline_sync_s=0`` always uses the thread.

Files are preallocated ``prealloc_bytes`` at a time (BookKeeper's
journalPreAllocSizeMB): a write inside the file's allocated size leaves its size
alone, so fdatasync flushes the data without a filesystem metadata commit (on ext4
about a quarter less per sync when three bookies share a disk). Unwritten space reads
as zeros, which replay takes for the end (records.parse_frame); a clean close and a
rotation cut the unused tail.

Files are ``journal-<seq>.log`` (hex seq), each starting with a framed header;
they rotate past ``max_file_bytes``. The checkpoint mark ``checkpoint`` names the
(seq, offset) up to which everything is also in the entry logs and index; replay
starts there and files wholly before it are deleted.

Faults: a failed write or fdatasync fails its commit group (those adds are answered
IO_ERROR and were never acknowledged) and leaves the file's tail in an unknown state,
so before the next group the writer cuts the file back to its last durable record and
continues in a new file -- it never appends after bytes it cannot vouch for, and a
replay never meets them in the middle of the journal. Until a group is durable again,
:attr:`Journal.fault` holds the error (the bookie is read-only meanwhile); every group
retries, so recovery adds go on as soon as the disk allows.

Reclaiming: once a flush has checkpointed everything written, :meth:`reclaim` starts
a new file and deletes the old one, so an idle bookie does not keep up to
``max_file_bytes`` of journal it no longer needs.

Replay rules: a bad record in the LAST file with no valid record after it is a torn
tail (a crash mid-write; the bytes were never acknowledged) and is cut; any other
bad record raises :class:`JournalCorruptError` naming the file and offset.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bookie.errors import DataDirectoryError, JournalCorruptError
from bookie.failpoints import fail_if
from bookie.records import (
    FRAME_SIZE,
    EntryHeader,
    RecordError,
    decode_header,
    frame,
    parse_frame,
    valid_record_after,
)

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">4sHQ")
_HEADER_MAGIC = b"SLJF"
_VERSION = 1
HEADER_SIZE = FRAME_SIZE + _HEADER.size
_MARK = struct.Struct(">QQ")
CHECKPOINT_FILE = "checkpoint"


@dataclass(frozen=True, order=True, slots=True)
class JournalPosition:
    """A point in the journal: the file's sequence number and a byte offset in it."""

    seq: int
    offset: int


@dataclass(slots=True)
class _Group:
    future: asyncio.Future[JournalPosition]
    records: list[bytes] = field(default_factory=list)
    items: list[object] = field(default_factory=list)
    nbytes: int = 0


FaultHook = Callable[["OSError | None"], None]  # the journal failed (error) or recovered (None)


CommitHook = Callable[[int, int, float], None]  # entries, bytes, fsync seconds
# Called in the writer task, in journal order, once a group is durable and before its
# future resolves: the storage applies the group's entries to its write cache here,
# so "applied up to position P" is exact when the flush takes its checkpoint.
DurableHook = Callable[[list[object], "JournalPosition"], None]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# The most bytes of one commit group written and synced on the event loop (the write
# is a copy to the page cache: about 0.1 ms for this much).
INLINE_MAX_BYTES = 256 << 10

_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def write_all(fd: int, buffers: list[bytes]) -> int:
    """Write every buffer, in order, with writev: no joined copy of the batch is made."""
    total = 0
    pending: list[bytes | memoryview] = list(buffers)
    i = 0
    while i < len(pending):
        batch = pending[i : i + _IOV_MAX]
        n = os.writev(fd, batch)
        total += n
        if n == sum(map(len, batch)):  # the usual case: all of it
            i += len(batch)
            continue
        while i < len(pending) and n >= len(pending[i]):  # whole buffers written
            n -= len(pending[i])
            i += 1
        if n:  # a short write stopped inside this buffer
            pending[i] = memoryview(pending[i])[n:]
    return total


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new file, whole."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _file_name(seq: int) -> str:
    return f"journal-{seq:016x}.log"


class Journal:
    def __init__(
        self,
        directory: Path,
        *,
        max_file_bytes: int = 128 << 20,
        max_batch_bytes: int = 4 << 20,
        prealloc_bytes: int = 16 << 20,
        inline_sync_s: float = 0.002,
        on_commit: CommitHook | None = None,
        on_durable: DurableHook | None = None,
        on_fault: FaultHook | None = None,
    ) -> None:
        self.directory = directory
        self.max_file_bytes = max_file_bytes
        self.max_batch_bytes = max_batch_bytes
        self.prealloc_bytes = prealloc_bytes
        self.inline_sync_s = inline_sync_s
        self._allocated = 0  # the current file's size, preallocated beyond _offset
        self._last_sync_s = 0.0  # how long the last fdatasync took
        self.inline_commits = 0  # groups written and synced on the event loop
        self.on_commit = on_commit
        self.on_durable = on_durable
        self.on_fault = on_fault
        self._fd = -1
        self._seq = 0
        self._offset = 0
        # Commit groups waiting for the writer; a new group opens once the newest one
        # holds max_batch_bytes, which bounds the size of one write + fdatasync.
        self._groups: deque[_Group] = deque()
        self._in_flight: asyncio.Future[JournalPosition] | None = None  # being written
        self._in_flight_items: list[object] = []
        self.pending_bytes = 0  # queued, not yet written: the service's back-pressure signal
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self.fault: OSError | None = None
        self._torn = False  # the current file's tail after _offset is in an unknown state
        self._reclaim_at: JournalPosition | None = None
        self._reclaimed: list[asyncio.Future[None]] = []  # resolved once it was tried
        self._durable_end = JournalPosition(0, 0)  # the end of the last durable group
        self._closing = False

    # -- files ------------------------------------------------------------------

    def _files(self) -> list[tuple[int, Path]]:
        found = []
        for p in self.directory.glob("journal-*.log"):
            try:
                found.append((int(p.stem.split("-", 1)[1], 16), p))
            except ValueError:
                raise DataDirectoryError(f"unexpected file in the journal directory: {p}") from None
        return sorted(found)

    def read_mark(self) -> JournalPosition | None:
        path = self.directory / CHECKPOINT_FILE
        if not path.exists():
            return None
        data = path.read_bytes()
        try:
            body, _ = parse_frame(data, 0)
        except (RecordError, EOFError) as e:
            raise JournalCorruptError(f"{path}: the checkpoint mark is damaged ({e})") from None
        seq, offset = _MARK.unpack(body)
        return JournalPosition(seq, offset)

    def write_mark(self, mark: JournalPosition) -> None:
        """Durably record that everything before ``mark`` is in the entry logs; drop older files."""
        write_file_atomically(
            self.directory / CHECKPOINT_FILE, frame(_MARK.pack(mark.seq, mark.offset))
        )
        for seq, path in self._files():
            if seq < mark.seq:
                path.unlink()

    def replay(self) -> Iterator[tuple[EntryHeader, bytes, JournalPosition]]:
        """Every entry record (header, framed record) from the checkpoint mark on, in order.

        Cuts a torn tail of the last file; raises JournalCorruptError for damage
        anywhere else. Call before :meth:`start`.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        mark = self.read_mark() or JournalPosition(0, 0)
        files = self._files()
        for i, (seq, path) in enumerate(files):
            if seq < mark.seq:
                continue
            last = i == len(files) - 1
            data = path.read_bytes()
            offset = self._check_header(path, data, seq, last)
            if offset is None:
                continue
            if seq == mark.seq:
                offset = max(offset, mark.offset)
            while True:
                try:
                    body, end = parse_frame(data, offset)
                except EOFError:
                    if last and any(data[offset:]):
                        self._cut(path, offset, "a partial record header")
                    break
                except RecordError as e:
                    after = valid_record_after(data, offset)
                    if not last or after is not None:
                        raise JournalCorruptError(
                            f"{path}: corrupt journal record at offset {offset} ({e}) with "
                            f"valid data after it; refusing to start rather than skip an "
                            f"acknowledged entry. Restore the journal or decommission this bookie."
                        ) from None
                    self._cut(path, offset, str(e))
                    break
                try:
                    header = decode_header(body)
                except RecordError as e:
                    raise JournalCorruptError(
                        f"{path}: undecodable journal record at offset {offset} ({e})"
                    ) from None
                record = data[offset:end]
                offset = end
                yield header, record, JournalPosition(seq, end)
        self._seq = files[-1][0] if files else 0

    def _check_header(self, path: Path, data: bytes, seq: int, last: bool) -> int | None:
        try:
            body, end = parse_frame(data, 0)
            magic, version, hseq = _HEADER.unpack(body)
        except (RecordError, EOFError, struct.error):
            if last and len(data) <= HEADER_SIZE:
                # Crashed while creating the file: nothing was ever written to it.
                path.unlink()
                return None
            raise JournalCorruptError(f"{path}: damaged journal file header") from None
        if magic != _HEADER_MAGIC or version != _VERSION or hseq != seq:
            raise DataDirectoryError(f"{path}: not a version-{_VERSION} journal file #{seq}")
        return end

    @staticmethod
    def _cut(path: Path, offset: int, why: str) -> None:
        log.warning("%s: cutting the torn journal tail at offset %d (%s)", path, offset, why)
        os.truncate(path, offset)

    def _open_next_file(self) -> None:
        """Continue in file seq+1; on failure nothing of it is left and seq is unchanged
        (a half-made file in the middle would stop every later replay)."""
        if self._fd >= 0:
            self._cut_tail()
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError:
                pass  # a close may report an earlier failed write again
        seq = self._seq + 1
        path = self.directory / _file_name(seq)
        path.unlink(missing_ok=True)  # left by an earlier attempt that failed
        # Not O_APPEND: writes go at the file position, inside the preallocated size.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        header = frame(_HEADER.pack(_HEADER_MAGIC, _VERSION, seq))
        try:
            fail_if("journal-write")
            if os.write(fd, header) != len(header):
                raise OSError(errno.ENOSPC, "short write of a journal file header")
            fail_if("journal-sync")
            os.fdatasync(fd)
            fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._seq, self._offset = fd, seq, len(header)
        self._allocated = len(header)  # preallocated by the first write (an idle file stays small)

    def _preallocate(self, end: int) -> None:
        """Make the current file at least ``end`` bytes, up to ``prealloc_bytes`` more
        but never more than a sixteenth of the free space: the bookie's disk-usage check
        runs as commits use headroom, and on a small disk one big step would jump past
        its threshold. Best effort: where the filesystem cannot (or the disk is full)
        the writes grow the file themselves, and a full disk fails the write, not this."""
        if self.prealloc_bytes <= 0:
            return
        try:
            st = os.fstatvfs(self._fd)
            step = min(self.prealloc_bytes, st.f_bavail * st.f_frsize // 16)
            size = max(end, self._allocated + step)
            os.posix_fallocate(self._fd, self._allocated, size - self._allocated)
        except OSError as e:
            log.debug("journal: no preallocation (%s); the writes grow the file", e)
            self._allocated = end  # try again a whole step further on
            return
        self._allocated = size

    def _cut_tail(self) -> None:
        """Give back the current file's unused preallocated space (best effort: zeros
        past the last record are the end for replay either way)."""
        if self._fd >= 0 and self._allocated > self._offset and not self._torn:
            try:
                os.ftruncate(self._fd, self._offset)
            except OSError as e:
                log.warning("journal: could not cut the preallocated tail: %s", e)

    def _repair(self) -> None:
        """After a failed write: cut the file back to its last durable record, go on in
        a new file. Raises (and stays torn) when the disk still refuses."""
        path = self.directory / _file_name(self._seq)
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError:
                pass
        if path.exists():
            os.truncate(path, self._offset)
            fd = os.open(path, os.O_WRONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._open_next_file()
        self._torn = False
        log.warning(
            "journal: cut %s back to %d bytes; continuing in a new file", path, self._offset
        )

    # -- the writer -----------------------------------------------------------------

    @property
    def position(self) -> JournalPosition:
        """The end of what has been written so far."""
        return JournalPosition(self._seq, self._offset)

    def start(self) -> None:
        """Open a fresh file (never append after a replayed tail) and start the writer."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._open_next_file()
        self._durable_end = self.position
        self._wake = asyncio.Event()
        self._writer = asyncio.get_running_loop().create_task(self._run(), name="journal-writer")

    def unapplied_items(self) -> list[object]:
        """The items of every group not yet applied (queued or being written), newest
        first: what an add of the same entry must be compared with besides the cache."""
        out: list[object] = []
        for group in reversed(self._groups):
            out.extend(reversed(group.items))
        out.extend(reversed(self._in_flight_items))
        return out

    def reclaim(self, checkpoint: JournalPosition, min_bytes: int) -> asyncio.Future[None]:
        """Everything before ``checkpoint`` is in the entry logs and index. If that is
        everything durable, the writer deletes every file before the current one and,
        when the current file holds at least ``min_bytes``, starts a new file and
        deletes that one too (unless something was written meanwhile)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if checkpoint != self._durable_end or self._wake is None:
            done.set_result(None)
            return done
        if checkpoint.seq < self._seq or self._offset - HEADER_SIZE >= max(min_bytes, 1):
            self._reclaim_at = checkpoint
            self._reclaimed.append(done)
            self._wake.set()
        else:
            done.set_result(None)
        return done

    def probe(self) -> asyncio.Future[JournalPosition]:
        """An empty commit group: the writer repairs a torn file first, then syncs; the
        future fails while the disk still refuses."""
        return self.append([], 0)

    def append(
        self, records: list[bytes], nbytes: int, items: list[object] | None = None
    ) -> asyncio.Future[JournalPosition]:
        """Queue framed records; the returned future resolves once they are fsync'd.

        The future is shared by every caller in the same commit group, so awaiting
        it costs nothing per entry.
        """
        if not self._groups or self._groups[-1].nbytes >= self.max_batch_bytes:
            self._groups.append(_Group(asyncio.get_running_loop().create_future()))
        group = self._groups[-1]
        group.records.extend(records)
        if items:
            group.items.extend(items)
        group.nbytes += nbytes
        self.pending_bytes += nbytes
        assert self._wake is not None
        self._wake.set()
        return group.future

    async def barrier(self) -> None:
        """Wait until everything queued so far is durable and applied (or failed).

        A fence or a term change takes effect for adds checked after it; adds checked
        before it may still be on their way to the disk and must be readable before the
        fencing read is answered, or a recovery could miss an entry that is acknowledged
        a moment later (BookKeeper puts accepted entries in its write cache before the
        journal write; here they enter it once durable, so the fence waits for them)."""
        last = self._groups[-1].future if self._groups else self._in_flight
        if last is not None and not last.done():
            await asyncio.wait([last])

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            if not self._groups:
                if self._reclaim_at is not None:
                    try:
                        await self._reclaim()
                    except Exception as e:  # an unexpected file: reclaim later, write on
                        log.error("journal: reclaiming checkpointed files failed: %s", e)
                    continue
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            group = self._groups.popleft()
            self.pending_bytes -= group.nbytes
            batch, count, nbytes = group.future, len(group.records), group.nbytes
            self._in_flight = batch
            self._in_flight_items = group.items
            try:
                if self._commit_inline(group):
                    self.inline_commits += 1
                    pos, fsync_s = self._write(group.records)
                else:
                    pos, fsync_s = await asyncio.to_thread(self._write, group.records)
            except OSError as e:
                self._in_flight_items = []
                if self.fault is None:
                    log.error("journal write failed; the bookie turns read-only: %s", e)
                self.fault = e
                if self.on_fault is not None:
                    self.on_fault(e)
                if not batch.done():
                    batch.set_exception(e)
                continue
            self._in_flight_items = []
            self._durable_end = pos
            if self.fault is not None:
                log.warning("journal writes succeed again")
                self.fault = None
                if self.on_fault is not None:
                    self.on_fault(None)
            # The hooks must never end the writer: every later add and fence would hang.
            if self.on_commit is not None:
                try:
                    self.on_commit(count, nbytes, fsync_s)
                except Exception as e:  # metrics or a disk check failed: the data is safe
                    log.error("journal commit hook failed: %s", e)
            if self.on_durable is not None:
                try:
                    self.on_durable(group.items, pos)
                except Exception as e:
                    # Durable but not (wholly) applied: not answered OK. The adds' outcome
                    # is unknown to their writers (IO_ERROR), as after a crash.
                    log.error("applying a durable commit group failed: %s", e)
                    if not batch.done():
                        batch.set_exception(OSError(errno.EIO, f"applying the commit failed: {e}"))
                    continue
            if not batch.done():
                batch.set_result(pos)

    async def _reclaim(self) -> None:
        at, self._reclaim_at = self._reclaim_at, None
        waiting, self._reclaimed = self._reclaimed, []
        try:
            await self._reclaim_files(at)
        finally:
            for fut in waiting:
                if not fut.done():
                    fut.set_result(None)

    async def _reclaim_files(self, at: JournalPosition | None) -> None:
        if at != self._durable_end or self._torn:
            return
        try:
            if at.seq == self._seq:
                await asyncio.to_thread(self._open_next_file)
            for seq, path in self._files():
                if seq < self._seq:
                    await asyncio.to_thread(path.unlink)
        except OSError as e:
            log.warning("journal: could not reclaim checkpointed files yet: %s", e)

    def _commit_inline(self, group: _Group) -> bool:
        """Whether to write and sync this group on the event loop (see the module's doc):
        nothing queued behind it, small, a healthy file with room allocated (growing or
        rotating a file is left to the thread) and a fast last sync."""
        if self._groups or self._last_sync_s > self.inline_sync_s:
            return False
        if self.fault is not None or self._torn or self._fd < 0:
            return False
        size = sum(map(len, group.records))
        end = self._offset + size
        return size <= INLINE_MAX_BYTES and end <= self._allocated and end < self.max_file_bytes

    def _write(self, records: list[bytes]) -> tuple[JournalPosition, float]:
        if self._torn or self._fd < 0:
            self._repair()
        end = self._offset + sum(map(len, records))
        if end > self._allocated:
            self._preallocate(end)
        try:
            written = write_all(self._fd, records)
            fail_if("journal-write")  # as an error after the bytes went out (a torn write)
            t0 = time.perf_counter()
            fail_if("journal-sync")
            os.fdatasync(self._fd)
        except OSError:
            self._torn = True
            raise
        fsync_s = self._last_sync_s = time.perf_counter() - t0
        self._offset += written
        pos = JournalPosition(self._seq, self._offset)
        if self._offset >= self.max_file_bytes:
            try:
                self._open_next_file()
            except OSError as e:  # this group is durable; the next one retries the rotation
                log.warning("journal: could not start a new file yet: %s", e)
        return pos, fsync_s

    async def close(self) -> None:
        """Commit what is queued, then stop the writer and close the file."""
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        if self._writer is not None:
            await self._writer
        if self._fd >= 0:
            self._cut_tail()
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError as e:  # a failed write reported again: nothing left to lose
                log.warning("journal: closing the file reported %s", e)
        if self._torn:
            # Cut what a failed write left (never acknowledged), so a replay does not
            # bring back entries whose adds were answered IO_ERROR.
            try:
                os.truncate(self.directory / _file_name(self._seq), self._offset)
            except OSError as e:
                log.warning("journal: could not cut the failed write's tail: %s", e)
