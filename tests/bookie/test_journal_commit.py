"""How the journal commits: preallocated files (a sync needs no metadata commit) and, while
it is idle and the disk fast, the write and sync on the event loop. In process, on the
real disk; faults come from the failpoints."""

from __future__ import annotations

import asyncio
import errno
import shutil
import threading
import time
from pathlib import Path

import pytest

from bookie import failpoints
from bookie.journal import Journal
from bookie.records import StoredEntry, encode_entry


def record(entry: int, size: int = 200) -> bytes:
    return encode_entry(
        StoredEntry(1, entry, entry - 1, 0, 0, b"key", b"dg", bytes([entry % 256]) * size)
    )


def replayed(directory: Path) -> list[bytes]:
    return [rec for _, rec, _ in Journal(directory).replay()]


@pytest.fixture(autouse=True)
def _disarm() -> object:
    yield
    failpoints.disarm()


async def started(directory: Path, **kw: float) -> Journal:
    j = Journal(directory, **kw)  # type: ignore[arg-type]
    list(j.replay())
    j.start()
    return j


async def test_files_are_preallocated_and_a_crash_leaves_zeros_replay_stops_at(
    tmp_path: Path,
) -> None:
    j = await started(tmp_path / "j", prealloc_bytes=1 << 20)
    records = [record(i) for i in range(20)]
    for r in records:
        await j.append([r], len(r))
    (path,) = (tmp_path / "j").glob("journal-*.log")
    end = j.position.offset
    assert path.stat().st_size >= 1 << 20 > end  # allocated ahead of the records
    # A crash now (the process gone, the file as it is): a copy of the directory.
    shutil.copytree(tmp_path / "j", tmp_path / "crashed")
    (copy,) = (tmp_path / "crashed").glob("journal-*.log")
    assert replayed(tmp_path / "crashed") == records
    assert copy.stat().st_size == path.stat().st_size  # zeros are the end, nothing to cut
    # A record torn inside the preallocated space (a crash mid-write) is cut, zeros and all.
    with open(copy, "r+b") as f:
        f.seek(end)
        f.write(record(20)[:-7])
    assert replayed(tmp_path / "crashed") == records
    assert copy.stat().st_size == end
    # A clean close gives the unused space back.
    await j.close()
    assert path.stat().st_size == end
    assert replayed(tmp_path / "j") == records


async def test_a_rotation_cuts_the_finished_files_preallocated_tail(tmp_path: Path) -> None:
    j = await started(tmp_path, max_file_bytes=3000, prealloc_bytes=1 << 20)
    records = [record(i, size=400) for i in range(30)]
    for r in records:
        await j.append([r], len(r))
    files = sorted(tmp_path.glob("journal-*.log"))
    assert len(files) > 3
    assert all(f.stat().st_size < 3000 + 1000 for f in files[:-1])  # no preallocated tail
    assert files[-1].stat().st_size >= 1 << 20
    await j.close()
    assert replayed(tmp_path) == records


async def test_without_preallocation_the_writes_grow_the_file(tmp_path: Path) -> None:
    j = await started(tmp_path, prealloc_bytes=0)
    await j.append([record(0)], 0)
    (path,) = tmp_path.glob("journal-*.log")
    assert path.stat().st_size == j.position.offset
    await j.close()


async def test_an_idle_journal_commits_on_the_loop_until_a_sync_is_slow(tmp_path: Path) -> None:
    j = await started(tmp_path, inline_sync_s=0.005)
    await j.append([record(0)], 0)
    assert j.inline_commits == 0  # a new file's first write preallocates it: in the thread
    await j.append([record(0)], 0)
    assert j.inline_commits == 1  # idle, small, room allocated: no thread hop

    # A slow disk: this sync takes longer than inline_sync_s (failure injection).
    failpoints.arm("journal-sync", lambda step: time.sleep(0.05))
    await j.append([record(1)], 0)
    assert j.inline_commits == 2  # it did not know yet
    failpoints.disarm()

    # Now the next commit goes to the writer thread: while its sync hangs, the event
    # loop runs on (it would hang with it on the loop).
    release, syncing = threading.Event(), threading.Event()

    def hang(step: str) -> None:
        syncing.set()
        assert release.wait(30)

    failpoints.arm("journal-sync", hang)
    durable = j.append([record(2)], 0)
    assert await asyncio.to_thread(syncing.wait, 30)
    for _ in range(3):
        await asyncio.sleep(0)  # the loop is free: this returns
    assert not durable.done() and j.inline_commits == 2
    release.set()
    await durable
    failpoints.disarm()

    # A sync within the bound again (the thread's, under this generous one) brings the
    # loop commits back.
    j.inline_sync_s = 30.0
    await j.append([record(3)], 0)
    assert j.inline_commits == 3
    await j.close()
    assert replayed(tmp_path) == [record(0)] + [record(i) for i in range(4)]


async def test_a_busy_journal_and_big_groups_commit_in_the_thread(tmp_path: Path) -> None:
    j = await started(tmp_path, inline_sync_s=30.0)
    big = record(0, size=300 << 10)  # past the most written on the loop
    await j.append([big], len(big))
    assert j.inline_commits == 0
    # Two groups queued at once: the first has one behind it, so it goes to the thread.
    j.max_batch_bytes = 1  # each append opens a group of its own
    first, second = j.append([record(1)], 1), j.append([record(2)], 1)
    await asyncio.gather(first, second)
    assert j.inline_commits == 1  # only the last, with nothing queued behind it
    await j.close()
    assert replayed(tmp_path) == [big, record(1), record(2)]


async def test_a_failed_sync_on_the_loop_fails_its_group_and_the_next_repairs(
    tmp_path: Path,
) -> None:
    j = await started(tmp_path, inline_sync_s=30.0)
    await j.append([record(0)], 0)
    failpoints.arm("journal-sync", "EIO*1")
    with pytest.raises(OSError) as failed:
        await j.append([record(1)], 0)
    assert failed.value.errno == errno.EIO and j.fault is not None
    assert j.inline_commits == 1  # the failed one: on the loop
    await j.append([record(2)], 0)  # repaired in the thread, in a new file
    assert j.fault is None and j.inline_commits == 1
    await j.close()
    # The failed group was never acknowledged; what replays is what was.
    assert replayed(tmp_path) == [record(0), record(2)]
