"""A close that, once begun, runs to its end.

A close often frees what the next owner waits for: a failover consumer's place in its
subscription's line, a cursor to persist first. Cancelling the task that closes (a
broker's RPC that grpc cancels when its client goes, a Ctrl-C in the blocking API) must
end that task's wait, never the close: a close cut off halfway keeps its place in line
for the metadata session's life, and the next consumer waits behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class CloseOnce:
    """Runs one close in a task of its own: a cancelled caller stops waiting for it,
    and every later caller waits for the same close (its error raised to each)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    @property
    def begun(self) -> bool:
        return self._task is not None

    async def run(self, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(close())
        await asyncio.shield(self._task)
