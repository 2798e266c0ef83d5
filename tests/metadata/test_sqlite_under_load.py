"""The sqlite store under load: group commit (transactions asked for together commit in
one sqlite transaction, one sync, each still atomic and failing alone), group reads
(reads asked for together: one hop to the reading thread, each answered alone), and a
session that a late event loop does not end."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

import metadata
from metadata.store import Set


def count_batches(store: metadata.MetadataStore) -> list[int]:
    """How many sqlite write transactions carried transactions of the store's callers."""
    batches = [0]
    write_and_drain = store._write_and_drain  # type: ignore[attr-defined]

    def counted(fn):  # type: ignore[no-untyped-def]
        batches[0] += 1
        return write_and_drain(fn)

    store._write_and_drain = counted  # type: ignore[attr-defined]
    return batches


async def test_concurrent_writes_share_one_commit_and_a_failed_one_leaves_no_trace(tmp_path):
    async with await metadata.connect(f"sqlite://{tmp_path}/meta.db") as store:
        for i in range(100):
            await store.create(f"/n{i}", b"")
        batches = count_batches(store)

        async def outcome(aw):  # type: ignore[no-untyped-def]
            try:
                return await aw
            except metadata.MetadataError as exc:
                return exc

        good = [store.set(f"/n{i}", b"good", version=0) for i in range(0, 100, 2)]
        stale = [store.set(f"/n{i}", b"stale", version=7) for i in range(1, 100, 2)]
        # Two sets in one transaction, the second one stale: neither happens.
        half = store.transaction([Set("/n1", b"half", version=0), Set("/n3", b"x", version=9)])
        outcomes = await asyncio.gather(*(outcome(aw) for aw in [*good, *stale, half]))
        assert outcomes[:50] == [1] * 50
        assert all(isinstance(o, metadata.BadVersionError) for o in outcomes[50:100])
        assert isinstance(outcomes[100], metadata.TransactionError)
        assert batches[0] <= 2  # (not 101)
        for i in range(100):
            want = metadata.Versioned(b"good", 1) if i % 2 == 0 else metadata.Versioned(b"", 0)
            assert await store.get(f"/n{i}") == want, i
    # What was answered is on disk: a new store reads it.
    async with await metadata.connect(f"sqlite://{tmp_path}/meta.db") as again:
        assert await again.get("/n0") == metadata.Versioned(b"good", 1)
        assert await again.get("/n1") == metadata.Versioned(b"", 0)


async def test_concurrent_reads_share_one_hop_and_each_is_answered_alone(tmp_path):
    async with await metadata.connect(f"sqlite://{tmp_path}/meta.db") as store:
        for i in range(50):
            await store.create(f"/r{i}", b"%d" % i)
        hops = [0]
        read = store._read  # type: ignore[attr-defined]

        def counted(fn, conn):  # type: ignore[no-untyped-def]
            hops[0] += 1
            return read(fn, conn)

        store._read = counted  # type: ignore[attr-defined]

        async def outcome(aw):  # type: ignore[no-untyped-def]
            try:
                return await aw
            except metadata.MetadataError as exc:
                return exc

        asked = [store.get(f"/r{i}") for i in range(50)]
        asked += [store.get("/missing"), store.children("/"), store.exists("/r7")]
        outcomes = await asyncio.gather(*(outcome(aw) for aw in asked))
        assert outcomes[:50] == [metadata.Versioned(b"%d" % i, 0) for i in range(50)]
        assert isinstance(outcomes[50], metadata.NoNodeError)  # (fails alone)
        assert sorted(outcomes[51]) == sorted(f"r{i}" for i in range(50))
        assert outcomes[52] == 0
        assert hops[0] <= 2  # (not 53)
        # A read asked for after a write was answered sees it.
        await store.set("/r3", b"new")
        assert await store.get("/r3") == metadata.Versioned(b"new", 1)
        # A reader that gives up does not stop the others.
        gave_up = asyncio.ensure_future(store.get("/r4"))
        kept = asyncio.ensure_future(store.get("/r5"))
        gave_up.cancel()
        assert await kept == metadata.Versioned(b"5", 0)
    # Reads asked for once the store is closed fail with SessionExpiredError.
    with pytest.raises(metadata.SessionExpiredError):
        await store.get("/r1")


