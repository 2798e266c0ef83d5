"""memory:// — the whole tree in one process's memory, for unit tests.

"memory://" gives a private tree; "memory://NAME" shares one tree between every store
connected with that name in this process, each store its own session (so tests can
watch one client's ephemerals vanish when it closes).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from metadata.backends import _tree
from metadata.backends._recipes import SequentialElection, SequentialLock
from metadata.errors import SessionExpiredError
from metadata.paths import name_of, parent_of
from metadata.store import Election, Lock, MetadataStore, Op, Versioned, WatchEvent


class _MemoryTable(_tree.NodeTable):
    """Nodes in dicts, with an undo log so a failed transaction leaves no trace."""

    def __init__(self) -> None:
        self.nodes: dict[str, _tree.Node] = {"/": _tree.ROOT}
        self.kids: dict[str, set[str]] = {"/": set()}
        self.undo: list[tuple[str, _tree.Node | None]] | None = None

    def load(self, path: str) -> _tree.Node | None:
        return self.nodes.get(path)

    def _remember(self, path: str) -> None:
        if self.undo is not None:
            self.undo.append((path, self.nodes.get(path)))

    def save(self, node: _tree.Node) -> None:
        self._remember(node.path)
        if node.path not in self.nodes:
            self.kids.setdefault(parent_of(node.path), set()).add(name_of(node.path))
            self.kids[node.path] = set()
        self.nodes[node.path] = node

    def remove(self, path: str) -> None:
        self._remember(path)
        del self.nodes[path]
        self.kids.pop(path, None)
        self.kids[parent_of(path)].discard(name_of(path))

    def child_names(self, path: str) -> list[str]:
        return list(self.kids.get(path, ()))

    def ephemerals_of(self, owner: str) -> list[str]:
        return [p for p, n in self.nodes.items() if n.ephemeral_owner == owner]

    def rollback(self, undo: list[tuple[str, _tree.Node | None]]) -> None:
        self.undo = None
        for path, before in reversed(undo):
            if before is None:
                if path in self.nodes:
                    self.remove(path)
            else:
                self.save(before)


class _MemoryTree:
    def __init__(self) -> None:
        self.table = _MemoryTable()
        self.guard = threading.Lock()
        self.stores: weakref.WeakSet[MemoryStore] = weakref.WeakSet()

    def publish(self, events: list[WatchEvent]) -> None:
        for store in list(self.stores):
            store._dispatch(events)


T = TypeVar("T")
_named_trees: dict[str, _MemoryTree] = {}
_named_guard = threading.Lock()
_session_ids = itertools.count(1)


class MemoryStore(MetadataStore):
    def __init__(self, name: str = "") -> None:
        super().__init__()
        if name:
            with _named_guard:
                self._tree = _named_trees.setdefault(name, _MemoryTree())
        else:
            self._tree = _MemoryTree()
        self.uri = f"memory://{name}"
        self.session_id = f"memory-{next(_session_ids)}"
        self._closed = False
        self._tree.stores.add(self)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionExpiredError(f"store {self.uri} session {self.session_id} is closed")

    async def _get(self, path: str) -> Versioned:
        self._check_open()
        with self._tree.guard:
            node = _tree.read(self._tree.table, path)
        return Versioned(node.data, node.version)

    async def _exists(self, path: str) -> int | None:
        self._check_open()
        with self._tree.guard:
            node = self._tree.table.load(path)
        return None if node is None else node.version

    async def _children(self, path: str) -> list[str]:
        self._check_open()
        with self._tree.guard:
            _tree.read(self._tree.table, path)
            return self._tree.table.child_names(path)

    async def _transaction(self, ops: list[Op]) -> list[object]:
        return self._mutate(lambda table: _tree.apply(table, ops, self.session_id))

    async def _delete_recursive(self, path: str, version: int) -> None:
        self._mutate(lambda table: (None, _tree.delete_recursive(table, path, version)))

    def _mutate(self, change: Callable[[_MemoryTable], tuple[T, list[WatchEvent]]]) -> T:
        self._check_open()
        table = self._tree.table
        with self._tree.guard:
            undo: list[tuple[str, _tree.Node | None]] = []
            table.undo = undo
            try:
                result, events = change(table)
            except BaseException:
                table.rollback(undo)
                raise
            table.undo = None
        self._tree.publish(events)
        return result

    def lock(self, path: str, identifier: str) -> Lock:
        return SequentialLock(self, path, identifier)

    def election(self, path: str, identifier: str) -> Election:
        return SequentialElection(self, path, identifier)

    async def close(self) -> None:
        if self._closed:
            return
        with self._tree.guard:
            events = _tree.reap_session(self._tree.table, self.session_id)
        self._closed = True
        self._tree.publish(events)
        self._tree.stores.discard(self)
