"""Fencing, master keys, terms, TRUNCATE, LAC and long polls on a real bookie."""

from __future__ import annotations

import time

from bookie.wire import bookie_pb2 as pb
from tests.bookie.conftest import KEY, Cluster, entry, run_in_thread


def test_fence_is_durable_and_survives_a_restart(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)
    assert all(r.status == pb.OK for r in client.add(entry(1, i) for i in range(5)).values())
    fenced = client.read(1, 4, flags=pb.FENCE, master_key=KEY)
    assert fenced.status == pb.OK and fenced.results[0].status == pb.OK
    assert client.add_one(entry(1, 5)).status == pb.FENCED
    bookie.kill()
    bookie.start()
    client = cluster.client(bookie)
    assert client.add_one(entry(1, 5)).status == pb.FENCED
    assert client.read_lac(1).fenced
    # A recovery write-back passes the fence.
    assert client.add_one(entry(1, 5, flags=pb.RECOVERY_ADD)).status == pb.OK


def test_fencing_an_unknown_ledger_creates_it_fenced(cluster: Cluster) -> None:
    from tests.bookie.test_hostile_requests import create_metadata

    create_metadata(cluster, 9, 10)  # a ledger absent from the metadata has no writer to fence
    client = cluster.client(cluster.bookie())
    resp = client.read_lac(9, flags=pb.FENCE, master_key=KEY)
    assert resp.status == pb.OK and resp.last_add_confirmed == -1 and resp.fenced
    assert client.read(9, 0).results[0].status == pb.NO_SUCH_ENTRY
    assert client.add_one(entry(9, 0)).status == pb.FENCED
    read_fence = client.read(10, 0, flags=pb.FENCE, master_key=KEY)
    assert read_fence.status == pb.OK and read_fence.results[0].status == pb.NO_SUCH_ENTRY
    assert client.add_one(entry(10, 0)).status == pb.FENCED


def test_master_key_mismatch_is_unauthorized(cluster: Cluster) -> None:
    client = cluster.client(cluster.bookie())
    assert client.add_one(entry(2, 0)).status == pb.OK
    assert client.add_one(entry(2, 1, key=b"another")).status == pb.UNAUTHORIZED
    assert client.read(2, 0, flags=pb.FENCE, master_key=b"another").status == pb.UNAUTHORIZED
    assert client.read_lac(2, flags=pb.FENCE, master_key=b"another").status == pb.UNAUTHORIZED
    assert not client.read_lac(2).fenced
    # Normal reads need no key.
    assert client.read(2, 0).results[0].status == pb.OK


def test_terms_lower_is_rejected_and_higher_is_adopted_durably(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    client = cluster.client(bookie)
    assert client.add_one(entry(3, 0, term=2)).status == pb.OK
    low = client.add_one(entry(3, 1, term=1))
    assert low.status == pb.INVALID_TERM and low.term == 2
    # A recovery LAC read with term 3 adopts it (synced before the answer).
    assert client.read_lac(3, term=3, master_key=KEY).term == 3
    assert client.add_one(entry(3, 1, term=2)).status == pb.INVALID_TERM
    bookie.kill()
    bookie.start()
    client = cluster.client(bookie)
    stale = client.add_one(entry(3, 1, term=2))
    assert stale.status == pb.INVALID_TERM and stale.term == 3
    assert client.add_one(entry(3, 1, term=3)).status == pb.OK
    assert client.read(3, 0, master_key=KEY, term=2).status == pb.INVALID_TERM
    # Normal reads ignore terms.
    assert client.read(3, 1).results[0].status == pb.OK


def test_truncate_entry_deletes_higher_entries_and_is_replayed(cluster: Cluster) -> None:
    bookie = cluster.bookie(extra=["--flush-interval", "3600"])
    client = cluster.client(bookie)
    assert all(
        r.status == pb.OK for r in client.add(entry(4, i, term=1) for i in range(10)).values()
    )
    assert bookie.stop() == 0  # entries 0..9 flushed to entry logs and the index
    bookie.start()
    client = cluster.client(bookie)
    noop = entry(4, 6, term=2, lac=5, flags=pb.TRUNCATE | pb.RECOVERY_ADD)
    assert client.add_one(noop).status == pb.OK

    def check() -> None:
        got = {r.entry_id: r for r in client.read(4, 0, 9).results}
        assert all(got[i].status == pb.OK for i in range(7))
        assert got[6].entry.flags & pb.TRUNCATE
        # Reads say which term stored each copy (readers reject older-term leftovers).
        assert got[6].entry.term == 2 and got[5].entry.term == 1
        assert all(got[i].status == pb.NO_SUCH_ENTRY for i in (7, 8, 9))
        assert client.read_lac(4).last_add_confirmed <= 6

    check()
    bookie.kill()  # the truncate is only in the journal now
    bookie.start()
    client = cluster.client(bookie)
    check()
    # The new term's writer continues above the no-op.
    assert client.add_one(entry(4, 7, term=2)).status == pb.OK


def test_long_poll_read_lac_wakes_on_add_and_returns_the_next_entry(cluster: Cluster) -> None:
    client = cluster.client(cluster.bookie())
    assert all(r.status == pb.OK for r in client.add(entry(5, i) for i in range(5)).values())
    assert client.read_lac(5).last_add_confirmed == 3
    started = time.monotonic()
    thread, box = run_in_thread(
        lambda: client.read_lac(5, previous_lac=3, timeout_ms=20_000, piggyback_entry=True)
    )
    assert client.add_one(entry(5, 5)).status == pb.OK  # carries LAC 4
    thread.join(30)
    resp = box[0]
    assert isinstance(resp, pb.ReadLacResponse)
    assert resp.status == pb.OK and resp.last_add_confirmed == 4
    assert resp.next_entry.entry_id == 4
    assert time.monotonic() - started < 15
    # Nothing new: the poll times out and answers the current LAC.
    timed_out = client.read_lac(5, previous_lac=4, timeout_ms=200)
    assert timed_out.status == pb.OK and timed_out.last_add_confirmed == 4


def test_explicit_lac_and_force(cluster: Cluster) -> None:
    client = cluster.client(cluster.bookie())
    assert client.add_one(entry(6, 0)).status == pb.OK
    assert (
        client.stub.WriteLac(
            pb.WriteLacRequest(ledger_id=6, master_key=KEY, last_add_confirmed=0)
        ).status
        == pb.OK
    )
    assert client.read_lac(6).last_add_confirmed == 0
    assert client.stub.Force(pb.ForceRequest(ledger_id=6)).last_add_confirmed == 0
    assert client.stub.Force(pb.ForceRequest(ledger_id=66)).status == pb.NO_SUCH_LEDGER
    assert client.read(66, 0).status == pb.NO_SUCH_LEDGER


def test_re_adding_an_entry_is_idempotent(cluster: Cluster) -> None:
    client = cluster.client(cluster.bookie())
    assert client.add_one(entry(8, 0)).status == pb.OK
    assert client.add_one(entry(8, 0)).status == pb.OK
    assert client.read(8, 0).results[0].entry.payload == entry(8, 0).payload
