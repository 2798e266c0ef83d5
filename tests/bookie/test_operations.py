"""Registration, read-only mode, identity cookies, garbage collection and metrics."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from typing import TypeVar

import metadata
from bookie.wire import bookie_pb2 as pb
from metadata.schemas import LedgerMetadata
from metadata.services.bookies import BookieRegistry
from metadata.services.ledgers import LedgerMetadataManager
from tests.bookie.conftest import Cluster, entry

T = TypeVar("T")


def with_store(uri: str, fn: Callable[[metadata.MetadataStore], Awaitable[T]]) -> T:
    async def run() -> T:
        store = await metadata.connect(uri)
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(run())


def registered(uri: str, bookie_id: str) -> object:
    return with_store(uri, lambda s: BookieRegistry(s).get(bookie_id))


def test_read_only_mode_switches_on_disk_usage_and_back(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)
    info = registered(cluster.metadata_uri, bookie.bookie_id)
    assert info is not None and not info.read_only  # type: ignore[attr-defined]
    state = bookie.admin("POST", "/admin/disk-thresholds?threshold=0.00001&lwm=0.000005")
    assert state["read_only"] is True
    info = registered(cluster.metadata_uri, bookie.bookie_id)
    assert info is not None and info.read_only  # type: ignore[attr-defined]
    assert client.add_one(entry(1, 0)).status == pb.READ_ONLY
    assert client.add_one(entry(1, 0, flags=pb.RECOVERY_ADD)).status == pb.OK
    assert client.stub.GetBookieInfo(pb.GetBookieInfoRequest()).read_only
    state = bookie.admin("POST", "/admin/disk-thresholds?threshold=1&lwm=0.9999")
    assert state["read_only"] is False
    info = registered(cluster.metadata_uri, bookie.bookie_id)
    assert info is not None and not info.read_only  # type: ignore[attr-defined]
    assert client.add_one(entry(1, 1)).status == pb.OK
    assert "bookie_read_only 0.0" in bookie.metrics_text()


def test_registration_is_removed_on_graceful_stop(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    assert registered(cluster.metadata_uri, bookie.bookie_id) is not None
    assert bookie.stop() == 0
    assert registered(cluster.metadata_uri, bookie.bookie_id) is None


def test_bookie_with_wiped_directories_refuses_to_start_under_its_old_id(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    assert bookie.stop() == 0
    shutil.rmtree(bookie.data_dir)
    rc, stderr = bookie.run_to_exit()
    assert rc != 0
    assert "CookieError" in stderr and "decommission" in stderr
    assert bookie.bookie_id in stderr


def test_gc_deletes_only_ledgers_whose_metadata_is_gone(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)

    async def create(store: metadata.MetadataStore) -> None:
        md = LedgerMetadata(ledger_id=11, ensemble_size=1, write_quorum=1, ack_quorum=1)
        await LedgerMetadataManager(store).create(md)
        # Ledger 13 lost its first fragments to fragment retention: entries 0..5 go.
        md = LedgerMetadata(
            ledger_id=13, ensemble_size=1, write_quorum=1, ack_quorum=1, first_entry_id=6
        )
        await LedgerMetadataManager(store).create(md)

    with_store(cluster.metadata_uri, create)
    for ledger in (11, 12, 13):
        assert all(
            r.status == pb.OK for r in client.add(entry(ledger, i) for i in range(10)).values()
        )
    assert bookie.stop() == 0  # flushed: the GC must delete from the index, not just the cache
    bookie.start()
    client = cluster.client(bookie)
    result = bookie.admin("POST", "/admin/gc")
    assert result["deleted"] == [12] and result["trimmed"] == {"13": 6}
    assert client.read(12, 0).status == pb.NO_SUCH_LEDGER
    assert all(r.status == pb.OK for r in client.read(11, 0, 9).results)
    assert [r.status for r in client.read(13, 0, 9).results] == [pb.NO_SUCH_ENTRY] * 6 + [pb.OK] * 4
    again = bookie.admin("POST", "/admin/gc")
    assert again["deleted"] == [] and again["trimmed"] == {}


def test_metrics_report_adds_reads_and_fsyncs(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)
    client.add(entry(1, i) for i in range(10))
    client.read(1, 0, 9)
    text = bookie.metrics_text()
    assert "bookie_add_entries_total 10.0" in text
    assert "bookie_read_entries_total 10.0" in text
    assert "bookie_journal_fsync_seconds_count" in text
    assert "bookie_journal_entries_per_fsync_bucket" in text


def test_a_wiped_journal_disk_alone_also_refuses_to_start(cluster: Cluster) -> None:
    journal = cluster.root / "journal-disk"
    bookie = cluster.bookie(extra=["--journal-dir", str(journal)])
    client = cluster.client(bookie)
    assert client.add_one(entry(1, 0)).status == pb.OK
    bookie.kill()
    shutil.rmtree(journal)
    rc, stderr = bookie.run_to_exit()
    assert rc != 0 and "CookieError" in stderr and str(journal) in stderr
