"""Ledger ids unique across every process sharing the store.

One counter node holds the next free id; a generator reserves a range of batch_size
ids (or as many as callers wait for, when more do) with one CAS and hands them out
locally. A crashed process leaks the rest of its
range, which is harmless: ids only need to be unique, not dense. Ids start at 1 (0 is
never handed out, so a zero id in a record always means "unset").
"""

from __future__ import annotations

import asyncio
import contextlib

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
        # Callers waiting for an id, first come first served, and the task reserving
        # ids for them: concurrent callers share one reservation (one CAS) of at least
        # as many ids as wait. With batch_size 1 no id is kept for later, so an id
        # always goes to a caller that was already waiting when it was reserved: a
        # ledger created after another one (in any process) has the higher id -- the
        # order a stream's ledgers rely on.
        self._waiting: list[asyncio.Future[int]] = []
        self._reserving: asyncio.Task[None] | None = None

    async def next_id(self) -> int:
        if self._next < self._end and not self._waiting:
            ledger_id = self._next
            self._next += 1
            return ledger_id
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        if self._reserving is None:
            self._reserving = asyncio.get_running_loop().create_task(self._serve_waiting())
        try:
            return await future
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):  # (not in line: being served, or served)
                self._waiting.remove(future)
            raise

    async def _serve_waiting(self) -> None:
        try:
            while self._waiting:
                self._hand_out(self._waiting)  # (what is left of a range kept)
                if not self._waiting:
                    break
                # Those waiting now, and only they, are served by this reservation; with
                # batch_size 1 nothing is kept (one that comes meanwhile waits for the next).
                asked, self._waiting = self._waiting, []
                try:
                    self._next, self._end = await self._reserve(max(self.batch_size, len(asked)))
                except Exception as error:  # (the store's: theirs alone; the next go on)
                    for waiter in asked:
                        if not waiter.done():
                            waiter.set_exception(error)
                    continue
                except BaseException:
                    for waiter in (*asked, *self._waiting):
                        waiter.cancel()
                    self._waiting.clear()
                    raise
                self._hand_out(asked)
                if self.batch_size == 1:
                    self._end = self._next
        finally:
            self._reserving = None

    def _hand_out(self, waiters: list[asyncio.Future[int]]) -> None:
        """Ids of the reserved range to the first of `waiters`, in order (one that gave
        up takes none)."""
        while waiters and self._next < self._end:
            waiter = waiters.pop(0)
            if not waiter.done():
                waiter.set_result(self._next)
                self._next += 1

    async def _reserve(self, count: int) -> tuple[int, int]:
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
            end = start + count
            if end > MAX_ID:
                raise OverflowError("ledger ids exhausted (2**63)")
            try:
                await self.store.set(counter, _encode(end), version=current.version)
            except BadVersionError:
                continue  # another process reserved a range first; take the next one
            return start, end


def _encode(value: int) -> bytes:
    return value.to_bytes(8, "big")
