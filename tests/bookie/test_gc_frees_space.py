"""GC gives the space of deleted ledgers back wherever their bytes are: still in the write
cache, in the entry log being written, or in entry-log bytes that only a failed flush
wrote (a full disk) -- and compaction never deletes a log holding an entry flushed while
it was counting."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from bookie import failpoints
from bookie.errors import NoSuchLedgerError
from bookie.records import encode_entry
from bookie.storage import LedgerStorage
from tests.bookie.test_disk_faults import assert_reads_back, entry, opened
from tests.bookie.test_storage_units import submit as add


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    yield
    failpoints.disarm()


async def gone(ledger: int) -> int | None:
    """The metadata lists no ledger at all: every one was deleted."""
    return None


def only(*kept: int) -> Callable[[int], Awaitable[int | None]]:
    """The metadata lists ``kept`` from their entry 0 on, and no other ledger."""

    async def first_entry(ledger: int) -> int | None:
        return 0 if ledger in kept else None

    return first_entry


def entry_log_bytes(s: LedgerStorage) -> int:
    return sum(p.stat().st_size for p in s.entrylog.directory.glob("entrylog-*.log"))


async def test_ledgers_deleted_before_their_first_flush_leave_nothing_to_compact(
    tmp_path: Path,
) -> None:
    s = await opened(tmp_path)
    await add(s, [entry(1, i, size=4000) for i in range(20)])  # in the write cache only
    assert (await s.collect_garbage(gone)).deleted == [1]
    assert await s.compact() == []  # no entry log ever held them
    await s.reclaim_journal()
    assert entry_log_bytes(s) == 0
    await s.close()
    s = await opened(tmp_path)  # the journal no longer holds them either: nothing comes back
    with pytest.raises(NoSuchLedgerError):
        s.read_entry(1, 0)
    await s.close()


@pytest.mark.parametrize("step", ["entrylog-write", "index-write"])
async def test_entry_log_bytes_only_a_failed_flush_wrote_are_freed_with_their_ledger(
    tmp_path: Path, step: str
) -> None:
    s = await opened(tmp_path)
    live = [entry(2, i) for i in range(10)]
    await add(s, live)
    await s.flush()
    await add(s, [entry(1, i, size=4000) for i in range(20)])
    # A full disk: each flush fails after its bytes went out. The index never counts
    # them (entrylog-write: a torn log, then a new log, torn as well; index-write: the
    # same log twice), and the batch waits in the write cache.
    failpoints.arm(step, "ENOSPC")
    for _ in range(2):
        with pytest.raises(OSError, match="flush failed"):
            await s.flush()
    failpoints.disarm()
    assert (await s.collect_garbage(only(2))).deleted == [1]
    assert await s.compact()  # the old code never saw those bytes: the disk stayed full
    records = sum(len(encode_entry(e)) for e in live)
    assert entry_log_bytes(s) == records  # what is left is ledger 2's, moved
    assert_reads_back(s, live)
    await s.close()
    s = await opened(tmp_path)
    assert_reads_back(s, live)
    await s.close()


async def test_entries_flushed_while_compaction_counts_live_bytes_are_moved_not_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await opened(tmp_path)
    await add(s, [entry(99, i, size=4000) for i in range(20)])
    await s.flush()
    await s.collect_garbage(gone)  # the current entry log now holds dead data only
    counted, resume = threading.Event(), threading.Event()
    count = s.index.live_bytes

    def count_then_pause() -> tuple[dict[int, int], dict[int, int]]:
        out = count()
        if not counted.is_set():
            counted.set()
            assert resume.wait(30)
        return out

    monkeypatch.setattr(s.index, "live_bytes", count_then_pause)
    compaction = asyncio.ensure_future(s.compact())
    assert await asyncio.to_thread(counted.wait, 30)
    acknowledged = [entry(5, i) for i in range(8)]
    await add(s, acknowledged)
    await s.flush()  # into the current log, which the paused count saw holding nothing live
    resume.set()
    await compaction  # the old code rolled that log, then deleted it with ledger 5's entries
    assert_reads_back(s, acknowledged)
    await s.close()
    s = await opened(tmp_path)
    assert_reads_back(s, acknowledged)
    await s.close()
