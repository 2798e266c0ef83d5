"""ZooKeeper's tree semantics over a plain node table, shared by the memory and sqlite
backends so the two cannot drift apart (ZooKeeper itself needs none of this).

A backend supplies a NodeTable (load / save / remove / children) that reads and writes
inside ITS transaction; `apply` runs the ops in order against it and either returns
the results plus the watch events, or raises TransactionError, after which the backend
rolls its transaction back. Nothing here knows about threads, files or asyncio.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, replace

from metadata.errors import (
    BadVersionError,
    MetadataError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    TransactionError,
)
from metadata.paths import ancestors, parent_of, sequential_name
from metadata.store import CheckVersion, Create, Op, Set, WatchEvent


@dataclass(frozen=True)
class Node:
    path: str
    data: bytes
    version: int
    # Counter for sequential children: ZooKeeper uses the parent's cversion the same way.
    seq: int = 0
    ephemeral_owner: str | None = None


class NodeTable(abc.ABC):
    @abc.abstractmethod
    def load(self, path: str) -> Node | None: ...

    @abc.abstractmethod
    def save(self, node: Node) -> None:
        """Insert or replace."""

    @abc.abstractmethod
    def remove(self, path: str) -> None: ...

    @abc.abstractmethod
    def child_names(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    def ephemerals_of(self, owner: str) -> list[str]: ...


# Every backend stores the root node from the start.
ROOT = Node("/", b"", 0)


def apply(
    table: NodeTable, ops: list[Op], session_id: str
) -> tuple[list[object], list[WatchEvent]]:
    results: list[object] = []
    events: list[WatchEvent] = []
    for index, op in enumerate(ops):
        try:
            results.append(_apply_one(table, op, session_id, events))
        except MetadataError as exc:
            raise TransactionError(index, exc) from None
    return results, events


def _apply_one(table: NodeTable, op: Op, session_id: str, events: list[WatchEvent]) -> object:
    if isinstance(op, CheckVersion):
        node = _existing(table, op.path)
        if node.version != op.version:
            raise BadVersionError(f"{op.path} is at version {node.version}, expected {op.version}")
        return True
    if isinstance(op, Create):
        return _create(table, op, session_id, events)
    if isinstance(op, Set):
        node = _existing(table, op.path)
        _check_version(node, op.version)
        table.save(replace(node, data=op.data, version=node.version + 1))
        events.append(WatchEvent("changed", op.path))
        return node.version + 1
    node = _existing(table, op.path)
    _check_version(node, op.version)
    if table.child_names(op.path):
        raise NotEmptyError(f"{op.path} has children")
    remove_node(table, op.path, events)
    return None


def _create(table: NodeTable, op: Create, session_id: str, events: list[WatchEvent]) -> str:
    if op.make_parents:
        for ancestor in ancestors(op.path):
            if table.load(ancestor) is None:
                _create(table, Create(ancestor), session_id, events)
    parent_path = parent_of(op.path)
    parent = table.load(parent_path)
    if parent is None:
        raise NoNodeError(f"parent {parent_path} of {op.path} does not exist")
    if parent.ephemeral_owner is not None:
        raise NoChildrenForEphemeralsError(f"{parent_path} is ephemeral and cannot have children")
    path = op.path
    if op.sequential:
        path = sequential_name(op.path, parent.seq)
        table.save(replace(parent, seq=parent.seq + 1))
    if table.load(path) is not None:
        raise NodeExistsError(f"{path} already exists")
    table.save(Node(path, op.data, 0, 0, session_id if op.ephemeral else None))
    events += [WatchEvent("created", path), WatchEvent("children", parent_path)]
    return path


def remove_node(table: NodeTable, path: str, events: list[WatchEvent]) -> None:
    table.remove(path)
    events += [WatchEvent("deleted", path), WatchEvent("children", parent_of(path))]


def delete_recursive(table: NodeTable, path: str, version: int) -> list[WatchEvent]:
    node = _existing(table, path)
    _check_version(node, version)
    events: list[WatchEvent] = []

    def walk(p: str) -> None:
        for child in table.child_names(p):
            walk(p.rstrip("/") + "/" + child)
        remove_node(table, p, events)

    walk(path)
    return events


def reap_session(table: NodeTable, owner: str) -> list[WatchEvent]:
    """Delete every ephemeral node of a dead or closed session."""
    events: list[WatchEvent] = []
    for path in table.ephemerals_of(owner):
        remove_node(table, path, events)
    return events


def read(table: NodeTable, path: str) -> Node:
    return _existing(table, path)


def _existing(table: NodeTable, path: str) -> Node:
    node = table.load(path)
    if node is None:
        raise NoNodeError(f"{path} does not exist")
    return node


def _check_version(node: Node, version: int) -> None:
    if version != -1 and node.version != version:
        raise BadVersionError(f"{node.path} is at version {node.version}, expected {version}")
