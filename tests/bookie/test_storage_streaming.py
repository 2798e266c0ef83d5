"""In-process tests of the storage's bounded paths: compaction in batches, range reads
that mix the write cache and the disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from bookie.errors import NoSuchEntryError, NoSuchLedgerError, StorageIOError
from bookie.records import StoredEntry, encode_entry
from bookie.storage import LedgerStorage
from tests.bookie.test_storage_units import submit

SIZE = 200


def stored(ledger: int, entry: int) -> StoredEntry:
    return StoredEntry(ledger, entry, entry - 1, 0, 0, b"key", b"dg", bytes([entry % 256]) * SIZE)


RECORD_BYTES = len(encode_entry(stored(1, 0)))


async def storage(tmp_path: Path) -> LedgerStorage:
    s = LedgerStorage(tmp_path / "j", tmp_path / "d", flush_interval_s=3600)
    await s.start()
    return s


async def write_log(s: LedgerStorage, ledgers: list[int], entries: int) -> int:
    """One entry log holding ``entries`` entries of each ledger; its id."""
    for ledger in ledgers:
        await submit(s, [stored(ledger, i) for i in range(entries)])
    await s.flush()
    log_id = s.entrylog.current_id
    s.entrylog.roll()
    return log_id


async def gc(s: LedgerStorage, gone: set[int]) -> None:
    async def first_entry(ledger_id: int) -> int | None:
        return None if ledger_id in gone else 0

    assert (await s.collect_garbage(first_entry)).deleted == sorted(gone)


def damage(s: LedgerStorage, ledger_id: int, entry_id: int) -> None:
    loc = s.index.get(ledger_id, entry_id)
    assert loc is not None
    log_id, offset, length = loc
    with open(s.entrylog.directory / f"entrylog-{log_id:08x}.log", "r+b") as f:
        f.seek(offset + length - 1)
        last = f.read(1)
        f.seek(offset + length - 1)
        f.write(bytes([last[0] ^ 0xFF]))


async def test_compaction_in_small_batches_moves_every_live_entry(tmp_path: Path) -> None:
    s = await storage(tmp_path)
    # Ledger 4 lives in another log, so in key order the index interleaves entries of
    # the log being compacted (ledgers 3 and 5) with entries it must leave alone.
    sparse = await write_log(s, [1, 2, 3, 5, 6], 300)
    full = await write_log(s, [4], 300)
    await gc(s, {1, 2, 6})  # 2 of 5 ledgers left: 40% live
    appends: list[tuple[int, int]] = []
    append = s.entrylog.append

    def counted(parts: list[bytes], sizes: list[int]) -> tuple[int, list[int]]:
        appends.append((len(sizes), sum(sizes)))
        return append(parts, sizes)

    s.entrylog.append = counted  # type: ignore[method-assign]
    batch_bytes = 25 * RECORD_BYTES
    assert await s.compact(0.5, batch_entries=37, batch_bytes=batch_bytes) == [sparse]
    assert sum(n for n, _ in appends) == 600
    assert len(appends) >= 600 // 25
    assert all(n <= 37 and nbytes <= batch_bytes for n, nbytes in appends)
    assert sparse not in s.entrylog.log_ids() and full in s.entrylog.log_ids()
    assert sparse not in s.index.log_sizes()
    await s.close()

    s = await storage(tmp_path)  # the index moved for good
    for ledger in (3, 4, 5):
        assert all(s.read_entry(ledger, i) == stored(ledger, i) for i in range(300))
    with pytest.raises(NoSuchLedgerError):
        s.read_entry(1, 0)
    assert await s.compact(0.5) == []  # nothing left to do
    await s.close()


async def test_compaction_keeps_a_log_whose_record_is_damaged(tmp_path: Path) -> None:
    s = await storage(tmp_path)
    sparse = await write_log(s, [1, 2, 3], 50)
    await gc(s, {1, 2})
    damage(s, 3, 17)
    assert await s.compact(0.5, batch_entries=10) == []
    assert sparse in s.entrylog.log_ids()
    with pytest.raises(StorageIOError):  # still an Unknown, never "no such entry"
        s.read_entry(3, 17)
    assert all(s.read_entry(3, i) == stored(3, i) for i in range(50) if i != 17)
    await s.close()


async def test_range_reads_mix_cache_and_disk_and_stop_at_max_bytes(tmp_path: Path) -> None:
    s = await storage(tmp_path)
    await submit(s, [stored(1, i) for i in range(10)])
    await s.flush()  # 0..9 on disk
    await submit(s, [stored(1, i) for i in range(10, 20)])  # 10..19 in the write cache

    got = await s.read_entries(1, 0, 24, 1 << 20)
    assert [(eid, e) for eid, e in got if isinstance(e, StoredEntry)] == [
        (i, stored(1, i)) for i in range(20)
    ]
    assert [eid for eid, e in got if isinstance(e, NoSuchEntryError)] == list(range(20, 25))

    def ids(found: list[tuple[int, StoredEntry | Exception]]) -> list[int]:
        return [eid for eid, _ in found]

    assert ids(await s.read_entries(1, 0, 19, 5 * SIZE + SIZE // 2)) == [0, 1, 2, 3, 4]
    assert ids(await s.read_entries(1, 8, 19, 3 * SIZE)) == [8, 9, 10]  # disk, then cache
    assert ids(await s.read_entries(1, 12, 19, 2 * SIZE)) == [12, 13]  # all in the cache
    assert ids(await s.read_entries(1, 3, 19, 1)) == [3]  # one entry, however big

    damage(s, 1, 4)
    got = await s.read_entries(1, 3, 5, 1 << 20)
    assert [type(e) for _, e in got] == [StoredEntry, StorageIOError, StoredEntry]
    assert all(isinstance(e, NoSuchLedgerError) for _, e in await s.read_entries(9, 0, 2, 100))
    await s.close()
