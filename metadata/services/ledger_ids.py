"""Ledger ids unique across every process sharing the store.

One counter node holds the next free id; a generator reserves a range of batch_size
ids with one CAS and hands them out locally. A crashed process leaks the rest of its
range, which is harmless: ids only need to be unique, not dense. Ids start at 1 (0 is
never handed out, so a zero id in a record always means "unset").
"""

from __future__ import annotations

import asyncio

from metadata.errors import BadVersionError, NodeExistsError, NoNodeError
from metadata.services._base import DEFAULT_ROOT, Service
from metadata.store import MetadataStore

FIRST_ID = 1
MAX_ID = 2**63 - 1


class LedgerIdGenerator(Service):
    def __init__(
        self, store: MetadataStore, root: str = DEFAULT_ROOT, *, batch_size: int = 16
    ) -> None:
        super().__init__(store, root)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self._next = 0
        self._end = 0  # exclusive end of the reserved range
        self._guard = asyncio.Lock()

    async def next_id(self) -> int:
        async with self._guard:
            if self._next >= self._end:
                self._next, self._end = await self._reserve()
            ledger_id = self._next
            self._next += 1
            return ledger_id

    async def _reserve(self) -> tuple[int, int]:
        counter = self.path("idgen")
        while True:
            try:
                current = await self.store.get(counter)
            except NoNodeError:
                await self.ensure(self.root)
                try:
                    await self.store.create(counter, _encode(FIRST_ID))
                except NodeExistsError:
                    pass
                continue
            start = int.from_bytes(current.data, "big")
            end = start + self.batch_size
            if end > MAX_ID:
                raise OverflowError("ledger ids exhausted (2**63)")
            try:
                await self.store.set(counter, _encode(end), version=current.version)
            except BadVersionError:
                continue  # another process reserved a range first; take the next one
            return start, end


def _encode(value: int) -> bytes:
    return value.to_bytes(8, "big")
