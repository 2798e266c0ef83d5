"""Disk faults under a bookie's storage, injected through the failpoints (bookie/failpoints.py)
at the real write paths of a real journal, entry log and index on disk: after each, every
acknowledged entry reads back intact or the read fails with an I/O error -- never other
bytes, never "no such entry" -- and the storage goes on once the disk does."""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookie import failpoints
from bookie.errors import NoSuchEntryError
from bookie.records import StoredEntry
from bookie.storage import LedgerStorage
from bookie.wire import bookie_pb2 as pb
from tests.bookie.test_storage_units import submit as add  # raises if the journal failed

KEY = b"key"


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    yield
    failpoints.disarm()


def entry(ledger: int, e: int, *, term: int = 0, flags: int = 0, size: int = 300) -> StoredEntry:
    payload = (f"{ledger}:{e}:".encode() * size)[:size]
    return StoredEntry(ledger, e, e - 1, flags, term, KEY, b"dg", payload)


async def opened(root: Path) -> LedgerStorage:
    s = LedgerStorage(root / "journal", root / "data", flush_interval_s=3600)
    await s.start()
    return s


def assert_reads_back(s: LedgerStorage, acknowledged: list[StoredEntry]) -> None:
    for e in acknowledged:
        got = s.read_entry(e.ledger_id, e.entry_id)
        assert (got.payload, got.entry_id) == (e.payload, e.entry_id)


@pytest.mark.parametrize("step", ["entrylog-write", "entrylog-sync"])
async def test_a_failed_entry_log_write_or_sync_never_serves_other_bytes(
    tmp_path: Path, step: str
) -> None:
    s = await opened(tmp_path)
    first = [entry(1, i) for i in range(4)]
    await add(s, first)
    await s.flush()
    second = [entry(1, i) for i in range(4, 8)]
    await add(s, second)
    failpoints.arm(step, "EIO*1")
    with pytest.raises(OSError, match="flush failed"):
        await s.flush()
    assert s.fault is not None and "flush failed" in s.fault
    assert_reads_back(s, first + second)  # the batch is back in the cache
    await s.flush()  # a new entry log: never an offset the failed write left stale
    assert s.fault is None
    third = [entry(1, i) for i in range(8, 10)]
    await add(s, third)
    await s.flush()
    assert_reads_back(s, first + second + third)
    await s.close()
    s = await opened(tmp_path)
    assert_reads_back(s, first + second + third)
    await s.close()


async def test_any_flush_failure_restores_the_batch_and_the_flush_loop_lives_on(
    tmp_path: Path,
) -> None:
    s = LedgerStorage(tmp_path / "journal", tmp_path / "data", flush_interval_s=0.01)
    await s.start()
    failures: list[str] = []

    def index_write_fails(step: str) -> None:
        failures.append(step)
        if len(failures) <= 3:
            raise RuntimeError("not an OSError: the old flush loop died of this")

    failpoints.arm("index-write", index_write_fails)
    acknowledged = [entry(2, i) for i in range(5)]
    await add(s, acknowledged)
    assert_reads_back(s, acknowledged)
    for _ in range(2000):  # bounded: the loop flushes every 10 ms
        if len(failures) > 3 and s.fault is None and not s._cache:
            break
        await asyncio.sleep(0.01)
    assert len(failures) > 3 and s.fault is None and not s._cache  # flushed by the loop
    assert_reads_back(s, acknowledged)
    await s.close()
    s = await opened(tmp_path)
    assert_reads_back(s, acknowledged)
    await s.close()


async def test_a_truncate_racing_a_flush_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    s = await opened(tmp_path)
    bounded = [entry(3, i) for i in range(6)]
    term_mode = [entry(4, i, term=1) for i in range(10)]
    await add(s, bounded + term_mode)
    paused, resume = threading.Event(), threading.Event()

    def slow_flush(step: str) -> None:
        paused.set()
        assert resume.wait(30)

    failpoints.arm("flush-before-index", slow_flush)
    flush = asyncio.ensure_future(s.flush())
    assert await asyncio.to_thread(paused.wait, 30)
    # Term 2's recovery truncates ledger 4 at entry 6 while the flush writes it.
    noop = StoredEntry(4, 6, 5, pb.TRUNCATE | pb.RECOVERY_ADD, 2, KEY, b"dg", b"")
    await add(s, [noop])
    resume.set()
    await flush  # the old flush died here of a KeyError, and left its batch unindexed
    failpoints.disarm()
    kept = bounded + term_mode[:6]
    for check in range(2):
        assert_reads_back(s, kept)
        assert s.read_entry(4, 6).flags & pb.TRUNCATE
        for gone in (7, 8, 9):
            with pytest.raises(NoSuchEntryError):
                s.read_entry(4, gone)
        if check == 0:
            await s.flush()
            await s.close()
            s = await opened(tmp_path)
    await s.close()


