"""Crash and corruption scenarios against real bookie processes."""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import grpc
import pytest

from bookie.failpoints import EXIT_CODE
from bookie.wire import add_results
from bookie.wire import bookie_pb2 as pb
from tests.bookie.conftest import Cluster, entry, payload_of

NEVER_FLUSH = ["--flush-interval", "3600"]


def journal_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "journal").glob("journal-*.log"))


def assert_reads_back(client, ledger_id: int, entry_ids: list[int], size: int) -> None:  # type: ignore[no-untyped-def]
    wanted = sorted(entry_ids)
    for start in range(0, len(wanted), 400):
        chunk = wanted[start : start + 400]
        resp = client.read(ledger_id, chunk[0], chunk[-1])
        assert resp.status == pb.OK, resp.message
        got = {r.entry_id: r for r in resp.results}
        for eid in chunk:
            r = got[eid]
            assert r.status == pb.OK, (eid, r.message)
            assert r.entry.payload == payload_of(ledger_id, eid, size)
            assert r.entry.digest == b"digest-%d" % eid
            assert r.entry.length == (eid + 1) * size


def test_every_acknowledged_entry_reads_back_after_sigkill_during_adds(cluster: Cluster) -> None:
    bookie = cluster.bookie(extra=["--flush-interval", "0.05"])
    client = cluster.client(bookie)
    acked: list[int] = []
    enough = threading.Event()

    def requests():  # type: ignore[no-untyped-def]
        for first in range(0, 1_000_000, 20):
            yield pb.AddRequest(entries=[entry(7, i, size=512) for i in range(first, first + 20)])

    def stream() -> None:
        try:
            for resp in client.stub.AddStream(requests(), timeout=120):
                acked.extend(r.entry_id for r in add_results(resp) if r.status == pb.OK)
                if len(acked) >= 3000:
                    enough.set()
        except grpc.RpcError:
            pass  # the bookie was killed under us
        finally:
            enough.set()

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    assert enough.wait(60)
    bookie.kill()
    t.join(60)
    assert len(acked) >= 3000
    bookie.start()
    assert_reads_back(cluster.client(bookie), 7, acked, 512)


def test_crash_between_journal_write_and_index_update_replays_the_journal(cluster: Cluster) -> None:
    bookie = cluster.bookie(extra=NEVER_FLUSH)
    client = cluster.client(bookie)
    results = client.add(entry(3, i) for i in range(200))
    assert all(r.status == pb.OK for r in results.values())
    # Acknowledged, but only the journal has them: no entry log was written.
    assert not any(p.stat().st_size for p in (bookie.data_dir / "ledgers").glob("entrylog-*"))
    bookie.kill()
    bookie.start()
    client = cluster.client(bookie)
    assert_reads_back(client, 3, list(range(200)), 64)
    assert client.read_lac(3).last_add_confirmed == 198


@pytest.mark.parametrize("failpoint", ["flush-after-entrylog", "flush-after-index"])
def test_crash_inside_the_flush_loses_nothing(cluster: Cluster, failpoint: str) -> None:
    bookie = cluster.bookie(extra=["--flush-interval", "0.2"])
    bookie.env["BOOKIE_FAILPOINTS"] = failpoint
    bookie.kill()
    bookie.start()  # the failpoint is armed in this process only
    client = cluster.client(bookie)
    results = client.add(entry(8, i) for i in range(100))
    assert all(r.status == pb.OK for r in results.values())
    assert bookie.wait_exit() == EXIT_CODE  # the next flush died half-way
    bookie.env.clear()
    bookie.start()
    client = cluster.client(bookie)
    assert_reads_back(client, 8, list(range(100)), 64)
    assert client.add_one(entry(8, 100)).status == pb.OK


def test_torn_journal_tail_is_cut_and_the_bookie_starts(cluster: Cluster) -> None:
    bookie = cluster.bookie(extra=NEVER_FLUSH)
    client = cluster.client(bookie)
    assert all(r.status == pb.OK for r in client.add(entry(4, i) for i in range(50)).values())
    bookie.kill()
    last = journal_files(bookie.data_dir)[-1]
    with open(last, "ab") as f:  # a record whose write was cut short by the crash
        f.write(b"SLR1" + struct.pack(">II", 4000, 12345) + b"partial")
    bookie.start()
    client = cluster.client(bookie)
    assert_reads_back(client, 4, list(range(50)), 64)
    assert "torn journal tail" in bookie.stderr_tail()
    assert client.add_one(entry(4, 50)).status == pb.OK


def test_corrupt_journal_record_in_the_middle_stops_the_bookie(cluster: Cluster) -> None:
    bookie = cluster.bookie(extra=NEVER_FLUSH)
    client = cluster.client(bookie)
    for first in range(0, 60, 10):  # several commit groups
        assert all(
            r.status == pb.OK
            for r in client.add(entry(5, i) for i in range(first, first + 10)).values()
        )
    bookie.kill()
    last = journal_files(bookie.data_dir)[-1]
    data = bytearray(last.read_bytes())
    where = data.find(payload_of(5, 20))
    data[where + 3] ^= 0xFF
    last.write_bytes(bytes(data))
    rc, stderr = bookie.run_to_exit()
    assert rc != 0
    assert "JournalCorruptError" in stderr
    assert last.name in stderr and "offset" in stderr


def test_flipped_byte_in_an_entry_log_reads_as_io_error_not_no_such_entry(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)
    assert all(
        r.status == pb.OK for r in client.add(entry(6, i, size=200) for i in range(20)).values()
    )
    assert bookie.stop() == 0  # graceful: flushed to the entry logs
    (log_file,) = [p for p in (bookie.data_dir / "ledgers").glob("entrylog-*") if p.stat().st_size]
    data = bytearray(log_file.read_bytes())
    where = data.find(payload_of(6, 5, 200))
    assert where > 0
    data[where + 10] ^= 0x01
    log_file.write_bytes(bytes(data))
    bookie.start()
    client = cluster.client(bookie)
    single = client.read(6, 5)
    assert single.status == pb.OK
    assert single.results[0].status == pb.IO_ERROR
    ranged = client.read(6, 0, 19)
    statuses = {r.entry_id: r.status for r in ranged.results}
    assert statuses[5] == pb.IO_ERROR
    assert all(s == pb.OK for eid, s in statuses.items() if eid != 5)
    assert client.read(6, 20).results[0].status == pb.NO_SUCH_ENTRY
