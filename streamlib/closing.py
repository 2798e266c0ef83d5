"""A close that, once begun, runs to its end.

A close often frees what the next owner waits for: a failover consumer's place in its
subscription's line, a cursor to persist first. Cancelling the task that closes (a
broker's RPC that grpc cancels when its client goes, a Ctrl-C in the blocking API) must
end that task's wait, never the close: a close cut off halfway keeps its place in line
for the metadata session's life, and the next consumer waits behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class CloseOnce:
    """Runs one close in a task of its own: a cancelled caller stops waiting for it;
    a caller while it runs waits for it (its error raised to each); a caller after it
    ended returns at once, as a second close() always did. An error is logged too (a
    caller cancelled meanwhile never sees it)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def run(self, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(close())
            self._task.add_done_callback(_log_error)
        elif self._task.done():
            return
        await asyncio.shield(self._task)


def _log_error(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a close failed: %r", task.exception())
