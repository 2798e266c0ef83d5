"""A component's background tasks (streamlib/tasks.py): held until they end, their
failures logged, and stopped with the component."""

import asyncio
import logging

from streamlib.protocol.errors import LedgerFencedError
from streamlib.tasks import HeldTasks


async def test_a_spawned_task_is_held_until_it_ends():
    held = HeldTasks("test")
    release = asyncio.Event()
    finished = []

    async def work() -> None:
        await release.wait()
        finished.append(True)

    held.spawn(work())  # the caller keeps no reference: the group does
    assert len(held) == 1
    release.set()
    await held.wait()
    assert finished == [True] and len(held) == 0


async def test_close_cancels_every_task_and_waits_for_their_ends():
    held = HeldTasks("test")
    started = [asyncio.Event() for _ in range(3)]
    cleaned = []

    async def forever(n: int) -> None:
        started[n].set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(n)

    tasks = [held.spawn(forever(n), name=f"forever {n}") for n in range(3)]
    for event in started:
        await event.wait()
    await held.close()
    assert sorted(cleaned) == [0, 1, 2]
    assert all(t.cancelled() for t in tasks) and len(held) == 0


async def test_close_also_stops_what_a_task_spawns_while_being_cancelled():
    held = HeldTasks("test")
    started = asyncio.Event()
    late: list[asyncio.Task[bool]] = []

    async def spawns_on_the_way_out() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            late.append(held.spawn(asyncio.Event().wait()))

    held.spawn(spawns_on_the_way_out())
    await started.wait()
    await held.close()
    assert late and late[0].cancelled() and len(held) == 0


async def test_a_task_that_closes_its_own_group_does_not_wait_for_itself():
    held = HeldTasks("test")
    other = held.spawn(asyncio.Event().wait())

    async def closer() -> str:
        await held.close()
        return "closed"

    assert await held.spawn(closer()) == "closed"
    assert other.cancelled()


async def test_a_failure_is_logged_and_still_raised_to_whoever_awaits(caplog):
    held = HeldTasks("ledger 7")

    async def fenced() -> None:
        raise LedgerFencedError("ledger 7 is fenced")

    async def bug() -> None:
        raise KeyError("a bug")

    with caplog.at_level(logging.WARNING, logger="streamlib.tasks"):
        awaited = held.spawn(fenced(), name="close")
        held.spawn(bug(), name="read")
        await held.wait()
    assert isinstance(awaited.exception(), LedgerFencedError)
    by_level = {r.levelno: r for r in caplog.records}
    assert "ledger 7: task close ended with LedgerFencedError" in by_level[logging.WARNING].message
    assert by_level[logging.ERROR].exc_info is not None  # a bug: with its traceback
    assert "ledger 7: task read failed" in by_level[logging.ERROR].message
