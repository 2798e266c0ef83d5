"""A consumer's subscription and a reader's feed through the stream service: one call
to the stream's owner (a reader's: to any broker) that delivers messages within
flow-control permits (receiver_queue_size), opened again whenever it breaks. What a
client does with the messages -- listeners, ack timeouts, dead letters, seek rules --
is streamlib/stream/consumer.py's and reader.py's, the same as in direct mode.

A consumer's message it did not acknowledge before its connection broke is delivered
again (at least once); a reader opens again after the last message it read.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from streamlib.protocol.errors import (
    BadRequestError,
    BrokerUnavailableError,
    ClientClosedError,
    StreamlibError,
)
from streamlib.service.connection import EOF, OPEN_TIMEOUT_S, Brokers, Session, read
from streamlib.stream.batch import MessageDecodeError
from streamlib.stream.message import entry_messages, new_message
from streamlib.stream.positions import EARLIEST, LATEST, MessageId, position_before
from streamlib.stream.reader import Message
from streamlib.wire import broker_pb2 as pb
from streamlib.wire.convert import error_from_pb, id_pb

ACKS_WRITTEN_WITHIN_S = 5.0  # persist() waits this long for its acks to go out
# What a consumer's or reader's session reads (ConsumerOpen.protocol_version): entries whole.
PROTOCOL_VERSION = 2


class IncompatibleBrokerError(StreamlibError):
    """The broker speaks another version of the consumer's protocol."""


