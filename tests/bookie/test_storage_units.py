"""In-process tests of one layer at a time: records, journal, storage, cookies."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import uuid
from pathlib import Path

import pytest

import metadata
from bookie.cookie import BookieCookie, check_cookie
from bookie.errors import (
    CookieError,
    GcRefusedError,
    JournalCorruptError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from bookie.journal import Journal, write_all
from bookie.meta import MetadataLink
from bookie.records import RecordError, StoredEntry, decode_entry, encode_entry, parse_frame
from bookie.storage import LedgerStorage, cached_entry
from metadata.schemas import Cookie
from metadata.services.cluster import ClusterInstance
from metadata.services.cookies import CookieStore


def stored(ledger: int, entry: int, size: int = 100, flags: int = 0, term: int = 0) -> StoredEntry:
    return StoredEntry(
        ledger, entry, entry - 1, flags, term, b"key", b"dg", bytes([entry % 256]) * size
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


async def _store_link(bookie_id: str = "b1") -> tuple[metadata.MetadataStore, MetadataLink]:
    """A fresh in-process store (memory://) and the bookie's real link to it."""
    store = await metadata.connect(f"memory://cookie-{uuid.uuid4().hex}")
    return store, MetadataLink(store, bookie_id, 10.0)


async def test_cookie_rules(tmp_path: Path) -> None:
    store, link = await _store_link()
    data, journal = tmp_path / "d", tmp_path / "j"
    data.mkdir()
    journal.mkdir()
    first = await check_cookie("b1", journal, data, 0, link)
    assert await link.read_cookie() == first
    assert first.cluster_instance_id == await ClusterInstance(store).read() != ""
    assert (await check_cookie("b1", journal, data, 0, link)) == first
    with pytest.raises(CookieError, match="directories belong to bookie b1"):
        await check_cookie("b2", journal, data, 0, MetadataLink(store, "b2", 10.0))
    (journal / "cookie").unlink()
    partly = re.escape(f"decommission b1 --metadata {link.uri}") + ".*" + re.escape(f"empty {data}")
    with pytest.raises(CookieError, match=partly):
        await check_cookie("b1", journal, data, 0, link)
    (data / "cookie").unlink()
    wiped = re.escape(f"`streamlib admin decommission b1 --metadata {link.uri}`")
    with pytest.raises(CookieError, match=wiped):
        await check_cookie("b1", journal, data, 0, link)
    await CookieStore(store).delete("b1")  # what the decommission does last
    again = await check_cookie("b1", journal, data, 0, link)
    assert again.instance_id != first.instance_id
    assert again.cluster_instance_id == first.cluster_instance_id
    await store.close()


async def test_a_cookie_is_republished_only_to_a_store_of_its_own_cluster(tmp_path: Path) -> None:
    store, link = await _store_link()
    first = await check_cookie("b1", tmp_path, tmp_path, 0, link)
    # A crash between the disk write and the store write: the store lacks the cookie.
    await CookieStore(store).delete("b1")
    assert await check_cookie("b1", tmp_path, tmp_path, 0, link) == first
    assert await link.read_cookie() == first

    empty_store, empty = await _store_link()
    with pytest.raises(CookieError, match="has no cluster instance id"):
        await check_cookie("b1", tmp_path, tmp_path, 0, empty)
    other_store, other = await _store_link()
    theirs = await ClusterInstance(other_store).create_if_absent()
    with pytest.raises(
        CookieError, match=f"cluster {first.cluster_instance_id} .* cluster {theirs}"
    ):
        await check_cookie("b1", tmp_path, tmp_path, 0, other)
    for refused in (empty, other):  # a refusal changes nothing
        assert await refused.read_cookie() is None
    assert await ClusterInstance(empty_store).read() is None
    assert BookieCookie.from_json((tmp_path / "cookie").read_bytes(), "") == first

    moved = await check_cookie("b1", tmp_path, tmp_path, 0, other, allow_new_cluster=True)
    assert moved.cluster_instance_id == theirs and moved.same_identity(first)
    assert await other.read_cookie() == moved
    assert BookieCookie.from_json((tmp_path / "cookie").read_bytes(), "") == moved
    with pytest.raises(CookieError, match="cluster"):  # and it no longer fits the first store
        await check_cookie("b1", tmp_path, tmp_path, 0, link)
    for s in (store, empty_store, other_store):
        await s.close()


async def test_a_cookie_older_than_cluster_ids_is_adopted_only_by_a_store_that_knows_it(
    tmp_path: Path,
) -> None:
    """Old cookies load with an unknown cluster ("") and take on the store's id on the
    first start against a store holding the same bookie's cookie (the store it was
    formatted against; for a store written before cluster ids, the id is made then)."""
    old = {"bookie_id": "b1", "instance_id": "i-1", "journal_dir": str(tmp_path)}
    (tmp_path / "cookie").write_text(json.dumps({**old, "data_dirs": [str(tmp_path)]}))
    legacy = BookieCookie.from_json((tmp_path / "cookie").read_bytes(), "")
    assert legacy.cluster_instance_id == ""

    unknown_store, unknown = await _store_link()
    await ClusterInstance(unknown_store).create_if_absent()
    with pytest.raises(CookieError, match="predates cluster instance ids"):
        await check_cookie("b1", tmp_path, tmp_path, 0, unknown)

    store, link = await _store_link()  # a store from before cluster ids, with our cookie
    await CookieStore(store).write(
        Cookie(
            bookie_id="b1", instance_id="i-1", journal_dir=str(tmp_path), data_dirs=[str(tmp_path)]
        )
    )
    adopted = await check_cookie("b1", tmp_path, tmp_path, 0, link)
    assert adopted.same_identity(legacy)
    assert adopted.cluster_instance_id == await ClusterInstance(store).read() != ""
    assert await link.read_cookie() == adopted
    assert BookieCookie.from_json((tmp_path / "cookie").read_bytes(), "") == adopted
    for s in (store, unknown_store):
        await s.close()


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
    tmp_path: Path, ledger: int, term: int = 0
) -> tuple[LedgerStorage, threading.Event, asyncio.Future[object]]:
    """A storage whose journal write blocks until the event is set, with entry 1 of
    `ledger` accepted (checked) and submitted, not yet durable; entry 0 is durable."""
    s = LedgerStorage(tmp_path / "j", tmp_path / "d", flush_interval_s=3600)
    await s.start()
    await submit(s, [stored(ledger, 0, term=term)])  # the ledger exists here
    release = threading.Event()
    write = s.journal._write
    s.journal.inline_sync_s = 0  # in the writer thread: the loop runs on while it waits

    def slow_write(records: list[bytes]):  # type: ignore[no-untyped-def]
        assert release.wait(30)
        return write(records)

    s.journal._write = slow_write  # type: ignore[method-assign]
    item = cached_entry(stored(ledger, 1, term=term))
    s.check_add(item[0], read_only=False)  # accepted: checked before any fence
    durable = s.submit([item], [item[1], item[2]], 0)
    await asyncio.sleep(0)  # the journal writer may take the group
    return s, release, durable  # type: ignore[return-value]


