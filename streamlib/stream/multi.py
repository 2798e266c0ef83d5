"""One subscription on several streams (pulsar-client's subscribe([topic, ...], sub)):
a consumer per stream behind one receive(). Each stream keeps its own cursor; messages
come in each stream's order, the streams interleaved as their messages arrive."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from streamlib.closing import CloseOnce
from streamlib.protocol.errors import BadRequestError, TimeoutError
from streamlib.stream.consumer import Consumer, batch_receive
from streamlib.stream.positions import MessageId
from streamlib.stream.reader import Message


class MultiStreamConsumer:
    """Consumers of one subscription on several streams, received from as one."""

    def __init__(self, consumers: Sequence[Consumer]) -> None:
        if not consumers:
            raise BadRequestError("subscribe to at least one stream")
        self._consumers = {c.stream: c for c in consumers}
        self.streams = [c.stream for c in consumers]
        self.stream = ",".join(self.streams)
        self.subscription = consumers[0].subscription
        # A receive in flight per consumer, kept across calls: one that completed while
        # another was taken is delivered next, never lost.
        self._waiting: dict[str, asyncio.Task[Message]] = {}
        self._turn = 0
        self._closing = CloseOnce()

    def consumer(self, stream: str) -> Consumer:
        found = self._consumers.get(stream)
        if found is None:
            raise BadRequestError(f"this consumer does not consume stream {stream!r}")
        return found

    @property
    def consumer_type(self) -> str:
        return next(iter(self._consumers.values())).consumer_type

    @property
    def is_active(self) -> bool:
        return all(c.is_active for c in self._consumers.values())

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message of any of the streams; streamlib.errors.TimeoutError when
        none comes in time."""
        loop = asyncio.get_running_loop()
        for stream, consumer in self._consumers.items():
            if stream not in self._waiting:
                task = self._waiting[stream] = loop.create_task(consumer.receive())
                # (Its consumer closed under it: the error is the next receive's to raise,
                # or nobody's -- never "never retrieved".)
                task.add_done_callback(_retrieved)
        done, _ = await asyncio.wait(
            self._waiting.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if not done:
            raise TimeoutError(f"no message on {self.streams} within {timeout} s")
        # Round robin among the streams that have one, so none starves another.
        ready = [s for s in self.streams if s in self._waiting and self._waiting[s] in done]
        stream = ready[self._turn % len(ready)]
        self._turn += 1
        return self._waiting.pop(stream).result()

    async def batch_receive(
        self, max_num_messages: int = 100, timeout_ms: int = 100
    ) -> list[Message]:
        return await batch_receive(self.receive, max_num_messages, timeout_ms)

    def acknowledge(self, message: Message) -> None:
        """Acknowledge a message (as received: its stream says whose it is)."""
        self._of(message).acknowledge(message)

    def acknowledge_cumulative(self, message: Message) -> None:
        """This message and every one before it, in its stream."""
        self._of(message).acknowledge_cumulative(message)

    def negative_acknowledge(self, message: Message) -> None:
        self._of(message).negative_acknowledge(message)

    def _of(self, message: Any) -> Consumer:
        if isinstance(message, MessageId):
            raise BadRequestError(
                "a consumer of several streams takes the message itself (an id names no stream)"
            )
        return self.consumer(message.stream)

    async def seek(self, target: Any) -> None:
        raise BadRequestError("seek one stream's consumer: consumer(stream).seek(...)")

    async def persist(self) -> None:
        for consumer in self._consumers.values():
            await consumer.persist()

    async def unsubscribe(self) -> None:
        await self._stop_waiting()
        for consumer in self._consumers.values():
            await consumer.unsubscribe()

    async def close(self) -> None:
        """Close every stream's consumer: to the end once begun (closing.py)."""
        await self._closing.run(self._close)

    async def _close(self) -> None:
        await self._stop_waiting()
        # Each one closes whatever another's close does (a failed one must not keep the
        # rest in their subscriptions' lines); the first error is raised.
        outcomes = await asyncio.gather(
            *(consumer.close() for consumer in self._consumers.values()), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _stop_waiting(self) -> None:
        waiting, self._waiting = list(self._waiting.values()), {}
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    @property
    def mark_delete_position(self) -> dict[str, MessageId]:
        return {s: c.mark_delete_position for s, c in self._consumers.items()}

    def __aiter__(self) -> MultiStreamConsumer:
        return self

    async def __anext__(self) -> Message:
        return await self.receive()


def _retrieved(task: asyncio.Task[Message]) -> None:
    if not task.cancelled():
        task.exception()


async def subscribe_each(
    streams: Sequence[str], subscribe_one: Callable[[str], Awaitable[Any]]
) -> MultiStreamConsumer:
    """A consumer of each stream (subscribe_one(name): direct mode's or the service's),
    behind one; those made are closed again if one fails."""
    names = list(streams)
    if not names or len(set(names)) != len(names):
        raise BadRequestError(f"subscribe to distinct streams, got {names!r}")
    consumers: list[Any] = []
    try:
        for name in names:
            consumers.append(await subscribe_one(name))
    except BaseException:
        for made in consumers:
            await made.close()
        raise
    return MultiStreamConsumer(consumers)
