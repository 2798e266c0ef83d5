"""The broker's SubscriptionDispatcher against a stand-in for its direct consumer (this
layer alone): what it passes on to the cursor around a seek."""

from __future__ import annotations

import asyncio

from streamlib.broker.dispatcher import SubscriptionDispatcher
from streamlib.broker.sessions import ConsumerSession
from streamlib.protocol.dispatch import Kind
from streamlib.stream.positions import MessageId


class Message:
    def __init__(self, entry: int) -> None:
        self.message_id = MessageId(1, entry, 0)
        self.key = None
        self.data = b"payload"

    def ordering_key(self) -> bytes | None:
        return None

    def redelivered(self) -> Message:
        return self


class Inner:
    """What the dispatcher uses of a direct consumer; its seek waits to be let go."""

    subscription = "s"

    def __init__(self, messages: list[Message]) -> None:
        self.ready = list(messages)
        self.acknowledged: list[MessageId] = []
        self.seeking = asyncio.Event()
        self.release = asyncio.Event()
        self.closed = asyncio.Event()

    def receive_nowait(self) -> Message | None:
        return self.ready.pop(0) if self.ready else None

    async def receive(self) -> Message:
        await asyncio.Event().wait()  # nothing more
        raise AssertionError

    def acknowledge(self, message: Message) -> None:
        self.acknowledged.append(message.message_id)

    async def seek(self, target: MessageId) -> None:
        self.seeking.set()
        await self.release.wait()

    async def close(self) -> None:
        self.closed.set()


async def test_an_ack_that_arrives_while_the_cursor_moves_is_not_applied_after_it() -> None:
    """An ack of a message delivered before a seek, arriving while the seek runs, must
    not reach the moved cursor: that message comes again after the seek (an ack applied
    there would skip it for good)."""
    messages = [Message(i) for i in range(3)]
    inner = Inner(messages)
    dispatcher = SubscriptionDispatcher(inner, Kind.SHARED, 0.0)  # type: ignore[arg-type]
    session = ConsumerSession(1, "c", Kind.SHARED)
    dispatcher.add(session)
    dispatcher.flow(1, 10)
    delivered = await asyncio.wait_for(session.outbox.get(), 5)
    assert [m.message_id for m in delivered] == [m.message_id for m in messages]
    seek = asyncio.get_running_loop().create_task(dispatcher.seek(MessageId(1, 0, 0)))
    await asyncio.wait_for(inner.seeking.wait(), 5)
    dispatcher.ack(1, [messages[2].message_id], cumulative=False)  # late, from before
    inner.release.set()
    await asyncio.wait_for(seek, 5)
    assert inner.acknowledged == []
    await dispatcher.close()


async def test_a_close_cancelled_while_reading_stops_still_closes_the_direct_consumer() -> None:
    """The broker closes a subscription's dispatcher when its last consumer leaves, in
    the finally of that consumer's RPC, which grpc cancels when the client goes: the
    cancellation must not cut the close off before the direct consumer is closed (it
    would hold the subscription, and the next dispatcher would wait behind it)."""
    inner = Inner([])
    dispatcher = SubscriptionDispatcher(inner, Kind.SHARED, 0.0)  # type: ignore[arg-type]
    closing = asyncio.get_running_loop().create_task(dispatcher.close())
    await asyncio.sleep(0)  # (one turn of the loop: the close has begun, and waits)
    assert not closing.done()
    closing.cancel()
    try:
        await closing
    except asyncio.CancelledError:
        pass
    await asyncio.wait_for(inner.closed.wait(), 5)  # the close went on to its end
    await asyncio.wait_for(dispatcher.close(), 5)  # (again: waits for the same close)
