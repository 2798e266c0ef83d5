"""The end of a broker session (this layer alone): its cleanup -- stopping the session's
tasks, then removing it from its dispatcher, freeing a producer's name, closing a reader --
runs to its end however often the RPC's task is cancelled meanwhile (grpc cancels a handler
whose client cancelled the call, which a client does once it has read the error that ended
it). Before, a cancellation while the session's tasks stopped skipped the removal: the
dispatcher kept handing messages to a session nobody read."""

from __future__ import annotations

import asyncio

import pytest

from streamlib.broker.server import _stop_then


async def test_a_session_end_cancelled_twice_still_runs_to_its_end() -> None:
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    removed = asyncio.Event()

    async def session_task() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # (stopping takes a turn of the loop, as a gRPC read does)
            stopped.set()

    async def remove() -> None:
        await asyncio.sleep(0)  # (removal awaits too: the subscription's lock)
        removed.set()

    task = loop.create_task(session_task())
    await asyncio.sleep(0)  # it runs

    async def rpc() -> None:
        try:
            await asyncio.Event().wait()  # serving, until cancelled
        finally:
            await _stop_then([task], remove)

    handler = loop.create_task(rpc())
    await asyncio.sleep(0)
    handler.cancel()  # the client cancelled the call: the finally begins
    await asyncio.sleep(0)
    assert not handler.done()  # (waiting for the session's task to stop)
    handler.cancel()  # ... and again, while it waits
    with pytest.raises(asyncio.CancelledError):
        await handler
    await asyncio.wait_for(removed.wait(), 5)  # the removal still came, after the stop
    assert stopped.is_set() and task.done()
