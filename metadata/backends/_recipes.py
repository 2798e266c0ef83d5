"""Lock and Election for the backends without kazoo's recipes (memory, sqlite).

The same algorithm as kazoo's Lock: each contender creates an ephemeral sequential
node under the lock path; the lowest sequence number holds the lock; the others wait
for the child list to change. A dead contender's session takes its node with it, so
the lock or the leadership passes on.
"""

from __future__ import annotations

import asyncio
import time

from metadata.errors import NodeExistsError, NoNodeError
from metadata.paths import SEQUENCE_DIGITS, join
from metadata.store import Election, Lock, MetadataStore

PREFIX = "contender-"


def _by_sequence(names: list[str]) -> list[str]:
    return sorted((n for n in names if n.startswith(PREFIX)), key=lambda n: n[-SEQUENCE_DIGITS:])


class SequentialLock(Lock):
    def __init__(self, store: MetadataStore, path: str, identifier: str) -> None:
        self._store = store
        self._path = path
        self._identifier = identifier
        self._node: str | None = None
        self._acquired = False

    def _on_session_expired(self, _event: str) -> None:
        # The session that owned our node is gone, and the node with it.
        self._node = None
        self._acquired = False

    @property
    def is_acquired(self) -> bool:
        return self._acquired

    async def acquire(self, timeout_s: float | None = None) -> bool:
        if self._acquired:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # Listening only while contending or holding (release stops it): a lock made per
        # consumer must not leave a listener behind on a long-lived store.
        self._store.remove_session_listener(self._on_session_expired)
        self._store.add_session_listener(self._on_session_expired)
        try:
            await self._store.create(self._path, make_parents=True)
        except NodeExistsError:
            pass  # the usual case: the lock directory is there already
        self._node = await self._store.create(
            join(self._path, PREFIX), self._identifier.encode(), ephemeral=True, sequential=True
        )
        ours = self._node.rsplit("/", 1)[1]
        try:
            async with self._store.watch(self._path, children=True) as watch:
                while True:
                    contenders = _by_sequence(await self._store.children(self._path))
                    if ours not in contenders:
                        raise NoNodeError(f"lock node {self._node} vanished (session lost?)")
                    if contenders[0] == ours:
                        self._acquired = True
                        return True
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        await self._give_up()
                        return False
                    try:
                        await watch.next(remaining if remaining is not None else 3600.0)
                    except TimeoutError:
                        continue
        except BaseException:
            await asyncio.shield(self._give_up())
            raise

    async def _give_up(self) -> None:
        self._store.remove_session_listener(self._on_session_expired)
        node, self._node = self._node, None
        if node is not None:
            try:
                await self._store.delete(node)
            except NoNodeError:
                pass

    async def release(self) -> None:
        self._acquired = False
        await self._give_up()

    async def contenders(self) -> list[str]:
        """Identifiers of the contenders, the holder first."""
        found = []
        try:
            names = _by_sequence(await self._store.children(self._path))
        except NoNodeError:
            return []
        for name in names:
            try:
                found.append((await self._store.get(join(self._path, name))).data.decode())
            except NoNodeError:
                continue
        return found


class SequentialElection(Election):
    """kazoo's Election is a Lock whose holder leads; so is this one."""

    def __init__(self, store: MetadataStore, path: str, identifier: str) -> None:
        self._lock = SequentialLock(store, path, identifier)

    async def campaign(self) -> None:
        await self._lock.acquire()

    async def resign(self) -> None:
        await self._lock.release()

    @property
    def is_leader(self) -> bool:
        return self._lock.is_acquired

    async def leader(self) -> str | None:
        contenders = await self._lock.contenders()
        return contenders[0] if contenders else None
