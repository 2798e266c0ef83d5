"""In-process tests of one layer at a time: records, journal, storage, cookies."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from bookie.cookie import check_cookie
from bookie.errors import CookieError, JournalCorruptError, NoSuchEntryError, NoSuchLedgerError
from bookie.journal import Journal, write_all
from bookie.records import RecordError, StoredEntry, decode_entry, encode_entry, parse_frame
from bookie.storage import LedgerStorage, cached_entry


def stored(ledger: int, entry: int, size: int = 100, flags: int = 0) -> StoredEntry:
    return StoredEntry(
        ledger, entry, entry - 1, flags, 0, b"key", b"dg", bytes([entry % 256]) * size
    )


def test_record_round_trip_and_crc_check() -> None:
    e = stored(1, 2)
    rec = encode_entry(e)
    body, end = parse_frame(rec, 0)
    assert end == len(rec) and decode_entry(body) == e
    damaged = bytearray(rec)
    damaged[-1] ^= 1
    with pytest.raises(RecordError):
        parse_frame(bytes(damaged), 0)


async def submit(s: LedgerStorage, entries: list[StoredEntry]) -> None:
    """What the service does for one AddRequest, through the storage's own API."""
    items = [cached_entry(e) for e in entries]
    for h, _, _ in items:
        s.check_add(h, read_only=False)
    await s.submit(items, [part for _, head, body in items for part in (head, body)], 0)


async def write_journal(directory: Path, entries: list[StoredEntry], **kw: int) -> None:
    j = Journal(directory, **kw)
    list(j.replay())
    j.start()
    for e in entries:  # one commit group each, so the file holds many writes
        await j.append([encode_entry(e)], 0)
    await j.close()


async def test_journal_replays_everything_after_a_restart_across_rotation(tmp_path: Path) -> None:
    entries = [stored(1, i, size=300) for i in range(40)]
    await write_journal(tmp_path, entries, max_file_bytes=2000)
    assert len(list(tmp_path.glob("journal-*.log"))) > 3
    replayed = [rec for _, rec, _ in Journal(tmp_path).replay()]
    assert replayed == [encode_entry(e) for e in entries]