async def test_a_batch_the_database_refuses_fails_every_one_of_it_and_applies_none(tmp_path):
    uri = f"sqlite://{tmp_path}/meta.db"
    async with await metadata.connect(uri, busy_timeout_s=0.3) as store:
        for i in range(10):
            await store.create(f"/n{i}", b"before")
        blocker = sqlite3.connect(f"{tmp_path}/meta.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        try:
            outcomes = await asyncio.gather(
                *(store.set(f"/n{i}", b"after") for i in range(10)), return_exceptions=True
            )
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert all(isinstance(o, metadata.StoreBusyError) for o in outcomes), outcomes
        for i in range(10):
            assert await store.get(f"/n{i}") == metadata.Versioned(b"before", 0)
        assert await asyncio.gather(*(store.set(f"/n{i}", b"after") for i in range(10))) == [1] * 10


async def test_a_session_outlives_an_event_loop_that_runs_late(tmp_path):
    """The heartbeat comes every third of the session timeout by the clock, however late
    the event loop runs (a broker of thousands of streams under load): a loop that spends
    0.1 s of every turn elsewhere for three session timeouts keeps its session and its
    ephemeral node. (Counted in polls, 26 of them at 0.2 s and more: past the timeout.)"""
    uri = f"sqlite://{tmp_path}/meta.db"
    async with await metadata.connect(uri, session_timeout_s=2.0) as store:
        expired: list[str] = []
        store.add_session_listener(expired.append)
        await store.create("/lease", b"", ephemeral=True)
        session = store.session_id
        loop = asyncio.get_running_loop()
        lagging_until = time.monotonic() + 6.0

        def lag() -> None:  # the fault: each turn of the loop takes 0.1 s more
            time.sleep(0.1)
            if time.monotonic() < lagging_until:
                loop.call_soon(lag)

        done = loop.create_future()
        loop.call_soon(lag)
        loop.call_later(6.2, done.set_result, None)
        await done
        async with await metadata.connect(uri) as other:  # (its poll reaps dead sessions)
            await other.create("/after", b"")
            assert await other.exists("/lease") is not None
        assert store.session_id == session and expired == []


async def test_writes_that_committed_are_answered_as_done_when_reading_the_log_fails(tmp_path):
    """Reading the change log after a commit fails (the disk): the writes happened, so
    they are answered as done -- a caller told otherwise would write again -- and every
    watch fires, since what changed is unknown. (Unit test of this layer: the failing
    read is patched in.)"""
    async with await metadata.connect(f"sqlite://{tmp_path}/meta.db") as store:
        await store.create("/n", b"")
        drain = store._drain  # type: ignore[attr-defined]

        def failing() -> None:
            raise sqlite3.OperationalError("disk I/O error")

        store._drain = failing  # type: ignore[attr-defined]
        try:
            async with store.watch("/other") as watch:
                assert await store.set("/n", b"done", version=0) == 1
                assert await asyncio.wait_for(watch.next(10), 10) is not None
        finally:
            store._drain = drain  # type: ignore[attr-defined]
        assert await store.get("/n") == metadata.Versioned(b"done", 1)


async def test_an_expired_session_is_told_even_when_the_rest_of_its_poll_fails(tmp_path):
    """The poll that finds the session expired tells its listeners at once: a failure
    later in that poll (the change log unreadable) does not lose the news. (The failing
    read is patched in.)"""
    uri = f"sqlite://{tmp_path}/meta.db"
    async with await metadata.connect(uri, session_timeout_s=0.6) as store:
        expired = asyncio.Event()
        store.add_session_listener(lambda _event: expired.set())
        await store.create("/lease", b"", ephemeral=True)
        drain = store._drain  # type: ignore[attr-defined]

        def failing() -> None:
            raise sqlite3.OperationalError("disk I/O error")

        store._drain = failing  # type: ignore[attr-defined]
        raw = sqlite3.connect(f"{tmp_path}/meta.db", isolation_level=None)
        raw.execute("UPDATE sessions SET heartbeat_ms = 0 WHERE id = ?", (store.session_id,))
        raw.close()
        try:
            await asyncio.wait_for(expired.wait(), 10)
        finally:
            store._drain = drain  # type: ignore[attr-defined]
