"""Under-replicated ledgers (ARCHITECTURE.md §6): the auditor marks them, replication
workers lock one at a time (an ephemeral lock, so a dead worker frees it), repair it and
mark it done. An admin can disable auto-recovery as a whole.
"""

from __future__ import annotations

import time

from metadata.errors import BadVersionError, NodeExistsError, NoNodeError
from metadata.schemas import UnderReplicatedLedger, decode, encode
from metadata.services._base import Service, validate_ledger_id
from metadata.store import Delete


def _name(ledger_id: int) -> str:
    return f"{validate_ledger_id(ledger_id):020d}"


class UnderReplicationManager(Service):
    def _mark_path(self, ledger_id: int) -> str:
        return self.path("underreplication", "ledgers", _name(ledger_id))

    def _lock_path(self, ledger_id: int) -> str:
        return self.path("underreplication", "locks", _name(ledger_id))

    async def mark(self, ledger_id: int, missing_bookies: list[str]) -> None:
        """Mark the ledger under-replicated; merges with an existing mark's bookies."""
        path = self._mark_path(ledger_id)
        await self.ensure(self.path("underreplication", "ledgers"))
        while True:
            try:
                stored = await self.store.get(path)
            except NoNodeError:
                record = UnderReplicatedLedger(
                    ledger_id=ledger_id,
                    missing_bookies=sorted(set(missing_bookies)),
                    marked_ms=int(time.time() * 1000),
                )
                try:
                    await self.store.create(path, encode(record))
                    return
                except NodeExistsError:
                    continue  # marked concurrently: merge with it
            record = decode(UnderReplicatedLedger, stored.data)
            merged = sorted(set(record.missing_bookies) | set(missing_bookies))
            if merged == list(record.missing_bookies):
                return
            del record.missing_bookies[:]
            record.missing_bookies.extend(merged)
            try:
                await self.store.set(path, encode(record), version=stored.version)
                return
            except BadVersionError:
                continue

    async def get(self, ledger_id: int) -> UnderReplicatedLedger | None:
        try:
            return decode(
                UnderReplicatedLedger, (await self.store.get(self._mark_path(ledger_id))).data
            )
        except NoNodeError:
            return None

    async def list(self) -> list[UnderReplicatedLedger]:
        try:
            names = await self.store.children(self.path("underreplication", "ledgers"))
        except NoNodeError:
            return []
        found = [await self.get(int(name)) for name in names]
        return [record for record in found if record is not None]

    async def try_lock(self, ledger_id: int) -> bool:
        """Take the ledger's replication lock (ephemeral); False if another worker has it."""
        await self.ensure(self.path("underreplication", "locks"))
        try:
            await self.store.create(self._lock_path(ledger_id), ephemeral=True)
        except NodeExistsError:
            return False
        return True

    async def is_locked(self, ledger_id: int) -> bool:
        return await self.store.exists(self._lock_path(ledger_id)) is not None

    async def release(self, ledger_id: int) -> None:
        """Give the lock back without finishing (the ledger stays marked)."""
        try:
            await self.store.delete(self._lock_path(ledger_id))
        except NoNodeError:
            pass

    async def done(self, ledger_id: int) -> None:
        """The ledger is fully replicated again: clear its mark and its lock together."""
        ops = []
        if await self.store.exists(self._mark_path(ledger_id)) is not None:
            ops.append(Delete(self._mark_path(ledger_id)))
        if await self.store.exists(self._lock_path(ledger_id)) is not None:
            ops.append(Delete(self._lock_path(ledger_id)))
        await self.store.transaction(ops)

    async def is_enabled(self) -> bool:
        return await self.store.exists(self.path("underreplication", "disabled")) is None

    async def set_enabled(self, enabled: bool) -> None:
        flag = self.path("underreplication", "disabled")
        if enabled:
            try:
                await self.store.delete(flag)
            except NoNodeError:
                pass
        else:
            try:
                await self.store.create(flag, make_parents=True)
            except NodeExistsError:
                pass