async def test_journal_cuts_a_torn_tail_but_refuses_damage_before_valid_records(
    tmp_path: Path,
) -> None:
    entries = [stored(1, i) for i in range(10)]
    await write_journal(tmp_path, entries)
    (path,) = sorted(tmp_path.glob("journal-*.log"))[-1:]
    good = path.read_bytes()
    path.write_bytes(good + encode_entry(stored(1, 10))[:-5])
    assert [rec for _, rec, _ in Journal(tmp_path).replay()] == [encode_entry(e) for e in entries]
    assert path.read_bytes() == good  # cut back to the last whole record
    data = bytearray(good)
    data[good.find(entries[4].payload) + 1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(
        JournalCorruptError, match=rf"{path.name}: corrupt journal record at offset \d+"
    ):
        list(Journal(tmp_path).replay())


async def test_flush_moves_the_checkpoint_and_drops_journal_files_before_it(tmp_path: Path) -> None:
    s = LedgerStorage(
        tmp_path / "j", tmp_path / "d", flush_interval_s=3600, journal_max_file_bytes=2000
    )
    await s.start()
    for i in range(20):
        await submit(s, [stored(1, i, size=300)])
    assert len(list((tmp_path / "j").glob("journal-*.log"))) > 3  # rotated
    await s.flush()
    assert list(s.journal.replay()) == []  # everything is before the mark
    assert len(list((tmp_path / "j").glob("journal-*.log"))) == 1
    assert s.read_entry(1, 3).payload == stored(1, 3, size=300).payload
    await s.close()


async def test_compaction_rewrites_logs_with_little_live_data(tmp_path: Path) -> None:
    s = LedgerStorage(tmp_path / "j", tmp_path / "d", flush_interval_s=3600)
    await s.start()
    for ledger in (1, 2):
        await submit(s, [stored(ledger, i, size=1000) for i in range(20)])
        await s.flush()
        s.entrylog.roll()

    async def first_entry(ledger_id: int) -> int | None:
        return 0 if ledger_id == 2 else None

    assert (await s.collect_garbage(first_entry)).deleted == [1]
    removed = await s.compact(0.5)
    assert removed  # ledger 1's log held no live data
    assert all(s.read_entry(2, i).payload == stored(2, i, size=1000).payload for i in range(20))
    with pytest.raises(NoSuchLedgerError):
        s.read_entry(1, 0)
    await s.close()


async def test_gc_deletes_nothing_when_the_metadata_read_fails(tmp_path: Path) -> None:
    s = LedgerStorage(tmp_path / "j", tmp_path / "d", flush_interval_s=3600)
    await s.start()
    e = stored(5, 0)
    await submit(s, [e])

    async def broken(ledger_id: int) -> int | None:
        raise ConnectionError("metadata store unreachable")

    with pytest.raises(ConnectionError):
        await s.collect_garbage(broken)
    assert s.read_entry(5, 0) == e
    with pytest.raises(NoSuchEntryError):
        s.read_entry(5, 1)
    await s.close()


async def test_cookie_rules(tmp_path: Path) -> None:
    remote: dict[str, object] = {}

    async def read():  # type: ignore[no-untyped-def]
        return remote.get("c")

    async def write(c):  # type: ignore[no-untyped-def]
        remote["c"] = c

    data, journal = tmp_path / "d", tmp_path / "j"
    data.mkdir()
    journal.mkdir()
    first = await check_cookie("b1", journal, data, 0, read, write)
    assert remote["c"] == first
    assert (await check_cookie("b1", journal, data, 0, read, write)) == first
    with pytest.raises(CookieError, match="directories belong to bookie b1"):
        await check_cookie("b2", journal, data, 0, read, write)
    (journal / "cookie").unlink()
    with pytest.raises(CookieError, match="decommission"):
        await check_cookie("b1", journal, data, 0, read, write)
    (data / "cookie").unlink()
    with pytest.raises(CookieError, match="decommission"):
        await check_cookie("b1", journal, data, 0, read, write)


def test_write_all_writes_every_buffer_in_order(tmp_path: Path) -> None:
    # More buffers than one writev takes, with empty ones among them.
    buffers = [bytes([i % 256]) * (i % 7) for i in range(5000)]
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        assert write_all(fd, buffers) == sum(map(len, buffers))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(buffers)


async def _storage_with_an_add_on_its_way_to_disk(
    tmp_path: Path, ledger: int
) -> tuple[LedgerStorage, threading.Event, asyncio.Future[object]]:
    """A storage whose journal write blocks until the event is set, with entry 1 of
    `ledger` accepted (checked) and submitted, not yet durable; entry 0 is durable."""
    s = LedgerStorage(tmp_path / "j", tmp_path / "d", flush_interval_s=3600)
    await s.start()
    await submit(s, [stored(ledger, 0)])  # the ledger exists here
    release = threading.Event()
    write = s.journal._write

    def slow_write(records: list[bytes]):  # type: ignore[no-untyped-def]
        assert release.wait(30)
        return write(records)

    s.journal._write = slow_write  # type: ignore[method-assign]
    item = cached_entry(stored(ledger, 1))
    s.check_add(item[0], read_only=False)  # accepted: checked before any fence
    durable = s.submit([item], [item[1], item[2]], 0)
    await asyncio.sleep(0)  # the journal writer may take the group
    return s, release, durable  # type: ignore[return-value]


async def _fence_while_an_accepted_add_is_on_its_way_to_disk(tmp_path: Path, change: str) -> None:
    """An add accepted before a fence (or a term change) but not yet durable must be
    readable when the fencing read is answered: recovery reads right after, and the add
    is acknowledged as soon as its journal write ends."""
    s, release, durable = await _storage_with_an_add_on_its_way_to_disk(tmp_path, 7)
    if change == "fence":
        settling = asyncio.ensure_future(s.fence(7, b"key"))
    else:
        settling = asyncio.ensure_future(s.adopt_term(7, b"key", 5))
    done, _ = await asyncio.wait([settling], timeout=0.2)
    assert not done, "the state change was answered before an accepted add was durable"
    with pytest.raises(NoSuchEntryError):
        s.read_entry(7, 1)
    release.set()
    st = await asyncio.wait_for(settling, 30)
    assert durable.done()
    assert s.read_entry(7, 1).payload == stored(7, 1).payload  # what recovery reads now
    assert st.lac >= 0 and (st.fenced if change == "fence" else st.term == 5)
    await s.close()


async def test_a_fence_waits_for_adds_accepted_before_it(tmp_path: Path) -> None:
    await _fence_while_an_accepted_add_is_on_its_way_to_disk(tmp_path, "fence")


async def test_a_term_change_waits_for_adds_accepted_before_it(tmp_path: Path) -> None:
    await _fence_while_an_accepted_add_is_on_its_way_to_disk(tmp_path, "term")


async def test_gc_deletes_entries_below_the_first_listed_entry(tmp_path: Path) -> None:
    s = LedgerStorage(tmp_path / "j", tmp_path / "d", flush_interval_s=3600)
    await s.start()
    await submit(s, [stored(3, i) for i in range(10)])
    await s.flush()
    await submit(s, [stored(3, i) for i in range(10, 14)])  # still in the write cache
    await submit(s, [stored(4, i) for i in range(3)])
    firsts = {3: 12, 4: 0}

    async def first_entry(ledger_id: int) -> int | None:
        return firsts[ledger_id]

    collected = await s.collect_garbage(first_entry)
    assert collected.deleted == [] and collected.trimmed == {3: 10}
    for i in range(12):
        with pytest.raises(NoSuchEntryError):
            s.read_entry(3, i)
    assert [s.read_entry(3, i).payload for i in (12, 13)] == [
        stored(3, 12).payload,
        stored(3, 13).payload,
    ]
    assert all(s.read_entry(4, i) == stored(4, i) for i in range(3))
    await s.flush()  # what the cache held below the first entry does not come back
    with pytest.raises(NoSuchEntryError):
        s.read_entry(3, 11)
    await s.close()


async def test_a_fence_whose_read_was_cancelled_is_still_made_durable_before_any_answer(
    tmp_path: Path,
) -> None:
    """A fencing read cancelled while it waits (its deadline passed) must not leave the
    fence in memory only: the next fencing read waits until it is on disk."""
    s, release, _ = await _storage_with_an_add_on_its_way_to_disk(tmp_path, 8)
    first = asyncio.ensure_future(s.fence(8, b"key"))
    await asyncio.sleep(0.05)
    first.cancel()  # the read's deadline: the fence is set in memory, not yet on disk
    await asyncio.gather(first, return_exceptions=True)
    release.set()  # the journal catches up; nothing else is queued
    st = await asyncio.wait_for(s.fence(8, b"key"), 30)
    stored_state = s.index.get_state(8)
    assert st.fenced and stored_state is not None and stored_state.fenced, (
        "a fence was answered while it was only in memory"
    )
    await s.close()
