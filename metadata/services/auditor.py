"""The auditor's election (ARCHITECTURE.md §6): exactly one auditor runs at a time; and
the shape every elected role of the cluster shares (the brokers' load manager's too)."""

from __future__ import annotations

from metadata.services._base import DEFAULT_ROOT, Service
from metadata.store import MetadataStore


class ElectedRole(Service):
    """One process at a time holds the role: an election under `path` (kazoo's recipe on
    ZooKeeper; the same algorithm on the embedded stores)."""

    path_parts: tuple[str, ...] = ()

    def __init__(self, store: MetadataStore, identifier: str, root: str = DEFAULT_ROOT) -> None:
        super().__init__(store, root)
        self.identifier = identifier
        self._election = store.election(self.path(*self.path_parts), identifier)

    async def campaign(self) -> None:
        """Return once this process holds the role."""
        await self._election.campaign()

    async def resign(self) -> None:
        await self._election.resign()

    @property
    def is_leader(self) -> bool:
        return self._election.is_leader

    async def leader(self) -> str | None:
        """The current holder's identifier, None when there is none."""
        return await self._election.leader()


class AuditorElection(ElectedRole):
    path_parts = ("auditor", "election")
