"""Consumer: a durable subscription on a stream.

One implementation for both ways to reach a stream: Consumer holds what a client does
(receiving, listeners, acknowledgement timeouts, negative acknowledgements, dead
letters, counts), over a Subscription that supplies the messages and keeps the cursor --
in direct mode DirectSubscription (durable.py: it reads the ledgers and writes the cursor
itself), through the stream service a broker connection (streamlib/service/subscription.py:
the broker reads, dispatches and keeps the cursor).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from streamlib.closing import CloseOnce
from streamlib.protocol.errors import (
    BadRequestError,
    ClientClosedError,
    InvalidPositionError,
    StreamlibError,
    TimeoutError,
)
from streamlib.stream.positions import (
    MessageId,
    as_message_id,
)
from streamlib.stream.producer import Producer
from streamlib.stream.reader import (
    Message,
)

log = logging.getLogger(__name__)


async def batch_receive(
    receive: Callable[[float], Awaitable[Message]], max_num_messages: int, timeout_ms: int
) -> list[Message]:
    """Up to max_num_messages from receive(timeout), within timeout_ms in all."""
    if max_num_messages < 1 or timeout_ms < 0:
        raise BadRequestError("batch_receive needs max_num_messages >= 1, timeout_ms >= 0")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000.0
    received: list[Message] = []
    while len(received) < max_num_messages:
        try:
            received.append(await receive(max(0.0, deadline - loop.time())))
        except TimeoutError:
            break
    return received


@dataclasses.dataclass(frozen=True)
class DeadLetterPolicy:
    """Pulsar's dead-letter policy: a message delivered again more than
    max_redeliver_count times goes to the dead-letter stream (default
    "STREAM-SUBSCRIPTION-DLQ") instead, with its key, properties and event time plus
    REAL_TOPIC and ORIGIN_MESSAGE_ID properties, and is acknowledged here."""

    max_redeliver_count: int
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_redeliver_count, int) or self.max_redeliver_count < 0:
            raise BadRequestError(
                f"max_redeliver_count must be an int >= 0, got {self.max_redeliver_count!r}"
            )

    def stream_for(self, stream: str, subscription: str) -> str:
        """The dead-letter stream of a subscription."""
        return self.dead_letter_topic or f"{stream}-{subscription}-DLQ"


async def send_dead_letter(producer: Any, message: Message, real_topic: str) -> None:
    """Publish a message to its dead-letter stream (direct and service consumers): its
    data, key and event time, and its properties plus REAL_TOPIC and ORIGIN_MESSAGE_ID."""
    properties = dict(message.properties)
    properties["REAL_TOPIC"] = real_topic
    properties["ORIGIN_MESSAGE_ID"] = str(message.message_id)
    await producer.send(
        message.data,
        key=message.key,
        properties=properties,
        event_time=message.event_time_ms or None,
    )


ProducerFactory = Callable[[str], Awaitable[Producer]]


class Subscription(Protocol):
    """What a Consumer receives from and acknowledges to (see the module doc). `wake` is
    set whenever take() may have something new; take() raises the error the
    subscription failed with, if it did."""

    stream: str
    subscription: str
    wake: asyncio.Event
    #: Whether an ack by id needs the message as received (direct mode's cursor ranges).
    acks_by_message: bool
    #: Called when what the consumer received and holds unacknowledged is another's to
    #: deliver now (a change of turn, a seek): the consumer forgets it.
    forget_received: Callable[[], None]

    @property
    def consumer_type(self) -> str: ...

    @property
    def is_active(self) -> bool: ...

    @property
    def mark_delete_position(self) -> MessageId: ...

    def take(self) -> Message | None: ...

    async def prepare(self) -> None: ...

    def acknowledge(self, message: Message | MessageId) -> None: ...

    def acknowledge_cumulative(self, position: MessageId) -> None: ...

    def give_back(self, message: Message | MessageId, delay_s: float) -> None: ...

    async def seek(self, target: MessageId | int) -> None: ...

    async def unsubscribe(self) -> None: ...

    async def persist(self) -> None: ...

    async def close(self, persist: bool) -> None: ...


class Consumer:
    """A durable subscription's consumer (made by Client.subscribe, in either mode)."""

    def __init__(
        self,
        subscription: Subscription,
        *,
        ack_timeout_ms: int = 0,
        negative_ack_redelivery_delay_ms: int = 1000,
        dead_letter_policy: DeadLetterPolicy | None = None,
        producer_factory: ProducerFactory | None = None,
    ) -> None:
        if not isinstance(ack_timeout_ms, int) or ack_timeout_ms < 0:
            raise BadRequestError(f"ack_timeout_ms must be an int >= 0, got {ack_timeout_ms!r}")
        if dead_letter_policy is not None and producer_factory is None:
            raise BadRequestError("a dead-letter policy needs a producer factory")
        self._source = subscription
        subscription.forget_received = self._forget_received
        self.stream = subscription.stream
        self.subscription = subscription.subscription
        # Received and not yet acknowledged: by id (an ack by id finds the message), and
        # since when (ack timeouts) -- kept only when either needs it.
        self._unacked: dict[MessageId, tuple[Message, float]] = {}
        self._track = ack_timeout_ms > 0 or subscription.acks_by_message
        self._ack_timeout_s = ack_timeout_ms / 1000.0
        self._nack_delay_s = negative_ack_redelivery_delay_ms / 1000.0
        self._timeout_task: asyncio.Task[None] | None = None
        self._closed = False
        self._closing = CloseOnce()
        self._dead_letter = dead_letter_policy
        self._producer_factory = producer_factory
        self._dead_letter_producer: Producer | None = None
        self._listener_task: asyncio.Task[None] | None = None
        self.dead_lettered = 0  # messages sent to the dead-letter stream (observability)
        self.received = 0  # ... and for client.stats() and the Prometheus collector
        self.acknowledged = 0
        self.negatively_acknowledged = 0
        # Called (on the loop) when what was received is to be forgotten: a seek, or a
        # failover consumer's turn ended (the blocking API drops its buffer).
        self.on_forget: list[Callable[[], None]] = []

    @property
    def source(self) -> Subscription:
        """The subscription it receives through (a broker's dispatch takes entries from
        it directly)."""
        return self._source

    @property
    def dead_letter_stream(self) -> str | None:
        if self._dead_letter is None:
            return None
        return self._dead_letter.stream_for(self.stream, self.subscription)

    @property
    def consumer_type(self) -> str:
        return self._source.consumer_type

    @property
    def is_active(self) -> bool:
        """Whether this consumer receives now (a failover standby does not)."""
        return self._source.is_active

    @property
    def mark_delete_position(self) -> MessageId:
        return self._source.mark_delete_position

    def consumer(self, stream: str) -> Consumer:
        """The consumer of `stream` (as a consumer of several streams has one each):
        this one."""
        if stream != self.stream:
            raise BadRequestError(f"this consumer takes {self.stream!r}, not {stream!r}")
        return self

    def _forget_received(self) -> None:
        self._unacked.clear()
        for forget in self.on_forget:
            forget()

    @property
    def burst_size(self) -> int:
        """How many messages receive_nowait() may give at once to wait in a caller's
        buffer before the application takes them (the blocking API's bursts): half the
        receiver queue, so a consumer holds at most about twice its receiver_queue_size
        (a shared subscription's consumer of a small queue leaves the others theirs); 1
        -- none -- with an ack timeout (its clock starts at receive) or a dead-letter
        policy (receive() applies it)."""
        if self._ack_timeout_s > 0 or self._dead_letter is not None:
            return 1
        return max(1, getattr(self._source, "_queue_size", 1) // 2)

    # -- receiving ----------------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message (redeliveries first); TimeoutError after timeout seconds. A
        message delivered again more often than the dead-letter policy allows goes to
        the dead-letter stream instead."""
        if self._closed:
            raise ClientClosedError(f"consumer {self.subscription!r} is closed")
        source = self._source
        message = source.take()
        if message is None or (self._dead_letter is not None and self._dead_lettering(message)):
            try:
                async with asyncio.timeout(timeout):
                    while message is None or self._dead_lettering(message):
                        if message is not None:
                            await self._to_dead_letter(message)
                        if self._closed:
                            raise ClientClosedError(f"consumer {self.subscription!r} is closed")
                        await source.prepare()
                        message = source.take()
                        if message is None:
                            source.wake.clear()
                            await source.wake.wait()
            except builtins.TimeoutError:
                raise TimeoutError(f"no message on {self.stream!r} within {timeout} s") from None
        self._received_now(message)
        return message

    def _received_now(self, message: Message) -> None:
        if self._track:
            self._unacked[message.message_id] = (message, time.monotonic())
        self.received += 1
        if self._ack_timeout_s > 0 and self._timeout_task is None:
            self._timeout_task = asyncio.get_running_loop().create_task(self._ack_timeouts())

    def receive_nowait(self) -> Message | None:
        """The next message if one is here now, else None (a broker's dispatcher drains
        what was read ahead this way). Not for a consumer with a dead-letter policy."""
        if self._closed or self._dead_letter is not None:
            return None
        message = self._source.take()
        if message is not None:
            self._received_now(message)
        return message

    async def batch_receive(
        self, max_num_messages: int = 100, timeout_ms: int = 100
    ) -> list[Message]:
        """Up to max_num_messages, waiting at most timeout_ms for them to come (Pulsar's
        BatchReceivePolicy); fewer, or none, when the time is up."""
        return await batch_receive(self.receive, max_num_messages, timeout_ms)

    # -- dead letters -------------------------------------------------------------------

    def _dead_lettering(self, message: Message) -> bool:
        policy = self._dead_letter
        return policy is not None and message.redelivery_count > policy.max_redeliver_count

    async def _to_dead_letter(self, message: Message) -> None:
        """Publish the message to the dead-letter stream, then acknowledge it here. If the
        publish fails, it is delivered again after the redelivery delay (and tried again
        then): at least once, in one of the two streams."""
        stream = self.dead_letter_stream
        assert stream is not None and self._producer_factory is not None
        try:
            if self._dead_letter_producer is None:
                self._dead_letter_producer = await self._producer_factory(stream)
            await send_dead_letter(self._dead_letter_producer, message, self.stream)
        except StreamlibError as error:
            log.warning("dead-lettering %s to %r failed: %s", message.message_id, stream, error)
            self._source.give_back(message, self._nack_delay_s)
            return
        self.dead_lettered += 1
        self._source.acknowledge(message)

    # -- a message listener -------------------------------------------------------------

    def listen(self, listener: Callable[[Consumer, Message], object]) -> None:
        """Call listener(consumer, message) for each message, on the loop, until closed
        (Pulsar's message_listener); a coroutine function is awaited. An exception it
        raises is logged, and the message is delivered again (negative ack)."""
        if self._listener_task is not None:
            raise BadRequestError("this consumer has a message listener already")

        async def run() -> None:
            while not self._closed:
                try:
                    message = await self.receive()
                except ClientClosedError:
                    return
                try:
                    outcome = listener(self, message)
                    if inspect.isawaitable(outcome):
                        await outcome
                except Exception:
                    log.exception("message listener of %r failed", self.subscription)
                    self.negative_acknowledge(message)

        self._listener_task = asyncio.get_running_loop().create_task(run())

    # -- acknowledging ------------------------------------------------------------------

    def _held(self, message: Message | MessageId) -> Message | MessageId:
        """The message as received (taken out of those unacknowledged), or the id as
        given when none with it is held (the subscription decides what that means)."""
        position = message if isinstance(message, MessageId) else message.message_id
        found = self._unacked.pop(position, None)
        if found is not None and isinstance(message, MessageId):
            return found[0]
        return message

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (given as received, or its id)."""
        self._source.acknowledge(self._held(message))
        self.acknowledged += 1

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge this message and everything before it."""
        position = message if isinstance(message, MessageId) else message.message_id
        self._source.acknowledge_cumulative(position)
        for received in [p for p in self._unacked if p <= position]:
            del self._unacked[received]
        self.acknowledged += 1

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Have the message (given as received, or its id) delivered again after the
        redelivery delay."""
        self._source.give_back(self._held(message), self._nack_delay_s)
        self.negatively_acknowledged += 1

    async def _ack_timeouts(self) -> None:
        """Deliver again what was left unacknowledged for ack_timeout_ms (a periodic
        check, as Pulsar's client's UnAckedMessageTracker)."""
        period = max(0.01, self._ack_timeout_s / 4)
        while not self._closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            for position, (message, received_at) in list(self._unacked.items()):
                if now - received_at >= self._ack_timeout_s:
                    del self._unacked[position]
                    self._source.give_back(message, 0.0)

    # -- the cursor ---------------------------------------------------------------------

    async def persist(self) -> None:
        """Make the acknowledgements given so far durable now (direct mode: write the
        cursor; through the service: hand them to the broker, which keeps it)."""
        await self._source.persist()

    async def seek(self, target: object) -> None:
        """Move the subscription's cursor: deliver again from a message id (that message
        first), or from the first message published at or after a timestamp (epoch
        milliseconds). What was received and not acknowledged is forgotten."""
        if not isinstance(target, int) or isinstance(target, bool):
            try:  # (streamlib's or pulsar-client's, EARLIEST and LATEST too)
                target = as_message_id(target)
            except InvalidPositionError as error:
                raise InvalidPositionError(
                    f"seek takes a MessageId or epoch milliseconds: {error}"
                ) from None
        await self._source.seek(target)
        self._unacked.clear()

    async def unsubscribe(self) -> None:
        """Delete the subscription (its cursor) and close (through the service:
        ConsumerBusyError while other consumers of it are connected)."""
        if self._closed:
            raise ClientClosedError(f"consumer {self.subscription!r} is closed")
        await self._source.unsubscribe()
        await self.close(persist=False)

    async def close(self, persist: bool = True) -> None:
        """Persist the cursor (unless persist=False) and leave the subscription. Once
        begun, the close runs to its end even if the caller is cancelled (closing.py);
        a second call waits for the first."""
        self._closed = True  # (at once: a receive() from here on raises)
        await self._closing.run(lambda: self._close(persist))

    async def _close(self, persist: bool) -> None:
        tasks = [t for t in (self._listener_task, self._timeout_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._source.wake.set()  # a receive() waiting now ends (ClientClosedError)
        try:
            await self._source.close(persist)
        finally:
            if self._dead_letter_producer is not None:
                with contextlib.suppress(Exception):
                    await self._dead_letter_producer.close()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        return await self.receive()

    async def stream_messages(self) -> AsyncIterator[Message]:
        while True:
            yield await self.receive()
