"""Entry logs: the files that hold entry payloads after the journal.

The background flush appends whole batches (sorted by ledger and entry, so one
ledger's entries sit together for range reads) to the current log and fsyncs once;
logs rotate past ``max_file_bytes``. A location is (log id, offset, length) of one
framed record, the same bytes the journal wrote. A read verifies the CRC and turns
any failure into :class:`StorageIOError`: the index says the entry exists, so the
answer must be "unknown", never "no such entry".
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from itertools import accumulate
from pathlib import Path

from bookie.errors import DataDirectoryError, StorageIOError
from bookie.failpoints import fail_if
from bookie.journal import fsync_dir, write_all
from bookie.records import RecordError, StoredEntry, decode_entry, parse_frame

LOCATION = struct.Struct(">IQI")
# Entry logs kept open for reads at once (the least recently read beyond it are closed):
# one descriptor per log ever read would grow with the data a bookie holds -- each
# failed write starts a new log, so a bookie with a flaky disk makes many.
MAX_READ_FDS = 16


class _ReadFd:
    """One entry log open for reads, and how many reads use it now: a descriptor is
    closed only when no read uses it (closed under a read, its number could be reused
    by another file, and the read would see that file's bytes)."""

    __slots__ = ("fd", "retired", "users")

    def __init__(self, fd: int) -> None:
        self.fd, self.users, self.retired = fd, 0, False


def unpack_location(raw: bytes) -> tuple[int, int, int]:
    log_id, offset, length = LOCATION.unpack(raw)
    return log_id, offset, length


class EntryLogger:
    def __init__(self, directory: Path, *, max_file_bytes: int = 512 << 20) -> None:
        self.directory = directory
        self.max_file_bytes = max_file_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._read_fds: OrderedDict[int, _ReadFd] = OrderedDict()  # least recently read first
        self._lock = threading.Lock()  # guards _read_fds: reads run on the loop, deletes in GC
        ids = self.log_ids()
        self.current_id = (ids[-1] + 1) if ids else 1
        self._write_fd = -1
        self._write_offset = 0
        # Set when a write or sync of the current log failed: its tail is in an unknown
        # state (a short write, pages the kernel dropped after a failed fsync), and the
        # fd is O_APPEND, so the next flush starts a new log rather than trust an offset.
        self._broken = False

    def _path(self, log_id: int) -> Path:
        return self.directory / f"entrylog-{log_id:08x}.log"

    def log_ids(self) -> list[int]:
        ids = []
        for p in self.directory.glob("entrylog-*.log"):
            try:
                ids.append(int(p.stem.split("-", 1)[1], 16))
            except ValueError:
                raise DataDirectoryError(f"unexpected file among the entry logs: {p}") from None
        return sorted(ids)

    def file_sizes(self) -> dict[int, int]:
        """The bytes in each entry log file (a log deleted meanwhile is left out)."""
        out: dict[int, int] = {}
        for log_id in self.log_ids():
            try:
                out[log_id] = self._path(log_id).stat().st_size
            except FileNotFoundError:
                continue
        return out

    def append(self, parts: list[bytes], sizes: list[int]) -> tuple[int, list[int]]:
        """Write records to the current log and fsync; (log id, offset of each record).

        ``parts`` are the records' bytes in order (a record may be several parts) and
        ``sizes`` each record's total length. A new log is started for every flush
        after a restart (``current_id`` is past every existing log), so a log never
        has a torn tail followed by new data.
        """
        if self._broken or self._write_fd < 0 or self._write_offset >= self.max_file_bytes:
            self._roll()
        start = self._write_offset
        offsets = [start + before for before in accumulate(sizes, initial=0)]
        try:
            written = write_all(self._write_fd, parts)
            fail_if("entrylog-write")  # as an error after the bytes went out (a torn write)
            fail_if("entrylog-sync")
            os.fdatasync(self._write_fd)
        except OSError:
            self._broken = True
            raise
        self._write_offset = offsets.pop()
        assert written == self._write_offset - start
        return self.current_id, offsets

    def roll(self) -> None:
        """Start the next log now (compaction can only rewrite logs no longer written)."""
        if self._write_fd >= 0:
            self._roll()

    def _roll(self) -> None:
        if self._write_fd >= 0:
            fd, self._write_fd = self._write_fd, -1
            self.current_id += 1
            try:
                os.close(fd)
            except OSError:
                pass  # a close after a failed write may report it again; the log is done
        path = self._path(self.current_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            raise
        self._write_fd = fd
        self._write_offset = os.fstat(fd).st_size
        self._broken = False

    def _take(self, log_id: int) -> _ReadFd:
        """The log open for reading, in use until _give_back (at most MAX_READ_FDS stay
        open: the least recently read idle ones are closed)."""
        with self._lock:
            handle = self._read_fds.get(log_id)
            if handle is None:
                handle = self._read_fds[log_id] = _ReadFd(os.open(self._path(log_id), os.O_RDONLY))
            self._read_fds.move_to_end(log_id)
            handle.users += 1
            while len(self._read_fds) > MAX_READ_FDS:
                _, oldest = self._read_fds.popitem(last=False)
                self._retire(oldest)
            return handle

    def _give_back(self, handle: _ReadFd) -> None:
        with self._lock:
            handle.users -= 1
            if handle.retired and handle.users == 0:
                os.close(handle.fd)

    @staticmethod
    def _retire(handle: _ReadFd) -> None:
        """(Under the lock.) Close it now if idle, else when its last read ends."""
        handle.retired = True
        if handle.users == 0:
            os.close(handle.fd)

    def open_for_reads(self) -> int:
        """Entry logs open for reading now (bounded by MAX_READ_FDS)."""
        with self._lock:
            return len(self._read_fds)

    def read_record(self, log_id: int, offset: int, length: int) -> bytes:
        """The framed record at a location, CRC-checked."""
        try:
            handle = self._take(log_id)
        except OSError as e:
            raise StorageIOError(f"entry log {log_id:08x} unreadable: {e}") from None
        try:
            data = os.pread(handle.fd, length, offset)
        except OSError as e:
            raise StorageIOError(f"entry log {log_id:08x} unreadable: {e}") from None
        finally:
            self._give_back(handle)
        try:
            parse_frame(data, 0)
        except (RecordError, EOFError) as e:
            raise StorageIOError(
                f"entry log {log_id:08x} offset {offset}: stored entry is damaged ({e or 'short read'})"
            ) from None
        return data

    def read(self, log_id: int, offset: int, length: int) -> StoredEntry:
        data = self.read_record(log_id, offset, length)
        body, _ = parse_frame(data, 0)
        try:
            return decode_entry(body)
        except RecordError as e:
            raise StorageIOError(f"entry log {log_id:08x} offset {offset}: {e}") from None

    def delete(self, log_id: int) -> None:
        with self._lock:
            handle = self._read_fds.pop(log_id, None)
            if handle is not None:
                self._retire(handle)
        self._path(log_id).unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            for handle in self._read_fds.values():
                self._retire(handle)
            self._read_fds.clear()
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1