@pytest.mark.parametrize(
    ("step", "code"),
    [("journal-write", errno.EIO), ("journal-sync", errno.EIO), ("journal-write", errno.ENOSPC)],
)
async def test_a_journal_failure_is_not_permanent_and_replays_cleanly(
    tmp_path: Path, step: str, code: int
) -> None:
    faults: list[str | None] = []
    s = LedgerStorage(
        tmp_path / "journal", tmp_path / "data", flush_interval_s=3600, on_fault=faults.append
    )
    await s.start()
    acknowledged = [entry(5, i) for i in range(3)]
    await add(s, acknowledged)
    failpoints.arm(step, f"{errno.errorcode[code]}*1")
    with pytest.raises(OSError) as failed:
        await add(s, [entry(5, 3)])  # never acknowledged
    assert failed.value.errno == code
    assert s.fault is not None and faults[-1] == s.fault
    # The next commit group cuts the torn file back and goes on in a new one.
    more = [entry(5, i) for i in range(3, 6)]
    await add(s, more)
    assert s.fault is None and faults[-1] is None
    acknowledged += more
    assert_reads_back(s, acknowledged)
    await s.journal.close()  # a crash: nothing flushed, the journal is all there is
    s.entrylog.close()
    s.index.close()
    s = await opened(tmp_path)  # replays: no "corrupt record in the middle"
    assert_reads_back(s, acknowledged)
    await s.close()


async def test_a_probe_heals_a_journal_fault_without_traffic(tmp_path: Path) -> None:
    s = await opened(tmp_path)
    failpoints.arm("journal-write", "ENOSPC*2")  # the failed add, then the first probe
    with pytest.raises(OSError):
        await add(s, [entry(6, 0)])
    assert await s.heal() is not None  # the disk still refuses
    assert await s.heal() is None
    await add(s, [entry(6, 0)])
    assert_reads_back(s, [entry(6, 0)])
    await s.close()


async def test_checkpointed_journal_files_are_reclaimed(tmp_path: Path) -> None:
    s = await opened(tmp_path)
    s.journal_reclaim_bytes = 1
    await add(s, [entry(7, i, size=4000) for i in range(50)])
    before = sorted(p.name for p in (tmp_path / "journal").glob("journal-*.log"))
    await s.flush()
    for _ in range(1000):  # the journal's writer reclaims in the background
        after = sorted(p.name for p in (tmp_path / "journal").glob("journal-*.log"))
        if after and after[0] > before[-1]:
            break
        await asyncio.sleep(0.01)
    assert len(after) == 1 and after[0] > before[-1]  # the file with the entries is gone
    assert (tmp_path / "journal" / after[0]).stat().st_size < 100
    await s.close()
    s = await opened(tmp_path)
    assert_reads_back(s, [entry(7, i, size=4000) for i in range(50)])
    await s.close()


@pytest.mark.parametrize("spec", ["slow=", "slow=x", "slow=-1", "slow=nan", "SLOW"])
def test_a_bad_slow_action_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="failpoint action"):
        failpoints.arm("journal-sync", spec)


async def test_a_slow_sync_delays_the_commit_and_fails_nothing(tmp_path: Path) -> None:
    s = await opened(tmp_path)
    failpoints.arm("journal-sync", " slow=0.2 ")  # as read from a failpoints file
    started = time.monotonic()
    acknowledged = [entry(8, i) for i in range(3)]
    await add(s, acknowledged)  # one commit group: one slow sync, no error
    assert time.monotonic() - started >= 0.2
    assert s.fault is None
    failpoints.disarm("journal-sync")
    await s.flush()
    assert_reads_back(s, acknowledged)
    await s.close()
