"""A real bookie process on a failing or small disk: a journal that refuses writes turns it
read-only (registration, metric, answers) until the disk takes writes again, a full disk
is never reached, and GC gives the space back."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bookie.launcher import BookieProcess
from bookie.wire import bookie_pb2 as pb
from tests.bookie.conftest import Client, Cluster, entry
from tests.bookie.test_operations import create_ledgers, delete_ledgers, registered


def eventually(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)  # polling a bounded condition, not synchronisation by sleep


def read_only_registered(cluster: Cluster, bookie: BookieProcess) -> bool:
    info = registered(cluster.metadata_uri, bookie.bookie_id)
    return bool(info is not None and info.read_only)  # type: ignore[attr-defined]


def test_a_journal_that_cannot_write_makes_the_bookie_read_only_until_it_can(
    cluster: Cluster, tmp_path: Path
) -> None:
    faults = tmp_path / "failpoints"
    faults.mkdir()
    bookie = cluster.bookie(start=False)
    bookie.env["BOOKIE_FAILPOINTS_DIR"] = str(faults)
    bookie.start()
    client = cluster.client(bookie)
    acknowledged = [entry(1, i) for i in range(5)]
    assert all(r.status == pb.OK for r in client.add(acknowledged).values())

    (faults / "journal-write").write_text("ENOSPC")  # the disk is full
    assert client.add_one(entry(1, 5)).status == pb.READ_ONLY
    eventually("registered read-only", lambda: read_only_registered(cluster, bookie))
    assert 'bookie_read_only_reason{reason="storage_fault"} 1.0' in bookie.metrics_text()
    state = bookie.admin("GET", "/admin/state")
    assert state["read_only"] is True and "journal write failed" in str(state["storage_fault"])
    assert client.add_one(entry(1, 5)).status == pb.READ_ONLY
    # Recovery adds are still tried: they fail only while the disk refuses them.
    assert client.add_one(entry(1, 5, flags=pb.RECOVERY_ADD)).status == pb.READ_ONLY
    (faults / "journal-write").unlink()  # space again
    eventually("writable again", lambda: not read_only_registered(cluster, bookie))
    assert client.add_one(entry(1, 5, flags=pb.RECOVERY_ADD)).status == pb.OK
    assert client.add_one(entry(1, 6)).status == pb.OK
    acknowledged += [entry(1, 5), entry(1, 6)]

    (faults / "journal-sync").write_text("EIO")
    assert client.add_one(entry(1, 7)).status == pb.IO_ERROR
    eventually("registered read-only", lambda: read_only_registered(cluster, bookie))
    assert bookie.stop() == 0  # SIGTERM while the journal fails: a clean exit
    assert "Traceback" not in bookie.stderr_tail(100_000)
    (faults / "journal-sync").unlink()
    bookie.start()
    client = cluster.client(bookie)
    got = client.read(1, 0, 7).results
    assert [r.entry.payload for r in got[:7]] == [e.payload for e in acknowledged]
    assert got[7].status == pb.NO_SUCH_ENTRY  # never acknowledged, and cut from the journal


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[tuple[Path, Cluster]]:
    """A 48 MiB tmpfs (a real filesystem that fills up), with a cluster on it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], check=True)
    cluster = Cluster(tmp_path)
    try:
        yield mount, cluster
    finally:
        cluster.close()
        subprocess.run(["umount", str(mount)], check=True)


def usage(path: Path) -> float:
    st = os.statvfs(path)
    return 1 - st.f_bavail / st.f_blocks


def entry_log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "ledgers").glob("entrylog-*.log"))


def test_a_small_disk_turns_read_only_before_it_fills_and_gc_makes_it_writable(
    small_disk: tuple[Path, Cluster],
) -> None:
    disk, cluster = small_disk
    # No timer check during the test: only the check on journal commits can stop a burst.
    bookie = BookieProcess(
        disk / "b0",
        metadata_uri=cluster.metadata_uri,
        extra=[
            "--session-timeout", "2", "--gc-interval", "3600", "--disk-check-interval", "3600",
            "--disk-usage-threshold", "0.7", "--disk-usage-lwm", "0.5", "--flush-interval", "0.1",
        ],
    )  # fmt: skip
    cluster.bookies.append(bookie)
    bookie.start()
    client = cluster.client(bookie)
    ledgers = [1, 2, 3]
    create_ledgers(cluster.metadata_uri, ledgers)
    statuses: list[int] = []
    next_entry = 0
    while pb.READ_ONLY not in statuses:
        assert next_entry < 2000, "the bookie never turned read-only"
        batch = [
            entry(ledgers[next_entry % 3], next_entry // 3, size=64 << 10)
            for next_entry in range(next_entry, next_entry + 8)
        ]
        next_entry += 8
        statuses += [r.status for r in client.add(batch, batch=8).values()]
    assert set(statuses) == {pb.OK, pb.READ_ONLY}  # never an I/O error from a full disk
    # The round below must find the burst in the entry log being written (its roll-and-
    # compact path), so wait for the flush loop (every 0.1 s) to put it there. Run before
    # that flush, GC drops the entries from the write cache and has nothing to compact
    # (test_gc_frees_space covers that path): the old test raced the flush timer.
    acknowledged_bytes = statuses.count(pb.OK) * (64 << 10)
    eventually("the burst is flushed", lambda: entry_log_bytes(disk / "b0") > acknowledged_bytes)
    assert usage(disk) < 0.9
    eventually("registered read-only", lambda: read_only_registered(cluster, bookie))

    delete_ledgers(cluster.metadata_uri, ledgers)
    result = bookie.admin("POST", "/admin/gc")
    assert result["deleted"] == ledgers and result["compacted"], result
    eventually("writable again", lambda: not read_only_registered(cluster, bookie))
    assert usage(disk) < 0.5
    assert client.add_one(entry(4, 0)).status == pb.OK
    assert isinstance(client, Client)
