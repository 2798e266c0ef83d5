"""The client: one metadata session, connections to bookies, and the APIs on top.

client = await streamlib.Client.connect("sqlite:///tmp/sandbox/meta.db")
writer = await client.ledgers.create(ensemble=3, write_quorum=2, ack_quorum=2)
await writer.append(b"hello")
"""

from __future__ import annotations

from typing import Any

import metadata
from metadata.services.bookies import BookieRegistry
from metadata.services.ledger_ids import LedgerIdGenerator
from metadata.services.ledgers import LedgerMetadataManager
from streamlib.ledger.bookie_client import BookieClientConfig
from streamlib.ledger.driver import Context
from streamlib.ledger.manager import LedgerManager
from streamlib.ledger.placement import PlacementPolicy
from streamlib.ledger.pool import BookiePool


class Client:
    def __init__(
        self,
        store: metadata.MetadataStore,
        *,
        rack_aware: bool = False,
        bookie_config: BookieClientConfig | None = None,
    ) -> None:
        self.store = store
        self.registry = BookieRegistry(store)
        self.pool = BookiePool(self.registry, bookie_config)
        self.context = Context(
            LedgerMetadataManager(store), self.pool, PlacementPolicy(rack_aware=rack_aware)
        )
        self.ledgers = LedgerManager(self.context, LedgerIdGenerator(store))

    @classmethod
    async def connect(cls, uri: str, **options: Any) -> Client:
        """Connect to the metadata store at uri (zk://, sqlite://, memory://)."""
        store_options = {k: options.pop(k) for k in ("session_timeout_s",) if k in options}
        store = await metadata.connect(uri, **store_options)
        return cls(store, **options)

    async def close(self) -> None:
        await self.pool.close()
        await self.store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
