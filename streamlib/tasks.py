"""The background tasks of one component, held by it and stopped with it (STYLE.md §4a:
aiokafka's producer holds its sender task and cancels it when it stops).

asyncio keeps only weak references to tasks: one that nobody holds may be collected
mid-flight, and nothing stops it when its component closes. So a component never calls
create_task for work it does not await itself; it spawns the work in its HeldTasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

from metadata.errors import MetadataError
from streamlib.protocol.errors import StreamlibError

log = logging.getLogger(__name__)

T = TypeVar("T")


class HeldTasks:
    """Tasks held until each ends; `owner` names the component in the log."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run coro in a task held until it ends. An error it ends with is logged (and
        still raised to whoever awaits the task)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        if isinstance(error, StreamlibError | MetadataError):  # typed: its message says it
            log.warning("%s: task %s ended with %r", self.owner, task.get_name(), error)
        else:  # a bug: with its traceback
            log.error("%s: task %s failed", self.owner, task.get_name(), exc_info=error)

    async def close(self) -> None:
        """Cancel every task held and wait until each has ended, those they spawned
        meanwhile included (not the caller's own task, when it is one of them)."""
        await self._until_ended(cancel=True)

    async def wait(self) -> None:
        """Wait until every task held has ended, those they spawn meanwhile included
        (not the caller's own task, when it is one of them)."""
        await self._until_ended(cancel=False)

    async def _until_ended(self, cancel: bool) -> None:
        current = asyncio.current_task()
        while tasks := [t for t in self._tasks if t is not current]:
            if cancel:
                for task in tasks:
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class Waker:
    """What wakes one waiting loop: set() by whoever changed something. Like an Event
    cleared at each wait, but its wait is one future: no task of its own is needed to
    wait on it beside something else (a read's done callback may set it)."""

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, already: bool = False) -> None:
        """Until set() is called from now on (what set it before, the caller has just
        looked at), unless `already`."""
        if already:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class Recent(Generic[T]):
    """The answer of a call made lately, shared: a caller within max_age_s of the last
    call's start gets its answer (concurrent callers share one call); one that failed is
    not kept."""

    def __init__(self) -> None:
        self._asked: asyncio.Future[T] | None = None
        self._at = 0.0

    async def get(self, call: Callable[[], Awaitable[T]], max_age_s: float) -> T:
        now = asyncio.get_running_loop().time()
        asked = self._asked
        if asked is None or now - self._at > max_age_s:
            asked = self._asked = asyncio.ensure_future(call())
            self._at = now
            asked.add_done_callback(self._forget_failed)
        return await asyncio.shield(asked)

    def _forget_failed(self, asked: asyncio.Future[T]) -> None:
        if self._asked is asked and (asked.cancelled() or asked.exception() is not None):
            self._asked = None
