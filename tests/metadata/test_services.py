"""The coordination services, on every backend."""

from __future__ import annotations

import asyncio

import pytest

import metadata
from metadata import schemas as s
from metadata.errors import (
    InvalidNameError,
    LedgerExistsError,
    NoSuchLedgerError,
    NoSuchStreamError,
    StreamExistsError,
)
from metadata.services import (
    AuditorElection,
    BookieRegistry,
    ClusterInstance,
    CookieStore,
    LedgerIdGenerator,
    LedgerMetadataManager,
    StreamRegistry,
    UnderReplicationManager,
)

WAIT_S = 10.0


def ledger(ledger_id: int = 0) -> s.LedgerMetadata:
    return s.LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        state=s.LedgerState.OPEN,
        last_entry_id=-1,
        fragments=[s.Fragment(first_entry_id=0, bookies=["b1", "b2", "b3"])],
    )


async def test_ledger_ids_are_unique_and_never_zero(store):
    first = LedgerIdGenerator(store, batch_size=5)
    second = LedgerIdGenerator(store, batch_size=1)
    ids = await asyncio.gather(*[g.next_id() for g in (first, second) for _ in range(20)])
    assert len(set(ids)) == 40 and min(ids) >= 1


async def test_ledger_metadata_lifecycle_with_cas(store):
    ledgers = LedgerMetadataManager(store)
    ledger_id = await ledgers.create_with_new_id(ledger(), LedgerIdGenerator(store))
    md, version = await ledgers.read(ledger_id)
    assert md.ledger_id == ledger_id and version == 0
    with pytest.raises(LedgerExistsError):
        await ledgers.create(md)

    md.state = s.LedgerState.CLOSED
    md.last_entry_id = 10
    new_version = await ledgers.write(ledger_id, md, version)
    stale = ledger(ledger_id)
    with pytest.raises(metadata.BadVersionError):
        await ledgers.write(ledger_id, stale, version)
    assert (await ledgers.read(ledger_id)) == (md, new_version)

    await ledgers.delete(ledger_id)
    assert not await ledgers.exists(ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await ledgers.read(ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await ledgers.write(ledger_id, md, 0)


async def test_ledger_list_spans_buckets(store):
    ledgers = LedgerMetadataManager(store)
    wanted = [1, 2, 9_999, 10_000, 123_456_789, 2**63 - 1]
    for ledger_id in reversed(wanted):
        await ledgers.create(ledger(ledger_id))
    assert await ledgers.list() == wanted


async def test_ledger_watch_fires_on_metadata_change(store):
    ledgers = LedgerMetadataManager(store)
    await ledgers.create(ledger(42))
    async with ledgers.watch(42) as watch:
        md, version = await ledgers.read(42)
        md.state = s.LedgerState.IN_RECOVERY
        await ledgers.write(42, md, version)
        assert (await watch.next(WAIT_S)).kind == "changed"


@pytest.mark.parametrize("bad", [-1, 2**63, "7", 1.5, True])
async def test_bad_ledger_ids_are_rejected(store, bad):
    with pytest.raises(InvalidNameError):
        await LedgerMetadataManager(store).read(bad)


async def test_bookie_registry_tracks_live_bookies(connect_store):
    bookie_store = await connect_store()
    client_store = await connect_store()
    registry = BookieRegistry(bookie_store)
    view = BookieRegistry(client_store)
    async with view.watch() as watch:
        await registry.register(s.BookieInfo(bookie_id="127.0.0.1:3181", address="127.0.0.1:3181"))
        await registry.register(s.BookieInfo(bookie_id="b2", address="127.0.0.1:3182"))
        assert (await watch.next(WAIT_S)).kind in ("children", "created")
    assert [b.bookie_id for b in await view.list()] == ["127.0.0.1:3181", "b2"]

    await registry.set_read_only("b2", True)
    assert [b.bookie_id for b in await view.writable()] == ["127.0.0.1:3181"]
    assert (await view.get("b2")).read_only

    with pytest.raises(metadata.NodeExistsError):
        await view.register(s.BookieInfo(bookie_id="b2"))

    await registry.unregister("127.0.0.1:3181")
    assert [b.bookie_id for b in await view.list()] == ["b2"]
    await bookie_store.close()  # the bookie process dies: its registration goes
    assert await view.list() == []
    assert await view.get("b2") is None


@pytest.mark.parametrize("bad", ["", "a/b", "..", "x" * 256, "sp ace"])
async def test_bad_bookie_ids_are_rejected(store, bad):
    with pytest.raises(InvalidNameError):
        await BookieRegistry(store).register(s.BookieInfo(bookie_id=bad))


async def test_cookies_create_then_cas(store):
    cookies = CookieStore(store)
    assert await cookies.read("b1") is None
    cookie = s.Cookie(bookie_id="b1", instance_id="i1", journal_dir="/j", data_dirs=["/d"])
    assert await cookies.write(cookie) == 0
    with pytest.raises(metadata.NodeExistsError):
        await cookies.write(cookie)
    cookie.data_dirs.append("/d2")
    assert await cookies.write(cookie, version=0) == 1
    with pytest.raises(metadata.BadVersionError):
        await cookies.write(cookie, version=0)
    stored, version = await cookies.read("b1")
    assert list(stored.data_dirs) == ["/d", "/d2"] and version == 1
    await cookies.delete("b1")
    assert await cookies.read("b1") is None


async def test_the_cluster_instance_is_made_once_and_every_racer_gets_it(store, connect_store):
    assert await ClusterInstance(store).read() is None
    others = [ClusterInstance(await connect_store()) for _ in range(3)]
    made = await asyncio.gather(*[c.create_if_absent() for c in [ClusterInstance(store), *others]])
    assert len(set(made)) == 1 and made[0]
    assert await ClusterInstance(store).read() == made[0]
    assert await others[0].create_if_absent() == made[0]


async def test_streams_and_cursors(store):
    streams = StreamRegistry(store)
    md = s.StreamMetadata(name="orders", mode=s.StreamMode.MANAGED)
    await streams.create(md)
    with pytest.raises(StreamExistsError):
        await streams.create(md)
    md, version = await streams.read("orders")
    md.ledgers.append(s.LedgerInfo(ledger_id=1))
    new_version = await streams.write("orders", md, version)
    md.ledgers.append(s.LedgerInfo(ledger_id=2))
    with pytest.raises(metadata.BadVersionError):
        await streams.write("orders", md, version)
    assert [x.ledger_id for x in (await streams.read("orders"))[0].ledgers] == [1]
    assert new_version == 1
    assert await streams.list() == ["orders"]

    assert await streams.read_cursor("orders", "sub-a") is None
    state = s.CursorState(mark_delete=s.Position(ledger_id=1, entry_id=5))
    assert await streams.write_cursor("orders", "sub-a", state) == 0
    state.mark_delete.entry_id = 6
    assert await streams.write_cursor("orders", "sub-a", state, version=0) == 1
    with pytest.raises(metadata.BadVersionError):
        await streams.write_cursor("orders", "sub-a", state, version=0)
    assert await streams.list_cursors("orders") == ["sub-a"]
    read, version = await streams.read_cursor("orders", "sub-a")
    assert read.mark_delete.entry_id == 6 and version == 1
    await streams.delete_cursor("orders", "sub-a")
    assert await streams.list_cursors("orders") == []

    await streams.write_cursor("orders", "sub-b", state)
    await streams.delete("orders")
    assert await streams.list() == []
    with pytest.raises(NoSuchStreamError):
        await streams.read("orders")
    with pytest.raises(NoSuchStreamError):
        await streams.write_cursor("orders", "sub-b", state)


@pytest.mark.parametrize("bad", ["", "a/b", ".", "tab\t", "é"])
async def test_bad_stream_names_are_rejected(store, bad):
    with pytest.raises(InvalidNameError):
        await StreamRegistry(store).create(s.StreamMetadata(name=bad))


async def test_under_replication_mark_lock_done(connect_store):
    worker_store = await connect_store()
    auditor = UnderReplicationManager(await connect_store())
    worker = UnderReplicationManager(worker_store)
    await auditor.mark(5, ["b1"])
    await auditor.mark(5, ["b2", "b1"])
    await auditor.mark(6, ["b3"])
    marked = {r.ledger_id: list(r.missing_bookies) for r in await auditor.list()}
    assert marked == {5: ["b1", "b2"], 6: ["b3"]}

    assert await worker.try_lock(5)
    assert not await auditor.try_lock(5)
    await worker.done(5)
    assert [r.ledger_id for r in await auditor.list()] == [6]
    assert not await auditor.is_locked(5)

    assert await worker.try_lock(6)
    await worker_store.close()  # a worker dies holding the lock: the lock goes with it
    assert not await auditor.is_locked(6)
    assert await auditor.try_lock(6)
    await auditor.release(6)
    assert [r.ledger_id for r in await auditor.list()] == [6]

    assert await auditor.is_enabled()
    await auditor.set_enabled(False)
    assert not await auditor.is_enabled()
    await auditor.set_enabled(True)
    assert await auditor.is_enabled()


async def test_one_auditor_at_a_time(connect_store):
    first = AuditorElection(await connect_store(), "auditor-1")
    second_store = await connect_store()
    second = AuditorElection(second_store, "auditor-2")
    await asyncio.wait_for(first.campaign(), WAIT_S)
    waiting = asyncio.create_task(second.campaign())
    assert await second.leader() == "auditor-1"
    assert first.is_leader and not second.is_leader
    await first.resign()
    await asyncio.wait_for(waiting, WAIT_S)
    assert second.is_leader
    assert await first.leader() == "auditor-2"
    await second.resign()


async def test_concurrent_ledger_ids_share_one_reservation(store, monkeypatch):
    """Callers waiting together are served by one CAS of the counter, in the order they
    asked (the broker creating thousands of ledgers at once queued each behind the
    last's CAS)."""
    generator = LedgerIdGenerator(store, batch_size=1)
    first = await generator.next_id()
    sets = []
    original = store.set

    async def counting_set(path, *args, **kwargs):
        sets.append(path)
        return await original(path, *args, **kwargs)

    monkeypatch.setattr(store, "set", counting_set)
    ids = await asyncio.gather(*(generator.next_id() for _ in range(50)))
    assert ids == list(range(first + 1, first + 51))
    assert len(sets) == 1


async def test_batch_one_ids_increase_across_generators(store):
    """With batch_size 1 an id is never kept for later: an id asked for after another
    was handed out, by any generator, is higher (a stream's ledgers are ordered by id)."""
    one, other = LedgerIdGenerator(store, batch_size=1), LedgerIdGenerator(store, batch_size=1)
    seen = [await one.next_id(), await other.next_id(), await one.next_id()]
    waiters = [asyncio.ensure_future(one.next_id()) for _ in range(3)]
    await asyncio.sleep(0)  # (all three wait for one reservation)
    waiters[1].cancel()
    got = [await waiters[0], await waiters[2]]
    seen += [*got, await other.next_id(), await one.next_id()]
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert got[1] == got[0] + 1  # (the caller that gave up took no id)


async def test_batch_one_gives_no_caller_an_id_reserved_before_it_asked(store, monkeypatch):
    """A caller that comes while a reservation is under way waits for the next one: with
    batch_size 1 an id left over (a caller that gave up) is not handed on."""
    generator = LedgerIdGenerator(store, batch_size=1)
    first = await generator.next_id()
    gate = asyncio.Event()
    original = store.set

    async def gated_set(path, *args, **kwargs):
        await gate.wait()
        return await original(path, *args, **kwargs)

    monkeypatch.setattr(store, "set", gated_set)
    a, b, c = (asyncio.ensure_future(generator.next_id()) for _ in range(3))
    async with asyncio.timeout(10):
        while not generator._waiting or generator._reserving is None:
            await asyncio.sleep(0)
        for _ in range(20):  # (the reservation of three reaches the gate)
            await asyncio.sleep(0)
    b.cancel()
    late = asyncio.ensure_future(generator.next_id())
    await asyncio.sleep(0)
    gate.set()
    assert [await a, await c] == [first + 1, first + 2]
    assert await late == first + 4  # (not first + 3: reserved before it asked)


async def test_a_failed_reservation_fails_only_the_callers_it_was_for(store, monkeypatch):
    """The store failing a reservation fails the callers that waited for it; one that came
    meanwhile is served by the next (and a caller that gives up leaves the line)."""
    generator = LedgerIdGenerator(store, batch_size=1)
    first = await generator.next_id()
    gate = asyncio.Event()
    original = store.set
    failures = [metadata.StoreBusyError("the store is busy")]

    async def failing_set(path, *args, **kwargs):
        await gate.wait()
        if failures:
            raise failures.pop()
        return await original(path, *args, **kwargs)

    monkeypatch.setattr(store, "set", failing_set)
    early = asyncio.ensure_future(generator.next_id())
    async with asyncio.timeout(10):
        while generator._waiting or generator._reserving is None:  # (its reservation began)
            await asyncio.sleep(0)
    late = asyncio.ensure_future(generator.next_id())
    quitter = asyncio.ensure_future(generator.next_id())
    await asyncio.sleep(0)
    quitter.cancel()
    await asyncio.sleep(0)
    assert len(generator._waiting) == 1  # (the one that gave up left the line)
    gate.set()
    with pytest.raises(metadata.StoreBusyError):
        await early
    assert await late == first + 1
