"""The cluster instance id: which cluster a metadata store holds (BookKeeper's INSTANCEID).

Created once, by the first bookie that starts with empty directories against a store
that has none (BookKeeper creates it when the cluster is formatted; our clusters are
formatted by their first bookie so a fresh sandbox needs no extra step), and never
changed. Every bookie cookie records it, so a bookie pointed at the wrong store (a
mistyped URI, a new or wiped store) sees a missing or different id and refuses to
start instead of taking every ledger it holds for deleted.
"""

from __future__ import annotations

import time
import uuid

from metadata.errors import NodeExistsError, NoNodeError
from metadata.schemas import ClusterInstance as ClusterInstanceRecord
from metadata.schemas import decode, encode
from metadata.services._base import Service


class ClusterInstance(Service):
    def _instance_path(self) -> str:
        return self.path("instance")

    async def read(self) -> str | None:
        """The store's cluster instance id, None when the store has none."""
        try:
            stored = await self.store.get(self._instance_path())
        except NoNodeError:
            return None
        return decode(ClusterInstanceRecord, stored.data).instance_id

    async def create_if_absent(self) -> str:
        """The store's cluster instance id, made now (a new uuid) if it has none.

        Create-if-absent on one node, so processes racing to found the cluster all end
        up with the one id that won the create.
        """
        found = await self.read()
        if found is not None:
            return found
        record = ClusterInstanceRecord(
            instance_id=str(uuid.uuid4()), created_ms=int(time.time() * 1000)
        )
        await self.ensure(self.root)
        try:
            await self.store.create(self._instance_path(), encode(record))
        except NodeExistsError:
            winner = await self.read()
            assert winner is not None  # the node is never deleted by this service
            return winner
        return record.instance_id
