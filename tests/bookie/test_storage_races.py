"""Races between the storage's background work and its writers, each pinned down with the
failpoints (found in review of the disk-fault work): a TRUNCATE while a flush waits for
the lock, a stopping server cancelling compaction mid-write, a journal hook that raises."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookie import failpoints
from bookie.errors import NoSuchEntryError
from bookie.records import StoredEntry
from bookie.storage import LedgerStorage
from bookie.wire import bookie_pb2 as pb
from tests.bookie.test_disk_faults import assert_reads_back, entry, opened
from tests.bookie.test_storage_units import submit as add

KEY = b"key"


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    yield
    failpoints.disarm()


async def _mostly_dead_log(s: LedgerStorage, live_ledger: int, term: int = 0) -> None:
    """One entry log, mostly of a deleted ledger: the next compaction moves `live_ledger`."""
    await add(s, [entry(99, i, size=4000) for i in range(20)])
    await add(s, [entry(live_ledger, i, term=term) for i in range(10)])
    await s.flush()

    async def first_entry(ledger: int) -> int | None:
        return None if ledger == 99 else 0

    await s.collect_garbage(first_entry)


def _pause_first(step_name: str) -> tuple[threading.Event, threading.Event]:
    """Arm `step_name` so its first run waits (in its thread) until resumed."""
    paused, resume = threading.Event(), threading.Event()
    calls: list[str] = []

    def pause(step: str) -> None:
        calls.append(step)
        if len(calls) == 1:
            paused.set()
            assert resume.wait(30)

    failpoints.arm(step_name, pause)
    return paused, resume


async def _until_waiting_for_the_lock(s: LedgerStorage) -> None:
    for _ in range(1000):  # bounded: a task queues on the lock within a few loop turns
        if s._flush_lock._waiters:
            return
        await asyncio.sleep(0)
    raise AssertionError("nothing queued on the flush lock")


async def test_a_truncate_while_a_flush_waits_for_the_lock_keeps_later_entries(
    tmp_path: Path,
) -> None:
    s = await opened(tmp_path)
    await _mostly_dead_log(s, 4, term=1)
    paused, resume = _pause_first("entrylog-write")
    compaction = asyncio.ensure_future(s.compact())  # holds the flush lock, paused
    assert await asyncio.to_thread(paused.wait, 30)
    flush = asyncio.ensure_future(s.flush())  # the flush loop's tick: queued on the lock
    await _until_waiting_for_the_lock(s)
    # Term 2's recovery truncates ledger 4 at 6; its writer then adds 7 and 8.
    await add(s, [StoredEntry(4, 6, 5, pb.TRUNCATE | pb.RECOVERY_ADD, 2, KEY, b"dg", b"")])
    new = [entry(4, 7, term=2, size=200), entry(4, 8, term=2, size=200)]
    await add(s, new)
    resume.set()
    await compaction
    await flush  # the old code flushed 7 and 8, then deleted them with the TRUNCATE's index task
    assert_reads_back(s, new)
    with pytest.raises(NoSuchEntryError):
        s.read_entry(4, 9)
    await s.close()
    s = await opened(tmp_path)
    assert_reads_back(s, [entry(4, i, term=1) for i in range(6)] + new)
    await s.close()


async def test_a_cancelled_compaction_never_writes_the_entry_log_beside_a_flush(
    tmp_path: Path,
) -> None:
    s = await opened(tmp_path)
    await _mostly_dead_log(s, 4)
    paused, resume = _pause_first("entrylog-write")
    compaction = asyncio.ensure_future(s.compact())
    assert await asyncio.to_thread(paused.wait, 30)
    compaction.cancel()  # what BookieServer.stop() does to the GC loop
    await asyncio.gather(compaction, return_exceptions=True)
    acknowledged = [entry(5, i) for i in range(8)]
    await add(s, acknowledged)
    flush = asyncio.ensure_future(s.flush())  # must wait for the compaction's thread
    await _until_waiting_for_the_lock(s)
    resume.set()
    await flush
    assert_reads_back(s, acknowledged)  # old code: "entry log 2 offset 0 holds entry 4:0"
    await s.close()
    s = await opened(tmp_path)
    assert_reads_back(s, acknowledged + [entry(4, i) for i in range(10)])
    await s.close()


async def test_a_raising_journal_hook_does_not_end_the_journal_writer(tmp_path: Path) -> None:
    calls: list[int] = []

    def on_commit(entries: int, nbytes: int, fsync_s: float) -> None:
        calls.append(entries)
        if len(calls) == 1:
            raise OSError(5, "Input/output error (statvfs in the disk check)")

    s = LedgerStorage(tmp_path / "j", tmp_path / "d", flush_interval_s=3600, on_commit=on_commit)
    await s.start()
    async with asyncio.timeout(30):  # the old writer died here: every add and fence hung
        await add(s, [entry(1, 0)])
        await add(s, [entry(1, 1)])
        await s.fence(1, KEY)
    assert_reads_back(s, [entry(1, 0), entry(1, 1)])
    await s.close()
