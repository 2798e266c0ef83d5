"""The bookie registry: each live bookie holds an ephemeral node with its BookieInfo.

The node belongs to the bookie's session, so a crashed bookie disappears from the
registry once its session expires. A registry remembers what it registered and
registers it again when its session is replaced (ZooKeeper expiry, sqlite reaping).
"""

from __future__ import annotations

import asyncio
import builtins

from metadata.errors import NodeExistsError, NoNodeError
from metadata.schemas import BookieInfo, decode, encode
from metadata.services._base import DEFAULT_ROOT, Service, validate_name
from metadata.store import MetadataStore, Watch


class BookieRegistry(Service):
    def __init__(self, store: MetadataStore, root: str = DEFAULT_ROOT) -> None:
        super().__init__(store, root)
        self._ours: dict[str, BookieInfo] = {}
        self._reregistering: set[asyncio.Task[None]] = set()
        store.add_session_listener(self._on_session_expired)

    def _bookie_path(self, bookie_id: str) -> str:
        return self.path("bookies", "available", validate_name("bookie", bookie_id))

    async def register(self, info: BookieInfo) -> None:
        """Announce a live bookie (NodeExistsError if another live session holds the id:
        a second process with the same identity, or the old session not yet expired)."""
        path = self._bookie_path(info.bookie_id)
        await self.ensure(self.path("bookies", "available"))
        data = encode(info)
        if info.bookie_id in self._ours:
            await self.store.set(path, data)
        else:
            try:
                await self.store.create(path, data, ephemeral=True)
            except NodeExistsError:
                raise NodeExistsError(
                    f"bookie {info.bookie_id} is registered by another live session; "
                    "wait for it to expire or stop the other process"
                ) from None
        self._ours[info.bookie_id] = info

    async def set_read_only(self, bookie_id: str, read_only: bool) -> None:
        info = self._ours.get(bookie_id)
        if info is None:
            raise NoNodeError(f"bookie {bookie_id} was not registered through this registry")
        info.read_only = read_only
        await self.store.set(self._bookie_path(bookie_id), encode(info))

    def registered(self, bookie_id: str) -> bool:
        """Whether THIS registry (its session) registered bookie_id."""
        return bookie_id in self._ours

    async def unregister(self, bookie_id: str) -> None:
        self._ours.pop(bookie_id, None)
        try:
            await self.store.delete(self._bookie_path(bookie_id))
        except NoNodeError:
            pass

    async def get(self, bookie_id: str) -> BookieInfo | None:
        try:
            return decode(BookieInfo, (await self.store.get(self._bookie_path(bookie_id))).data)
        except NoNodeError:
            return None

    async def list(self) -> list[BookieInfo]:
        """Every live bookie, writable or read-only, sorted by id."""
        try:
            ids = await self.store.children(self.path("bookies", "available"))
        except NoNodeError:
            return []
        found = [await self.get(bookie_id) for bookie_id in ids]
        return [info for info in found if info is not None]

    async def writable(self) -> builtins.list[BookieInfo]:
        return [info for info in await self.list() if not info.read_only]

    def watch(self) -> Watch:
        """Fires when bookies come and go (re-read list()); read-only flips change a
        bookie's own node, which get() re-reads."""
        return self.store.watch(self.path("bookies", "available"), children=True)

    def _on_session_expired(self, _event: str) -> None:
        if not self._ours:
            return
        task = asyncio.get_running_loop().create_task(self._reregister())
        self._reregistering.add(task)
        task.add_done_callback(self._reregistering.discard)

    async def _reregister(self) -> None:
        for info in list(self._ours.values()):
            self._ours.pop(info.bookie_id, None)
            await self.register(info)
