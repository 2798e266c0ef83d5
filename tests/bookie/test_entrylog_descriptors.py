"""An entry logger keeps a bounded number of logs open for reads, however many logs it
holds (a bookie whose disk keeps failing starts a new log at each failed write: an hour
of `streamlib chaos --disk-faults` made 90 of them, each kept open until then), and
never closes a descriptor a read is using."""

from __future__ import annotations

import os
import threading

from bookie import entrylog
from bookie.entrylog import EntryLogger
from bookie.records import frame


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def write_logs(logger: EntryLogger, count: int) -> list[tuple[int, int, int, bytes]]:
    """`count` logs of one record each: (log id, offset, length, record)."""
    found = []
    for i in range(count):
        record = frame(b"entry %d" % i)
        log_id, (offset,) = logger.append([record], [len(record)])
        found.append((log_id, offset, len(record), record))
        logger.roll()
    return found


def test_reading_many_logs_keeps_few_open(tmp_path):
    logger = EntryLogger(tmp_path)
    try:
        records = write_logs(logger, entrylog.MAX_READ_FDS + 40)
        before = open_descriptors()
        for _ in range(2):
            for log_id, offset, length, record in records:
                assert logger.read_record(log_id, offset, length) == record
        assert logger.open_for_reads() == entrylog.MAX_READ_FDS
        assert open_descriptors() - before <= entrylog.MAX_READ_FDS
    finally:
        logger.close()


def test_a_log_closed_for_room_while_a_read_uses_it_is_closed_after(tmp_path, monkeypatch):
    monkeypatch.setattr(entrylog, "MAX_READ_FDS", 1)
    logger = EntryLogger(tmp_path)
    try:
        (first, second) = write_logs(logger, 2)
        inside, go_on = threading.Event(), threading.Event()
        real_pread = os.pread

        def slow_pread(fd: int, length: int, offset: int) -> bytes:
            if not inside.is_set():
                inside.set()
                assert go_on.wait(10)
            return real_pread(fd, length, offset)

        monkeypatch.setattr(entrylog.os, "pread", slow_pread)
        results: list[bytes] = []
        reading = threading.Thread(target=lambda: results.append(logger.read_record(*first[:3])))
        reading.start()
        assert inside.wait(10)
        # Another log read now pushes the first out of the cache while it is read from.
        assert logger.read_record(*second[:3]) == second[3]
        go_on.set()
        reading.join(10)
        assert results == [first[3]]  # (its descriptor stayed open until the read ended)
        assert logger.open_for_reads() == 1
    finally:
        logger.close()
