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
from metadata.services.cluster import ClusterInstance
from metadata.services.cookies import CookieStore
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


def cluster_instance(uri: str) -> str | None:
    return with_store(uri, lambda s: ClusterInstance(s).read())


def create_ledgers(uri: str, ledger_ids: list[int]) -> None:
    async def create(store: metadata.MetadataStore) -> None:
        for ledger_id in ledger_ids:
            md = LedgerMetadata(ledger_id=ledger_id, ensemble_size=1, write_quorum=1, ack_quorum=1)
            await LedgerMetadataManager(store).create(md)

    with_store(uri, create)


def delete_ledgers(uri: str, ledger_ids: list[int]) -> None:
    async def delete(store: metadata.MetadataStore) -> None:
        for ledger_id in ledger_ids:
            await LedgerMetadataManager(store).delete(ledger_id)

    with_store(uri, delete)


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


def test_a_bookie_started_against_an_empty_store_refuses_and_its_ledgers_survive(
    cluster: Cluster,
) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)
    create_ledgers(cluster.metadata_uri, [1])
    assert all(r.status == pb.OK for r in client.add(entry(1, i) for i in range(5)).values())
    assert bookie.stop() == 0
    empty = cluster.other_store("empty")  # a mistyped URI: sqlite makes an empty store

    bookie.metadata_uri = empty
    rc, stderr = bookie.run_to_exit()
    assert rc != 0 and "CookieError" in stderr, stderr
    assert "has no cluster instance id" in stderr and "--allow-new-cluster" in stderr
    assert cluster_instance(empty) is None  # the refusal wrote nothing there
    assert with_store(empty, lambda s: CookieStore(s).read(bookie.bookie_id)) is None

    bookie.metadata_uri = cluster.metadata_uri
    bookie.start()
    client = cluster.client(bookie)
    assert bookie.admin("POST", "/admin/gc")["deleted"] == []
    assert [r.status for r in client.read(1, 0, 4).results] == [pb.OK] * 5

    # Knowingly moving the bookie to the new store.
    assert bookie.stop() == 0
    bookie.metadata_uri = empty
    bookie.extra.append("--allow-new-cluster")
    bookie.start()
    found = with_store(empty, lambda s: CookieStore(s).read(bookie.bookie_id))
    assert found is not None
    assert (
        found[0].cluster_instance_id
        == cluster_instance(empty)
        != cluster_instance(cluster.metadata_uri)
    )


def test_a_bookie_refuses_the_store_of_another_cluster(cluster: Cluster) -> None:
    bookie = cluster.bookie("b0")
    assert bookie.stop() == 0
    other_uri = cluster.other_store("other")
    cluster.bookie("other-b0", metadata_uri=other_uri)  # founds the other cluster
    ours, theirs = cluster_instance(cluster.metadata_uri), cluster_instance(other_uri)
    assert ours and theirs and ours != theirs

    bookie.metadata_uri = other_uri
    rc, stderr = bookie.run_to_exit()
    assert rc != 0 and "CookieError" in stderr, stderr
    assert f"cluster {ours}" in stderr and f"cluster {theirs}" in stderr
    assert with_store(other_uri, lambda s: CookieStore(s).read(bookie.bookie_id)) is None


def test_gc_refuses_a_mass_vanish_of_ledgers_until_forced(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)
    ledgers = list(range(1, 13))
    create_ledgers(cluster.metadata_uri, ledgers)
    assert all(r.status == pb.OK for r in client.add(entry(i, 0) for i in ledgers).values())
    delete_ledgers(cluster.metadata_uri, ledgers[:7])  # 7 of 12: more than half at once

    refused = bookie.admin("POST", "/admin/gc")
    assert refused["deleted"] == [] and refused["trimmed"] == {}, refused
    assert "7 of this bookie's 12 ledgers" in str(refused["refused"])
    assert "force=true" in str(refused["refused"])
    assert all(client.read(i, 0).results[0].status == pb.OK for i in ledgers)
    assert 'bookie_gc_refused_rounds_total{reason="mass_vanish"} 1.0' in bookie.metrics_text()

    forced = bookie.admin("POST", "/admin/gc?force=true")
    assert forced["deleted"] == ledgers[:7] and forced["refused"] is None
    assert client.read(1, 0).status == pb.NO_SUCH_LEDGER
    assert client.read(8, 0).results[0].status == pb.OK


def test_gc_refuses_while_the_store_names_no_or_another_cluster_until_forced(
    cluster: Cluster,
) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)
    assert client.add_one(entry(5, 0)).status == pb.OK  # no metadata: garbage, normally
    ours = cluster_instance(cluster.metadata_uri)

    async def drop_instance(store: metadata.MetadataStore) -> None:
        instance = ClusterInstance(store)
        await store.delete(instance.path("instance"))

    with_store(cluster.metadata_uri, drop_instance)  # the store was wiped under the bookie
    refused = bookie.admin("POST", "/admin/gc")
    assert refused["deleted"] == [] and "no cluster instance id" in str(refused["refused"])
    with_store(cluster.metadata_uri, lambda s: ClusterInstance(s).create_if_absent())
    theirs = cluster_instance(cluster.metadata_uri)
    assert theirs != ours  # ... and re-formatted: another cluster now
    refused = bookie.admin("POST", "/admin/gc")
    assert refused["deleted"] == [] and f"cluster {theirs}" in str(refused["refused"])
    assert client.read(5, 0).results[0].status == pb.OK
    assert 'bookie_gc_refused_rounds_total{reason="cluster_mismatch"} 2.0' in bookie.metrics_text()

    forced = bookie.admin("POST", "/admin/gc?force=true")
    assert forced["deleted"] == [5] and forced["refused"] is None
