"""The store contract, run unchanged on memory, sqlite and a real ZooKeeper."""

from __future__ import annotations

import asyncio

import pytest

import metadata
from metadata import CheckVersion, Create, Delete, Set

WAIT_S = 10.0  # bound on every wait for an event; events normally arrive in milliseconds


async def expect(watch: metadata.Watch, kind: str) -> None:
    """Wait for an event of this kind. A watch may also deliver spurious events (e.g. a
    change made just before it opened): its contract is "re-read", so skip them."""
    async with asyncio.timeout(WAIT_S):
        async for event in watch:
            assert event.path == watch.path
            if event.kind == kind:
                return


async def test_create_get_and_set_bump_the_version(store):
    assert await store.create("/node", b"one") == "/node"
    assert await store.get("/node") == metadata.Versioned(b"one", 0)
    assert await store.set("/node", b"two", version=0) == 1
    assert await store.set("/node", b"three") == 2
    assert await store.get("/node") == metadata.Versioned(b"three", 2)


async def test_cas_with_a_stale_version_fails_and_changes_nothing(store):
    await store.create("/node", b"v0")
    await store.set("/node", b"v1", version=0)
    with pytest.raises(metadata.BadVersionError):
        await store.set("/node", b"lost", version=0)
    assert await store.get("/node") == metadata.Versioned(b"v1", 1)


async def test_create_needs_the_parent_unless_asked_to_make_it(store):
    with pytest.raises(metadata.NoNodeError):
        await store.create("/missing/child")
    assert await store.create("/a/b/c", b"x", make_parents=True) == "/a/b/c"
    assert await store.exists("/a/b") == 0
    with pytest.raises(metadata.NodeExistsError):
        await store.create("/a/b/c")


async def test_missing_nodes_raise_no_node(store):
    with pytest.raises(metadata.NoNodeError):
        await store.get("/nope")
    with pytest.raises(metadata.NoNodeError):
        await store.set("/nope", b"")
    with pytest.raises(metadata.NoNodeError):
        await store.delete("/nope")
    with pytest.raises(metadata.NoNodeError):
        await store.children("/nope")
    assert await store.exists("/nope") is None


async def test_delete_checks_version_and_children(store):
    await store.create("/p", b"")
    await store.create("/p/c", b"")
    with pytest.raises(metadata.NotEmptyError):
        await store.delete("/p")
    with pytest.raises(metadata.BadVersionError):
        await store.delete("/p/c", version=3)
    await store.delete("/p/c", version=0)
    await store.delete("/p")
    assert await store.exists("/p") is None


async def test_recursive_delete_removes_the_subtree(store):
    await store.create("/t/a/x", make_parents=True)
    await store.create("/t/b", b"")
    await store.delete("/t", recursive=True)
    assert await store.exists("/t") is None


async def test_children_are_sorted_names(store):
    await store.create("/dir")
    for name in ("b", "a", "c"):
        await store.create(f"/dir/{name}")
    assert await store.children("/dir") == ["a", "b", "c"]
    assert "dir" in await store.children("/")


async def test_sequential_nodes_get_increasing_ten_digit_suffixes(store):
    await store.create("/q")
    first = await store.create("/q/item-", b"", sequential=True)
    second = await store.create("/q/item-", b"", sequential=True)
    assert first.startswith("/q/item-") and len(first) == len("/q/item-") + 10
    assert int(second[-10:]) > int(first[-10:])
    assert await store.children("/q") == [first[3:], second[3:]]


async def test_ephemeral_nodes_vanish_when_their_session_closes(connect_store):
    owner = await connect_store()
    observer = await connect_store()
    await owner.create("/live", b"me", ephemeral=True)
    await observer.create("/kept", b"")
    assert await observer.exists("/live") == 0
    async with observer.watch("/live") as watch:
        await owner.close()
        await expect(watch, "deleted")
    assert await observer.exists("/live") is None
    assert await observer.exists("/kept") == 0


async def test_ephemeral_nodes_cannot_have_children(store):
    await store.create("/eph", ephemeral=True)
    with pytest.raises(metadata.NoChildrenForEphemeralsError):
        await store.create("/eph/child")


async def test_watch_reports_changes_made_by_another_session(connect_store):
    watcher = await connect_store()
    writer = await connect_store()
    async with watcher.watch("/w") as watch:
        await writer.create("/w", b"1")
        await expect(watch, "created")
        await writer.set("/w", b"2")
        await expect(watch, "changed")
        await writer.delete("/w")
        await expect(watch, "deleted")


async def test_children_watch_reports_membership_changes(connect_store):
    watcher = await connect_store()
    writer = await connect_store()
    await writer.create("/members")
    async with watcher.watch("/members", children=True) as watch:
        await writer.create("/members/a")
        await expect(watch, "children")
        await writer.set("/members/a", b"data changes are not membership changes")
        await writer.delete("/members/a")
        await expect(watch, "children")


async def test_a_closed_watch_ends_its_iteration(store):
    watch = store.watch("/x")
    await watch.close()
    assert [event async for event in watch] == []


async def test_transaction_applies_every_op(store):
    await store.create("/acct", b"10")
    await store.create("/gone", b"")
    results = await store.transaction(
        [
            CheckVersion("/acct", 0),
            Create("/new", b"n"),
            Set("/acct", b"20", version=0),
            Delete("/gone"),
        ]
    )
    assert results == [True, "/new", 1, None]
    assert await store.get("/acct") == metadata.Versioned(b"20", 1)
    assert await store.exists("/gone") is None


