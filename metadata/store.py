"""The store interface every backend implements, and the value types it speaks.

A MetadataStore is ZooKeeper's data model made async: a tree of versioned nodes,
compare-and-swap on the version, ephemeral nodes tied to the store's session,
sequential names, multi-op transactions and persistent watches. The public methods
here validate their input (through metadata.paths, the one shared rule set) and hand
the backend a checked request, so all three backends fail bad input identically.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, TypeAlias

from metadata.errors import InvalidValueError, TransactionError
from metadata.paths import validate_path, validate_value, validate_version


@dataclass(frozen=True)
class Versioned:
    data: bytes
    version: int


# -- transaction operations ------------------------------------------------------------


@dataclass(frozen=True)
class CheckVersion:
    path: str
    version: int


@dataclass(frozen=True)
class Create:
    """Create a node. ``private``: on a ZooKeeper store with credentials, only that
    identity may read the node (every other node it creates stays world-readable); the
    parents made by make_parents are not private. Other stores accept it and protect
    every node alike (sqlite: the database file is the owner's alone)."""

    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequential: bool = False
    make_parents: bool = False
    private: bool = False


@dataclass(frozen=True)
class Set:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True)
class Delete:
    path: str
    version: int = -1


Op: TypeAlias = CheckVersion | Create | Set | Delete


def validate_op(op: object) -> Op:
    if isinstance(op, CheckVersion):
        validate_path(op.path)
        if validate_version(op.version) < 0:
            raise InvalidValueError("CheckVersion needs an explicit version >= 0")
    elif isinstance(op, Create):
        validate_path(op.path)
        validate_value(op.data)
        if op.path == "/":
            raise InvalidValueError("the root cannot be created")
    elif isinstance(op, Set):
        validate_path(op.path)
        validate_value(op.data)
        validate_version(op.version)
    elif isinstance(op, Delete):
        validate_path(op.path)
        validate_version(op.version)
        if op.path == "/":
            raise InvalidValueError("the root cannot be deleted")
    else:
        raise InvalidValueError(f"not a transaction op: {op!r}")
    return op


# -- watches ---------------------------------------------------------------------------

WatchKind: TypeAlias = Literal["created", "changed", "deleted", "children"]


@dataclass(frozen=True)
class WatchEvent:
    kind: WatchKind
    path: str


class Watch:
    """A persistent "something changed at this path, re-read it" signal.

    Events may be coalesced or (after a reconnect) spurious, never silently lost while
    the watch is open: a reader re-reads on every event. Deliveries come from backend
    threads, hence the hop through the loop that created the watch.
    """

    def __init__(self, path: str, children: bool, on_close: Callable[[Watch], None]) -> None:
        self.path = path
        self.children = children
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        self._on_close = on_close
        self._closed = False
        self._waiters: set[asyncio.Future[None]] = set()

    def matches(self, event: WatchEvent) -> bool:
        if event.path != self.path:
            return False
        if self.children:
            return event.kind in ("children", "created", "deleted")
        return event.kind != "children"

    def deliver(self, event: WatchEvent) -> None:
        """Thread-safe; called by backends for every event (non-matching ones dropped)."""
        if self._closed or not self.matches(event):
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._put(event)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._put, event)

    def _put(self, event: WatchEvent | None) -> None:
        self._queue.put_nowait(event)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def wake_on_event(self, waiter: asyncio.Future[None]) -> None:
        """Complete waiter (if not done) when an event comes: one future for this and
        other wakes, where next() would need a task of its own. Then take_nowait()."""
        self._waiters.add(waiter)

    def forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def take_nowait(self) -> WatchEvent | None:
        """An event that came, if one did (None: none, or the watch closed)."""
        if self._queue.empty():
            return None
        return self._queue.get_nowait()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._closed:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def next(self, timeout_s: float) -> WatchEvent:
        """The next event, or TimeoutError after timeout_s."""
        async with asyncio.timeout(timeout_s):  # not wait_for: see backends/zookeeper.py
            return await self.__anext__()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close(self)
            self._put(None)

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


# -- coordination recipes --------------------------------------------------------------


class Lock(abc.ABC):
    """An exclusive lock held by an ephemeral node: a dead holder's session frees it."""

    @abc.abstractmethod
    async def acquire(self, timeout_s: float | None = None) -> bool:
        """Wait (at most timeout_s; None = forever) for the lock; False on timeout."""

    @abc.abstractmethod
    async def release(self) -> None: ...

    @property
    @abc.abstractmethod
    def is_acquired(self) -> bool: ...

    @abc.abstractmethod
    async def contenders(self) -> list[str]:
        """The identifiers of the lock's contenders, the holder first."""

    async def __aenter__(self) -> Lock:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()


class Election(abc.ABC):
    """Leader election among contenders; the leader's identifier is readable by all."""

    @abc.abstractmethod
    async def campaign(self) -> None:
        """Return once this contender is the leader."""

    @abc.abstractmethod
    async def resign(self) -> None: ...

    @property
    @abc.abstractmethod
    def is_leader(self) -> bool: ...

    @abc.abstractmethod
    async def leader(self) -> str | None:
        """The current leader's identifier, None when nobody leads."""


# -- the store -------------------------------------------------------------------------


