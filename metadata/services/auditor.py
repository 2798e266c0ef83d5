"""The auditor's election (ARCHITECTURE.md §6): exactly one auditor runs at a time."""

from __future__ import annotations

from metadata.services._base import DEFAULT_ROOT, Service
from metadata.store import MetadataStore


class AuditorElection(Service):
    def __init__(self, store: MetadataStore, identifier: str, root: str = DEFAULT_ROOT) -> None:
        super().__init__(store, root)
        self.identifier = identifier
        self._election = store.election(self.path("auditor", "election"), identifier)

    async def campaign(self) -> None:
        """Return once this process is the auditor."""
        await self._election.campaign()

    async def resign(self) -> None:
        await self._election.resign()

    @property
    def is_leader(self) -> bool:
        return self._election.is_leader

    async def leader(self) -> str | None:
        """The current auditor's identifier, None when there is none."""
        return await self._election.leader()