async def _fence_while_an_accepted_add_is_on_its_way_to_disk(tmp_path: Path, change: str) -> None:
    """An add accepted before a fence (or a term change) but not yet durable must be
    readable when the fencing read is answered: recovery reads right after, and the add
    is acknowledged as soon as its journal write ends."""
    # A term change needs a term-mode ledger (its adds carry term 1).
    term = 0 if change == "fence" else 1
    s, release, durable = await _storage_with_an_add_on_its_way_to_disk(tmp_path, 7, term)
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


async def test_gc_refuses_when_most_ledgers_vanish_at_once_but_not_on_a_tiny_bookie(
    tmp_path: Path,
) -> None:
    s = LedgerStorage(tmp_path / "j", tmp_path / "d", flush_interval_s=3600)
    await s.start()
    await submit(s, [stored(ledger, 0) for ledger in range(1, 13)])
    await s.flush()
    guard = {"max_vanished_fraction": 0.5, "vanish_check_min_ledgers": 10}

    async def six_gone(ledger_id: int) -> int | None:
        return None if ledger_id <= 6 else 0

    async def seven_gone(ledger_id: int) -> int | None:
        return None if ledger_id <= 7 else 0

    assert (await s.collect_garbage(six_gone, **guard)).deleted == [1, 2, 3, 4, 5, 6]  # type: ignore[arg-type]
    await submit(s, [stored(ledger, 0) for ledger in range(1, 7)])
    with pytest.raises(GcRefusedError, match="7 of this bookie's 12 ledgers") as refused:
        await s.collect_garbage(seven_gone, **guard)  # type: ignore[arg-type]
    assert refused.value.reason == "mass_vanish"
    assert all(s.read_entry(ledger, 0) == stored(ledger, 0) for ledger in range(1, 13))
    assert (await s.collect_garbage(seven_gone)).deleted == list(range(1, 8))  # no guard
    await s.close()

    # A bookie under the minimum is collected whatever the fraction: a tiny cluster that
    # deletes its only ledger.
    tiny = LedgerStorage(tmp_path / "j2", tmp_path / "d2", flush_interval_s=3600)
    await tiny.start()
    await submit(tiny, [stored(1, 0)])

    async def all_gone(ledger_id: int) -> int | None:
        return None

    assert (await tiny.collect_garbage(all_gone, **guard)).deleted == [1]  # type: ignore[arg-type]
    await tiny.close()


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
    assert collected.deleted == [] and collected.trimmed == {3: 12}  # 10 flushed + 2 cached
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
