"""The broker's SubscriptionDispatcher against a stand-in for its direct consumer (this
layer alone): what it passes on to the cursor around a seek."""

from __future__ import annotations

import asyncio

from streamlib.broker.owned import ConsumerSession, SubscriptionDispatcher
from streamlib.protocol.dispatch import Kind
from streamlib.stream.positions import MessageId


class Message:
    def __init__(self, entry: int) -> None:
        self.message_id = MessageId(1, entry, 0)
        self.key = None

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
        pass


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
