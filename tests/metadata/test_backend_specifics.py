"""What only one backend has to get right: sqlite's busy handling, watch latency and
session reaping; ZooKeeper's session expiry and restarts (its ACLs and TLS: see
test_security.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import time

import pytest
from kazoo.client import KazooClient

import metadata
from metadata import schemas as s
from metadata.services import BookieRegistry

WAIT_S = 10.0


async def test_sqlite_busy_database_gives_store_busy_after_the_retry_budget(tmp_path):
    uri = f"sqlite://{tmp_path}/meta.db"
    async with await metadata.connect(uri, busy_timeout_s=0.3) as store:
        await store.create("/n", b"before")
        blocker = sqlite3.connect(f"{tmp_path}/meta.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        try:
            started = time.monotonic()
            with pytest.raises(metadata.StoreBusyError, match="locked"):
                await store.set("/n", b"after")
            assert time.monotonic() - started < 5
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert await store.get("/n") == metadata.Versioned(b"before", 0)
        assert await store.set("/n", b"after") == 1


async def test_sqlite_watchers_see_another_connections_write_within_100_ms(tmp_path):
    uri = f"sqlite://{tmp_path}/meta.db"
    async with await metadata.connect(uri) as watcher, await metadata.connect(uri) as writer:
        await writer.create("/n", b"")
        delays = []
        async with watcher.watch("/n") as watch:
            for i in range(10):
                value = str(i).encode()
                started = time.monotonic()
                await writer.set("/n", value)
                # Re-read on every event (the watch contract) until the write is seen.
                while (await watcher.get("/n")).data != value:
                    await watch.next(WAIT_S)
                delays.append(time.monotonic() - started)
    assert statistics.median(delays) < 0.1, delays


async def test_sqlite_reaped_session_is_renewed_and_bookie_reregisters(tmp_path):
    uri = f"sqlite://{tmp_path}/meta.db"
    async with (
        await metadata.connect(uri, session_timeout_s=0.6) as bookie_store,
        await metadata.connect(uri, session_timeout_s=0.6) as observer,
    ):
        expired = asyncio.Event()
        bookie_store.add_session_listener(lambda _event: expired.set())
        await BookieRegistry(bookie_store).register(s.BookieInfo(bookie_id="b1"))
        old_session = bookie_store.session_id
        # Make the bookie's session look dead (as after a long stall), so that the
        # observer reaps it; the bookie notices at its next heartbeat.
        raw = sqlite3.connect(f"{tmp_path}/meta.db", isolation_level=None)
        raw.execute("UPDATE sessions SET heartbeat_ms = 0 WHERE id = ?", (old_session,))
        raw.close()
        await asyncio.wait_for(expired.wait(), WAIT_S)
        assert bookie_store.session_id != old_session
        view = BookieRegistry(observer)
        async with asyncio.timeout(WAIT_S):
            while [b.bookie_id for b in await view.list()] != ["b1"]:
                await asyncio.sleep(0.02)  # polling a condition, bounded by the timeout


async def test_zookeeper_session_expiry_renews_the_session_and_bookie_reregisters(zookeeper):
    uri = f"zk://{zookeeper.hosts}/expiry"
    async with (
        await metadata.connect(uri, session_timeout_s=2.0) as bookie_store,
        await metadata.connect(uri) as observer,
    ):
        expired = asyncio.Event()
        bookie_store.add_session_listener(lambda _event: expired.set())
        await BookieRegistry(bookie_store).register(s.BookieInfo(bookie_id="b1"))
        old_session = bookie_store.session_id
        # The standard way to expire a ZooKeeper session: open a second connection with
        # the same session id and password, then close it.
        session_id, password = bookie_store._client.client_id  # type: ignore[attr-defined]
        twin = KazooClient(hosts=zookeeper.hosts, client_id=(session_id, password))
        await asyncio.to_thread(twin.start)
        await asyncio.to_thread(twin.stop)
        twin.close()
        await asyncio.wait_for(expired.wait(), 30)
        assert bookie_store.session_id != old_session
        view = BookieRegistry(observer)
        async with asyncio.timeout(WAIT_S):
            while [b.bookie_id for b in await view.list()] != ["b1"]:
                await asyncio.sleep(0.02)  # polling a condition, bounded by the timeout


async def test_zookeeper_store_rides_out_a_server_restart(tmp_path):
    # A private server: restarting the shared one would disturb other tests.
    from tests.conftest import ZooKeeperServer

    server = ZooKeeperServer(tmp_path)
    await asyncio.to_thread(server.start)
    try:
        async with await metadata.connect(
            f"zk://{server.hosts}/restart", session_timeout_s=20.0, operation_timeout_s=1.0
        ) as store:
            await store.create("/kept", b"persistent")
            await store.create("/mine", b"ephemeral", ephemeral=True)
            session = store.session_id
            await asyncio.to_thread(server.stop)
            with pytest.raises(metadata.ConnectionLossError):
                await store.get("/kept")
            await asyncio.to_thread(server.start)
            async with asyncio.timeout(30):
                while True:
                    try:
                        assert await store.get("/kept") == metadata.Versioned(b"persistent", 0)
                        break
                    except metadata.ConnectionLossError:
                        await asyncio.sleep(0.1)  # kazoo is reconnecting; bounded by the timeout
            # Same session after the reconnect: the ephemeral node survived.
            assert store.session_id == session
            assert await store.exists("/mine") == 0
    finally:
        await asyncio.to_thread(server.stop)


async def test_an_event_reaches_the_watches_of_its_path_only(tmp_path):
    async with await metadata.connect(f"sqlite://{tmp_path}/meta.db") as store:
        watches = {path: store.watch(path) for path in ("/a", "/b", "/c")}
        children = store.watch("/", children=True)
        await store.create("/b", b"x")
        assert (await watches["/b"].next(WAIT_S)).kind == "created"
        assert (await children.next(WAIT_S)).kind == "children"
        for path in ("/a", "/c"):
            with pytest.raises(TimeoutError):
                await watches[path].next(0.2)  # (a bounded wait: nothing comes)
        await watches["/b"].close()
        await store.set("/b", b"y")  # (a closed watch is out of the index)
        assert store._watches_at.keys() == {"/a", "/c", "/"}
        for watch in (*watches.values(), children):
            await watch.close()
        assert store._watches_at == {}
