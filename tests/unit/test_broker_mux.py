"""streamlib/broker/mux.py alone (handlers are stand-ins; tests/integration/
test_broker_session.py runs the real ones): what a Session call may hold is bounded
whatever its client does -- answers it does not read, parts its handles do not take --
and a handle's end, cancel or the call's end end its handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from streamlib.broker import mux
from streamlib.broker.mux import ServedSession
from streamlib.wire import broker_pb2 as pb

BIG = 256 * 1024


def big_answer() -> pb.ProduceResponse:
    return pb.ProduceResponse(error=pb.Error(code="x", message="x" * BIG))


def produce(handle: int, size: int = 16) -> pb.SessionPart:
    opened = pb.ProducerOpen(stream="s", producer_name="p" * size)
    return pb.SessionPart(handle=handle, produce=pb.ProduceRequest(open=opened))


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_answers_a_client_does_not_read_are_bounded():
    async def flood(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        while True:
            yield big_answer()

    served = ServedSession({"produce": flood}, None, 10)
    sent = asyncio.Queue()
    for handle in (1, 2, 3):
        sent.put_nowait(pb.SessionRequest(parts=[produce(handle)]))

    async def requests():
        while True:
            yield await sent.get()

    answers = served.serve(requests())
    first = await answers.__anext__()  # then the client reads no more
    assert first.parts
    await settle()
    # Three handlers, each stopped after the answer that took the outbox past its bound.
    assert served._out_bytes <= mux.OUTBOX_BYTES + 3 * (BIG + 64)
    await answers.aclose()


async def test_parts_no_handle_takes_stop_the_call_being_read():
    taken: list[Any] = []

    async def opens_only(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        taken.append(await requests.__anext__())
        await asyncio.Event().wait()  # (never takes another)
        yield None

    served = ServedSession({"produce": opens_only}, None, 10)
    pulled = 0

    async def requests():
        nonlocal pulled
        yield pb.SessionRequest(parts=[produce(1)])
        while True:
            pulled += 1
            yield pb.SessionRequest(parts=[produce(1, BIG)])

    answers = served.serve(requests())
    task = asyncio.ensure_future(answers.__anext__())
    await settle()
    assert len(taken) == 1
    # Read until the parts waiting for the handle passed the bound, then no more.
    assert pulled * BIG >= mux.MAX_PENDING_BYTES
    assert pulled <= mux.MAX_PENDING_BYTES // BIG + 2
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await answers.aclose()


async def test_cancel_and_the_calls_end_end_the_handlers():
    ended: list[int] = []

    def handler(number: int):
        async def serve(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            try:
                await requests.__anext__()
                yield pb.ProduceResponse(ready=pb.ProducerReady(producer_name=str(number)))
                async for _ in requests:
                    pass
            finally:
                ended.append(number)

        return serve

    opened = iter(range(1, 10))
    served = ServedSession({"produce": lambda r, c: handler(next(opened))(r, c)}, None, 10)
    sent: asyncio.Queue[pb.SessionRequest] = asyncio.Queue()

    async def requests():
        while True:
            yield await sent.get()

    answers = served.serve(requests())
    sent.put_nowait(pb.SessionRequest(parts=[produce(1), produce(2), produce(3)]))
    got: dict[int, list[str]] = {}
    while sum(len(v) for v in got.values()) < 3:
        for part in (await answers.__anext__()).parts:
            got.setdefault(part.handle, []).append(part.WhichOneof("kind"))
    sent.put_nowait(pb.SessionRequest(parts=[pb.SessionPart(handle=1, cancel=True),
                                             pb.SessionPart(handle=2, end=True)]))  # fmt: skip
    while got.get(1, [])[-1:] != ["end"] or got.get(2, [])[-1:] != ["end"]:
        for part in (await answers.__anext__()).parts:
            got.setdefault(part.handle, []).append(part.WhichOneof("kind"))
    assert sorted(ended) == [1, 2]  # cancelled, and half-closed: both handlers over
    await answers.aclose()  # the call ends: the last handler with it
    assert sorted(ended) == [1, 2, 3]
