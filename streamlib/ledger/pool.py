"""Connections to bookies, by bookie id, with addresses from the bookie registry.

A bookie id is a stable name; its address is whatever the bookie registered last (a
bookie restarted on a new IP keeps its id). Clients learn addresses when they list the
registry, and when a bookie cannot be reached they look its registration up again (at
most every ADDRESS_RECHECK_S): a new address replaces the connection, so the next call
dials the bookie where it is now.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from metadata.errors import MetadataError
from metadata.schemas import BookieInfo
from metadata.services.bookies import BookieRegistry
from streamlib.ledger.bookie_client import BookieClient, BookieClientConfig
from streamlib.ledger.placement import Candidate
from streamlib.tasks import HeldTasks, Recent

log = logging.getLogger(__name__)

ADDRESS_RECHECK_S = 1.0


class BookiePool:
    def __init__(self, registry: BookieRegistry, config: BookieClientConfig | None = None):
        self.registry = registry
        self.config = config or BookieClientConfig()
        self._clients: dict[str, BookieClient] = {}
        self._addresses: dict[str, str] = {}
        self._framed: dict[str, str] = {}  # framed add stream addresses ("": none)
        self.racks: dict[str, str] = {}
        self._rechecked: dict[str, float] = {}
        self._tasks = HeldTasks("bookie pool")  # address look-ups, retired connections
        self._listed: Recent[list[BookieInfo]] = Recent()  # (writable's last read)

    def _learn(self, bookie_id: str, address: str, framed: str = "") -> None:
        """Remember a registered address and framed add stream address; a changed
        address retires the old connection."""
        old = self._addresses.get(bookie_id)
        old_framed = self._framed.get(bookie_id, "")
        self._addresses[bookie_id] = address
        self._framed[bookie_id] = framed
        client = self._clients.get(bookie_id)
        if client is not None and framed != old_framed:
            # (Its next add stream opens there; the one open now goes on.)
            client.framed_address = framed or None
        if old is not None and old != address and client is not None:
            log.info("bookie %s moved from %s to %s", bookie_id, old, address)
            del self._clients[bookie_id]
            self._tasks.spawn(client.close())

    async def writable(self, max_age_s: float = 0.0) -> list[Candidate]:
        """Live writable bookies (and remember their addresses). max_age_s: a list read
        within that long will do (concurrent callers share one read) -- for a new
        ledger's ensemble, where a bookie that went meanwhile is replaced as any that
        fails (an ensemble change), not for the replacing itself."""
        if max_age_s > 0:
            infos = await self._listed.get(self.registry.list, max_age_s)
        else:
            infos = await self.registry.list()
        for info in infos:
            self._learn(info.bookie_id, info.address, info.framed_address)
            self.racks[info.bookie_id] = info.rack
        return [Candidate(i.bookie_id, i.rack) for i in infos if not i.read_only]

    async def prepare(self, bookie_ids: Iterable[str]) -> None:
        """Make sure each bookie has an address (registry, else its id when it is one)."""
        missing = [b for b in bookie_ids if b not in self._addresses]
        if missing:
            for info in await self.registry.list():
                self._learn(info.bookie_id, info.address, info.framed_address)
                self.racks[info.bookie_id] = info.rack
        for bookie_id in missing:
            # A bookie that is down is not registered; BookKeeper ids default to the
            # address, so an id of host:port is tried as one (a down bookie then fails
            # like any unreachable one: answers are unknown, never negative).
            self._addresses.setdefault(bookie_id, bookie_id)

    def get(self, bookie_id: str) -> BookieClient:
        client = self._clients.get(bookie_id)
        if client is None:
            address = self._addresses.get(bookie_id, bookie_id)
            client = self._clients[bookie_id] = BookieClient(
                bookie_id,
                address,
                self.config,
                on_unavailable=lambda: self._recheck(bookie_id),
                framed_address=self._framed.get(bookie_id),
            )
        return client

    def _recheck(self, bookie_id: str) -> None:
        """The bookie could not be reached: look its registration up again soon."""
        now = time.monotonic()
        if now - self._rechecked.get(bookie_id, -ADDRESS_RECHECK_S) < ADDRESS_RECHECK_S:
            return
        self._rechecked[bookie_id] = now
        self._tasks.spawn(self._lookup(bookie_id))

    async def _lookup(self, bookie_id: str) -> None:
        try:
            info = await self.registry.get(bookie_id)
        except MetadataError as e:  # the store is unreachable too: the next failure retries
            log.debug("address lookup of bookie %s failed: %s", bookie_id, e)
            return
        if info is not None:
            self._learn(bookie_id, info.address, info.framed_address)

    async def close(self) -> None:
        await self._tasks.close()
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