class MetadataStore(abc.ABC):
    """Async, versioned, hierarchical metadata with CAS, ephemerals and watches."""

    session_id: str
    uri: str

    def __init__(self) -> None:
        self._watches: set[Watch] = set()
        # The same watches by path: an event reaches those of its path only (a broker
        # tailing thousands of ledgers has thousands of watches, and an event for each
        # write: offering every event to every watch was quadratic).
        self._watches_at: dict[str, set[Watch]] = {}
        self._watch_guard = threading.Lock()
        # (a dict, ordered: a broker holds thousands, one per lock, added and removed often)
        self._session_listeners: dict[Callable[[str], None], None] = {}
        self._loop = asyncio.get_running_loop()

    # reads --------------------------------------------------------------------------

    async def get(self, path: str) -> Versioned:
        return await self._get(validate_path(path))

    async def exists(self, path: str) -> int | None:
        """The node's version, or None when it does not exist."""
        return await self._exists(validate_path(path))

    async def children(self, path: str) -> list[str]:
        """Sorted child names (NoNodeError when the node does not exist)."""
        return sorted(await self._children(validate_path(path)))

    # writes -------------------------------------------------------------------------

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
        private: bool = False,
    ) -> str:
        """Create a node; returns its actual path (with the suffix when sequential).
        private: readable only by the store's own identity (see Create)."""
        op = Create(path, data, ephemeral, sequential, make_parents, private)
        result = await self._single(op)
        assert isinstance(result, str)
        return result

    async def set(self, path: str, data: bytes, *, version: int = -1) -> int:
        """Write a node's value if its version is `version` (-1: any); the new version."""
        result = await self._single(Set(path, data, version))
        assert isinstance(result, int)
        return result

    async def delete(self, path: str, *, version: int = -1, recursive: bool = False) -> None:
        if recursive:
            validate_op(Delete(path, version))
            await self._delete_recursive(path, version)
        else:
            await self._single(Delete(path, version))

    async def transaction(self, ops: Sequence[Op]) -> list[object]:
        """All ops or none. Results per op: True (check), path (create), version (set),
        None (delete). A failure raises TransactionError(index, cause)."""
        checked = [validate_op(op) for op in ops]
        if not checked:
            return []
        return await self._transaction(checked)

    async def _single(self, op: Op) -> object:
        try:
            return (await self._transaction([validate_op(op)]))[0]
        except TransactionError as exc:
            raise exc.cause from None

    # watches ------------------------------------------------------------------------

    def watch(self, path: str, *, children: bool = False) -> Watch:
        """Events for the node (created/changed/deleted) or, with children=True, for its
        child list (children, plus created/deleted of the node itself)."""
        watch = Watch(validate_path(path), children, self._unwatch)
        with self._watch_guard:
            self._watches.add(watch)
            self._watches_at.setdefault(watch.path, set()).add(watch)
        self._watch_added(watch)
        return watch

    def _unwatch(self, watch: Watch) -> None:
        with self._watch_guard:
            self._watches.discard(watch)
            at = self._watches_at.get(watch.path)
            if at is not None:
                at.discard(watch)
                if not at:
                    del self._watches_at[watch.path]
        self._watch_removed(watch)

    def _dispatch(self, events: Sequence[WatchEvent]) -> None:
        with self._watch_guard:
            found = [(event, list(self._watches_at.get(event.path, ()))) for event in events]
        for event, watches in found:
            for watch in watches:
                watch.deliver(event)

    def _dispatch_everyone(self) -> None:
        """After a gap we could not follow (reconnect, pruned change log): every watch
        gets a spurious event so its owner re-reads."""
        with self._watch_guard:
            watches = list(self._watches)
        for watch in watches:
            watch.deliver(WatchEvent("children" if watch.children else "changed", watch.path))

    def _watch_added(self, watch: Watch) -> None:  # noqa: B027 - optional hook
        """Backend hook (ZooKeeper arms kazoo watchers here)."""

    def _watch_removed(self, watch: Watch) -> None:  # noqa: B027 - optional hook
        """Backend hook."""

    # sessions -----------------------------------------------------------------------

    def add_session_listener(self, callback: Callable[[str], None]) -> None:
        """callback("expired") runs on the store's event loop when the session was lost
        and replaced by a new one: ephemeral nodes must be re-created."""
        self._session_listeners[callback] = None

    def remove_session_listener(self, callback: Callable[[str], None]) -> None:
        """Stop calling callback (no error if it was not added)."""
        self._session_listeners.pop(callback, None)

    def _session_expired(self) -> None:
        """Thread-safe: backends call it from wherever they notice."""

        def notify() -> None:
            for callback in list(self._session_listeners):
                callback("expired")

        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(notify)

    # backend interface --------------------------------------------------------------

    @abc.abstractmethod
    async def _get(self, path: str) -> Versioned: ...

    @abc.abstractmethod
    async def _exists(self, path: str) -> int | None: ...

    @abc.abstractmethod
    async def _children(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    async def _transaction(self, ops: list[Op]) -> list[object]: ...

    @abc.abstractmethod
    async def _delete_recursive(self, path: str, version: int) -> None: ...

    @abc.abstractmethod
    def lock(self, path: str, identifier: str) -> Lock: ...

    @abc.abstractmethod
    def election(self, path: str, identifier: str) -> Election: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session: its ephemeral nodes go away. Idempotent."""

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