class _Delivery(Session):
    """One Consume call: its open, its permits, and the messages it delivers (queued
    until taken). The queue is dropped when the call breaks: the broker delivers what it
    held again (a consumer), or the reader opens after the last it took."""

    def __init__(
        self, brokers: Brokers, opened: pb.ConsumerOpen, queue_size: int, schema: Any
    ) -> None:
        if queue_size < 1:
            raise BadRequestError("receiver_queue_size must be >= 1")
        super().__init__(brokers, opened.stream)
        opened.protocol_version = PROTOCOL_VERSION
        self._open_pb = opened
        self._queue_size = queue_size
        self._schema = schema
        self.wake = asyncio.Event()
        self._messages: collections.deque[Message] = collections.deque()
        self._error: BaseException | None = None
        self._taken = 0  # taken since permits were last given back
        self._flush = asyncio.Event()
        self._active = asyncio.Event()

    def take_nowait(self) -> Message | None:
        if self._messages:
            self._taken += 1
            if self._taken >= max(1, self._queue_size // 2):
                self._flush.set()
            return self._messages.popleft()
        if self._error is not None:
            raise self._error
        return None

    def has_queued(self) -> bool:
        return bool(self._messages)

    async def session(self, address: str) -> None:
        call = self.brokers.open_call(address, "consume")
        try:
            self._open_pb.resume = self.ready.done()  # (again: its old session may linger)
            first = await self.open(call, pb.ConsumeRequest(open=self._open_pb))
            self._set_active(first.ready.active)
            self._messages.clear()  # (what the last connection left: delivered again)
            self._taken = 0
            self.up(call)
            await call.write(pb.ConsumeRequest(flow=pb.Flow(permits=self._queue_size)))
            if not self.ready.done():
                self.ready.set_result(None)
            sender = asyncio.get_running_loop().create_task(self._send_loop(call))
            try:
                while True:
                    response = await read(call)
                    if response is EOF:
                        raise BrokerUnavailableError("the broker ended the consumer's stream")
                    self._answer(response)
            finally:
                self.down()
                self.ended()
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
        finally:
            call.cancel()

    def _answer(self, response: pb.ConsumeResponse) -> None:
        which = response.WhichOneof("kind")
        if which == "entries":
            self._messages.extend(self._unbatched(response.entries.entries))
            self.wake.set()
        elif which == "active":
            self._set_active(response.active.active)
        elif which == "done":
            self.done(response.done)
        elif which == "error":
            raise error_from_pb(response.error)
        elif which is None:  # (a kind this client does not know: not to be dropped unseen)
            raise IncompatibleBrokerError(
                f"the broker of {self.stream!r} sent an answer this client does not know "
                f"(a broker of another version: upgrade brokers and clients together)"
            )

    def _unbatched(self, entries: Iterable[pb.DeliveredEntry]) -> Iterator[Message]:
        """The messages of entries delivered whole, decoded as direct mode decodes what
        it reads (those of each entry that are this consumer's)."""
        stream, schema = self.stream, self._schema
        for delivered in entries:
            entry = entry_messages(
                stream, delivered.ledger_id, delivered.entry_id, delivered.entry, EARLIEST
            )
            if entry is None:
                continue
            entry.schema = schema
            count = len(entry.payloads)
            redeliveries = delivered.redelivery_count
            for index in delivered.indexes or range(count):
                if index >= count:
                    raise MessageDecodeError(
                        f"stream {stream!r}: entry {delivered.ledger_id}:{delivered.entry_id} "
                        f"has {count} messages, not a message {index}"
                    )
                message = new_message(entry, index)
                message._redeliveries = redeliveries
                yield message

    def _set_active(self, active: bool) -> None:
        if active:
            self._active.set()
        else:
            self._active.clear()
        self.wake.set()

    async def _send_loop(self, call: Any) -> None:
        """Permits, and what the subclass has to send, gathered: one write for however
        many came meanwhile."""
        while True:
            self._flush.clear()
            if self._taken >= max(1, self._queue_size // 2):
                permits, self._taken = self._taken, 0
                await call.write(pb.ConsumeRequest(flow=pb.Flow(permits=permits)))
            for request in self.outgoing():
                await call.write(request)
            self.written()
            if not self.has_outgoing() and self._taken < max(1, self._queue_size // 2):
                await self._flush.wait()

    def outgoing(self) -> list[pb.ConsumeRequest]:
        return []

    def has_outgoing(self) -> bool:
        return False

    def written(self) -> None:
        """What outgoing() gave went out."""

    def done(self, done: pb.Done) -> None:
        pass

    def ended(self) -> None:
        """The call broke (or closed)."""

    def fail(self, error: BaseException) -> None:
        self._error = self._error or error
        self.wake.set()


class ServiceSubscription(_Delivery):
    """A consumer's Subscription (streamlib/stream/consumer.py) through a broker: the
    broker reads, dispatches by the subscription type and keeps the cursor."""

    acks_by_message = False  # (the broker acks by id)

    def __init__(
        self, brokers: Brokers, opened: pb.ConsumerOpen, queue_size: int, schema: Any
    ) -> None:
        super().__init__(brokers, opened, queue_size, schema)
        self.subscription = opened.subscription
        self.forget_received: Any = lambda: None
        self._acks: list[tuple[MessageId, bool, bool]] = []  # (id, cumulative, negative)
        self._acks_out = asyncio.Event()  # set when every ack given went to the broker
        self._acks_out.set()
        self._control: list[pb.ConsumeRequest] = []  # seeks, unsubscribes: sent in order
        self._asked: dict[str, asyncio.Future[None]] = {}  # what awaits the broker's Done

    @property
    def consumer_type(self) -> str:
        return self._open_pb.consumer_type or "exclusive"

    @property
    def is_active(self) -> bool:
        return self._active.is_set()

    @property
    def mark_delete_position(self) -> MessageId:
        return EARLIEST  # (the broker keeps the cursor)

    def take(self) -> Message | None:
        return self.take_nowait()

    async def prepare(self) -> None:
        pass

    # -- what goes to the broker --------------------------------------------------------

    def _ack(self, message: Message | MessageId, cumulative: bool, negative: bool) -> None:
        position = message if isinstance(message, MessageId) else message.message_id
        self._acks.append((position, cumulative, negative))
        self._acks_out.clear()
        self._flush.set()

    def acknowledge(self, message: Message | MessageId) -> None:
        self._ack(message, False, False)

    def acknowledge_cumulative(self, position: MessageId) -> None:
        self._ack(position, True, False)

    def give_back(self, message: Message | MessageId, delay_s: float) -> None:
        """A negative acknowledgement: the broker delivers it again after the
        subscription's redelivery delay (to this consumer or, shared, another)."""
        self._ack(message, False, True)

    def outgoing(self) -> list[pb.ConsumeRequest]:
        # Acks first: those given before a seek or an unsubscribe apply before it. By
        # entry (batch-index acks), in the order given across kinds (a negative ack after
        # a cumulative one must not pass it); a run of cumulative ones is its highest.
        acks, self._acks = self._acks, []
        out: list[pb.ConsumeRequest] = []
        kind: tuple[bool, bool] | None = None
        by_entry: dict[tuple[int, int], list[int]] = {}
        upto: MessageId | None = None
        for position, cumulative, negative in acks:
            if (cumulative, negative) != kind:
                out.extend(_ack_requests(kind, by_entry, upto))
                kind, by_entry, upto = (cumulative, negative), {}, None
            if cumulative:
                upto = position if upto is None else max(upto, position)
            else:
                by_entry.setdefault((position.ledger_id, position.entry_id), []).append(
                    position.batch_index
                )
        out.extend(_ack_requests(kind, by_entry, upto))
        control, self._control = self._control, []
        return out + control

    def written(self) -> None:
        if not self._acks:
            self._acks_out.set()

    def has_outgoing(self) -> bool:
        return bool(self._acks or self._control)

    async def persist(self) -> None:
        """Wait (bounded) until the acknowledgements given so far went to the broker
        (which keeps the cursor)."""
        if self.live_call is None:
            return
        self._flush.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._acks_out.wait(), ACKS_WRITTEN_WITHIN_S)

    # -- seeking and unsubscribing ------------------------------------------------------

    async def seek(self, target: MessageId | int) -> None:
        """As in Pulsar, every consumer of the subscription is disconnected, and
        reconnects at the new position."""
        request = pb.SeekRequest()
        if isinstance(target, MessageId):
            request.message_id.CopyFrom(id_pb(target))
        else:
            request.timestamp_ms = target
        await self._ask("seek", pb.ConsumeRequest(seek=request))

    async def unsubscribe(self) -> None:
        await self._ask("unsubscribe", pb.ConsumeRequest(unsubscribe=pb.UnsubscribeRequest()))

    async def _ask(self, what: str, request: pb.ConsumeRequest) -> None:
        """Send a seek / unsubscribe and wait for the broker's Done (its error raised)."""
        if self.closed:
            raise ClientClosedError(f"consumer {self.subscription!r} is closed")
        if self.live_call is None:
            raise BrokerUnavailableError(f"consumer {self.subscription!r} is reconnecting")
        if what in self._asked:
            raise BadRequestError(f"a {what} of this consumer is in progress")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._asked[what] = future
        self._control.append(request)
        self._flush.set()
        try:
            await asyncio.wait_for(future, OPEN_TIMEOUT_S)
        finally:
            self._asked.pop(what, None)

    def done(self, done: pb.Done) -> None:
        if done.what == "seek":  # what came before it is from the old position
            self._messages.clear()
            self.forget_received()
        future = self._asked.get(done.what)
        if future is None or future.done():
            return
        if done.HasField("error"):
            future.set_exception(error_from_pb(done.error))
        else:
            future.set_result(None)

    def ended(self) -> None:
        for what, asked in self._asked.items():  # (its Done can no longer come)
            if not asked.done():
                asked.set_exception(BrokerUnavailableError(f"the connection broke during a {what}"))

    async def close(self, persist: bool) -> None:
        if self.closed:
            return
        if persist:
            await self.persist()
        await self.stop()
        self.fail(ClientClosedError(f"consumer {self.subscription!r} is closed"))


def _ack_requests(
    kind: tuple[bool, bool] | None,
    by_entry: dict[tuple[int, int], list[int]],
    upto: MessageId | None,
) -> list[pb.ConsumeRequest]:
    """One kind's acknowledgements, as the broker takes them."""
    if kind is None:
        return []
    cumulative, negative = kind
    if cumulative:
        assert upto is not None
        return [pb.ConsumeRequest(ack=pb.AckRequest(ids=[id_pb(upto)], cumulative=True))]
    entries = [
        pb.EntryAck(ledger_id=ledger_id, entry_id=entry_id, indexes=indexes)
        for (ledger_id, entry_id), indexes in by_entry.items()
    ]
    return [pb.ConsumeRequest(ack=pb.AckRequest(negative=negative, entries=entries))]


class ServiceFeed(_Delivery):
    """A reader's Feed (streamlib/stream/reader.py) through a broker: any broker serves
    it (reading fences nothing)."""

    def __init__(
        self,
        brokers: Brokers,
        stream: str,
        queue_size: int,
        schema: Any,
        read_compacted: bool = False,
    ) -> None:
        opened = pb.ConsumerOpen(stream=stream, read_compacted=read_compacted)
        super().__init__(brokers, opened, queue_size, schema)
        self._read_compacted = read_compacted
        self._last: MessageId | None = None  # the last message taken

    def take_nowait(self) -> Message | None:
        message = super().take_nowait()
        if message is not None:
            self._last = message.message_id
        return message

    async def take(self, timeout: float | None) -> Message:
        async with asyncio.timeout(timeout):
            while (message := self.take_nowait()) is None:
                self.wake.clear()
                await self.wake.wait()
        return message

    async def session(self, address: str) -> None:
        if self._last is not None:  # (again: after the last message taken)
            opened = self._open_pb
            opened.start_latest = False
            opened.start_inclusive = False
            opened.start.CopyFrom(id_pb(self._last))
        await super().session(address)

    async def restart(self, start: MessageId | int, inclusive: bool) -> MessageId | None:
        """Open (again) at `start`: a message id, EARLIEST, LATEST, or epoch ms."""
        if self._task is not None:
            await self.stop()
            self.closed = False
            self.ready = asyncio.get_running_loop().create_future()
        opened = pb.ConsumerOpen(
            stream=self.stream, start_inclusive=inclusive, protocol_version=PROTOCOL_VERSION,
            read_compacted=self._read_compacted,
        )  # fmt: skip
        after: MessageId | None = None
        if isinstance(start, int) and not isinstance(start, MessageId):
            # By time: the position before the first message published then or later (or
            # the end, when none has been yet), asked first: so it is known here too.
            before = await self._ask_position(start)
            after = before if before is not None else await self.last_message()
            if after is not None and after != EARLIEST:
                opened.start.CopyFrom(id_pb(after))
        elif start == LATEST:
            # Fixed now: what is published from here on is read (Pulsar's LATEST).
            last = await self.last_message()
            if last is not None:
                opened.start.CopyFrom(id_pb(last))
                after = position_before(last) if inclusive else last
        elif start != EARLIEST:
            opened.start.CopyFrom(id_pb(start))
            after = position_before(start) if inclusive else start
        self._open_pb = opened
        self._messages.clear()
        self._error = None
        self._last = None
        await self.start()
        return after

    async def last_message(self) -> MessageId | None:
        return await self._ask_position(None)

    async def _ask_position(self, before_time_ms: int | None) -> MessageId | None:
        """The stream's last message's id, or (given a time) the position after which the
        first message published then or later comes; None when there is none."""
        request = pb.LastMessageIdRequest(stream=self.stream, read_compacted=self._read_compacted)
        if before_time_ms is not None:
            request.before_time_ms = before_time_ms
        answer = await self.brokers.ask(
            lambda stub: stub.LastMessageId(
                request, timeout=OPEN_TIMEOUT_S, metadata=self.brokers.metadata
            )
        )
        if not answer.HasField("message_id"):
            return None
        found = answer.message_id
        return MessageId(found.ledger_id, found.entry_id, found.batch_index)

    async def close(self) -> None:
        await self.stop()
        self.fail(ClientClosedError(f"reader of {self.stream!r} is closed"))