async def test_failed_transaction_applies_nothing_and_names_the_failing_op(store):
    await store.create("/acct", b"10")
    await store.create("/gone", b"")
    ops = [
        Create("/new", b"n"),
        Set("/acct", b"20", version=0),
        CheckVersion("/acct", 7),  # fails
        Delete("/gone"),
    ]
    with pytest.raises(metadata.TransactionError) as caught:
        await store.transaction(ops)
    assert caught.value.index == 2
    assert isinstance(caught.value.cause, metadata.BadVersionError)
    assert await store.exists("/new") is None
    assert await store.get("/acct") == metadata.Versioned(b"10", 0)
    assert await store.exists("/gone") == 0


async def test_transaction_failure_cause_is_typed(store):
    with pytest.raises(metadata.TransactionError) as caught:
        await store.transaction([Create("/fresh"), Delete("/absent")])
    assert caught.value.index == 1
    assert isinstance(caught.value.cause, metadata.NoNodeError)
    assert await store.exists("/fresh") is None


async def test_lock_is_exclusive_until_released(connect_store):
    first = (await connect_store()).lock("/locks/one", "first")
    second = (await connect_store()).lock("/locks/one", "second")
    assert await first.acquire(timeout_s=WAIT_S)
    assert not await second.acquire(timeout_s=0.3)
    waiting = asyncio.create_task(second.acquire(timeout_s=WAIT_S))
    await first.release()
    assert await waiting
    assert second.is_acquired and not first.is_acquired
    await second.release()


async def test_a_lock_tried_without_waiting_answers_at_once_and_names_its_contenders(
    connect_store,
):
    first = (await connect_store()).lock("/locks/try", "first")
    second = (await connect_store()).lock("/locks/try", "second")
    assert await second.contenders() == []  # (no lock node yet)
    assert await first.acquire(timeout_s=0)
    assert not await second.acquire(timeout_s=0)  # a try leaves no node in line
    assert not second.is_acquired
    assert await second.contenders() == ["first"]
    waiting = asyncio.create_task(second.acquire(timeout_s=WAIT_S))
    for _ in range(100):  # bounded: until the waiter's node is in line
        if await first.contenders() == ["first", "second"]:
            break
        await asyncio.sleep(0.05)
    assert await first.contenders() == ["first", "second"]  # the holder first
    await first.release()
    assert await waiting
    assert await first.contenders() == ["second"]
    await second.release()


async def test_lock_passes_on_when_the_holder_session_ends(connect_store):
    holder_store = await connect_store()
    holder = holder_store.lock("/locks/two", "holder")
    other = (await connect_store()).lock("/locks/two", "other")
    assert await holder.acquire(timeout_s=WAIT_S)
    waiting = asyncio.create_task(other.acquire(timeout_s=WAIT_S))
    await holder_store.close()
    assert await waiting


async def test_election_has_one_leader_and_hands_over_on_resign(connect_store):
    alice = (await connect_store()).election("/election", "alice")
    bob = (await connect_store()).election("/election", "bob")
    await asyncio.wait_for(alice.campaign(), WAIT_S)
    assert alice.is_leader
    bob_campaign = asyncio.create_task(bob.campaign())
    assert await alice.leader() == "alice"
    assert not bob.is_leader
    await alice.resign()
    await asyncio.wait_for(bob_campaign, WAIT_S)
    assert bob.is_leader and not alice.is_leader
    assert await bob.leader() == "bob"
    await bob.resign()


# -- bad input -------------------------------------------------------------------------

BAD_PATHS = ["", "relative", "/trailing/", "//double", "/a//b", "/a/./b", "/a/../b", "/nul\x00", 7]


@pytest.mark.parametrize("path", BAD_PATHS, ids=repr)
async def test_invalid_paths_are_rejected_before_reaching_the_backend(store, path):
    with pytest.raises(metadata.InvalidPathError):
        await store.create(path, b"")
    with pytest.raises(metadata.InvalidPathError):
        await store.get(path)
    with pytest.raises(metadata.InvalidPathError):
        store.watch(path)


async def test_value_over_one_mebibyte_is_rejected_and_nothing_is_stored(store):
    too_big = b"x" * (metadata.MAX_VALUE_BYTES + 1)
    with pytest.raises(metadata.ValueTooLargeError):
        await store.create("/big", too_big)
    assert await store.exists("/big") is None
    await store.create("/big", b"small")
    with pytest.raises(metadata.ValueTooLargeError):
        await store.set("/big", too_big)
    with pytest.raises(metadata.ValueTooLargeError):
        await store.transaction([Set("/big", too_big)])
    assert await store.get("/big") == metadata.Versioned(b"small", 0)


async def test_a_value_of_exactly_one_mebibyte_is_stored(store):
    value = bytes(range(256)) * (metadata.MAX_VALUE_BYTES // 256)
    await store.create("/max", value)
    assert (await store.get("/max")).data == value


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.create("/n", "not bytes"),
        lambda s: s.set("/n", b"", version="1"),
        lambda s: s.set("/n", b"", version=-2),
        lambda s: s.transaction([("create", "/n")]),
        lambda s: s.delete("/"),
    ],
    ids=["str value", "str version", "version -2", "not an op", "delete root"],
)
async def test_malformed_arguments_raise_invalid_value(store, call):
    with pytest.raises(metadata.InvalidValueError):
        await call(store)


async def test_a_closed_store_refuses_work(connect_store):
    store = await connect_store()
    await store.close()
    with pytest.raises(metadata.MetadataError):
        await store.get("/")
