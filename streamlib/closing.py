"""A close that, once begun, runs to its end.

A close often frees what the next owner waits for: a failover consumer's place in its
subscription's line, a cursor to persist first. Cancelling the task that closes (a
broker's RPC that grpc cancels when its client goes, a Ctrl-C in the blocking API) must
end that task's wait, never the close: a close cut off halfway keeps its place in line
for the metadata session's life, and the next consumer waits behind it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

_UNDER_WAY: set[asyncio.Task[None]] = set()  # (the loop keeps only weak references)


def to_its_end(work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
    """Start work in a task of its own, held until it ends, its error logged as `what`
    failing (a caller cancelled meanwhile never sees it). Await it shielded: a cancelled
    caller then stops waiting, and the work goes on."""
    task = asyncio.get_running_loop().create_task(work)
    _UNDER_WAY.add(task)
    task.add_done_callback(functools.partial(_ended, what))
    return task


def _ended(what: str, task: asyncio.Task[None]) -> None:
    _UNDER_WAY.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s failed: %r", what, task.exception())


class CloseOnce:
    """Runs one close to its end (to_its_end): a cancelled caller stops waiting for it;
    a caller while it runs waits for it (its error raised to each); a caller after it
    ended returns at once, as a second close() always did."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def run(self, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._task is None:
            self._task = to_its_end(close(), "a close")
        elif self._task.done():
            return
        await asyncio.shield(self._task)
