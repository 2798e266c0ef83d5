"""Connections to bookies, by bookie id, with addresses from the bookie registry."""

from __future__ import annotations

from collections.abc import Iterable

from metadata.services.bookies import BookieRegistry
from streamlib.ledger.bookie_client import BookieClient, BookieClientConfig
from streamlib.ledger.placement import Candidate


class BookiePool:
    def __init__(self, registry: BookieRegistry, config: BookieClientConfig | None = None):
        self.registry = registry
        self.config = config or BookieClientConfig()
        self._clients: dict[str, BookieClient] = {}
        self._addresses: dict[str, str] = {}
        self.racks: dict[str, str] = {}

    async def writable(self) -> list[Candidate]:
        """Live writable bookies (and remember their addresses)."""
        infos = await self.registry.list()
        for info in infos:
            self._addresses[info.bookie_id] = info.address
            self.racks[info.bookie_id] = info.rack
        return [Candidate(i.bookie_id, i.rack) for i in infos if not i.read_only]

    async def prepare(self, bookie_ids: Iterable[str]) -> None:
        """Make sure each bookie has an address (registry, else its id when it is one)."""
        missing = [b for b in bookie_ids if b not in self._addresses]
        if missing:
            for info in await self.registry.list():
                self._addresses[info.bookie_id] = info.address
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
            client = self._clients[bookie_id] = BookieClient(bookie_id, address, self.config)
        return client

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
