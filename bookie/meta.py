"""The bookie's link to the metadata store: cookie, registration, ledger existence.

Kept apart so the rest of the bookie speaks plain values (BookieCookie, a dict of
registration fields) and only this module knows the metadata package's classes.
"""

from __future__ import annotations

import asyncio
import time

import metadata
from bookie.cookie import BookieCookie
from metadata.errors import NodeExistsError, NoSuchLedgerError
from metadata.schemas import BookieInfo, Cookie
from metadata.services.bookies import BookieRegistry
from metadata.services.cluster import ClusterInstance
from metadata.services.cookies import CookieStore
from metadata.services.ledgers import LedgerMetadataManager
from metadata.uri import redact_uri


class MetadataLink:
    def __init__(
        self,
        store: metadata.MetadataStore,
        bookie_id: str,
        session_timeout_s: float,
        *,
        uri: str | None = None,
    ) -> None:
        self.store = store
        self.bookie_id = bookie_id
        self.session_timeout_s = session_timeout_s
        # The URI as given (a zk one keeps its auth option, which store.uri drops), for
        # messages that tell an operator which store to point a command at.
        self.uri = redact_uri(uri or store.uri)
        self.registry = BookieRegistry(store)
        self.cookies = CookieStore(store)
        self.cluster = ClusterInstance(store)
        self.ledgers = LedgerMetadataManager(store)

    @classmethod
    async def connect(cls, uri: str, bookie_id: str, session_timeout_s: float) -> MetadataLink:
        store = await metadata.connect(uri, session_timeout_s=session_timeout_s)
        return cls(store, bookie_id, session_timeout_s, uri=uri)

    async def read_cookie(self) -> BookieCookie | None:
        found = await self.cookies.read(self.bookie_id)
        if found is None:
            return None
        c, _version = found
        return BookieCookie(
            bookie_id=c.bookie_id,
            instance_id=c.instance_id,
            journal_dir=c.journal_dir,
            data_dirs=tuple(c.data_dirs),
            created_ms=c.created_ms,
            cluster_instance_id=c.cluster_instance_id,
        )

    async def write_cookie(self, cookie: BookieCookie, *, replace: bool = False) -> None:
        """Create the store's cookie, or (replace) overwrite the one there by CAS on the
        version just read, so a concurrent change fails instead of being lost."""
        record = Cookie(
            bookie_id=cookie.bookie_id,
            instance_id=cookie.instance_id,
            journal_dir=cookie.journal_dir,
            data_dirs=list(cookie.data_dirs),
            created_ms=cookie.created_ms,
            cluster_instance_id=cookie.cluster_instance_id,
        )
        found = await self.cookies.read(self.bookie_id) if replace else None
        await self.cookies.write(record, None if found is None else found[1])

    async def read_cluster_instance(self) -> str | None:
        return await self.cluster.read()

    async def create_cluster_instance(self) -> str:
        return await self.cluster.create_if_absent()

    async def register(self, fields: dict[str, object]) -> None:
        """Register; after a crash, wait for the dead process's session to be reaped."""
        info = BookieInfo(registered_ms=int(time.time() * 1000), **fields)  # type: ignore[arg-type]
        deadline = time.monotonic() + 3 * self.session_timeout_s + 5
        delay = 0.05
        while True:
            try:
                await self.registry.register(info)
                return
            except NodeExistsError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay)  # a retry back-off, not synchronisation
            delay = min(delay * 2, 1.0)

    async def set_read_only(self, read_only: bool) -> None:
        await self.registry.set_read_only(self.bookie_id, read_only)

    async def ledger_exists(self, ledger_id: int) -> bool:
        return bool(await self.ledgers.exists(ledger_id))

    async def first_entry(self, ledger_id: int) -> int | None:
        """The ledger's first entry still listed (fragment retention drops the ones
        before it), or None when its metadata is gone. Other failures raise: a metadata
        outage must never look like a deletion."""
        try:
            stored, _ = await self.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            return None
        return max(0, stored.first_entry_id)

    async def close(self) -> None:
        try:
            # Only a registration this link made: a bookie refused at start (its id is
            # in use) must not delete the live bookie's registration on its way out.
            if self.registry.registered(self.bookie_id):
                await self.registry.unregister(self.bookie_id)
        finally:
            await self.store.close()
