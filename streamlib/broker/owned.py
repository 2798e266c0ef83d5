"""A stream a broker owns: its one writer, the producers publishing through it, and
the dispatch of its subscriptions.

A broker serves a stream only after it holds the stream's lease AND its writer took the
stream over (fenced the last two ledgers, created one, CAS'd the list: StreamWriter).
If the writer fails -- another broker took over and fenced it -- the stream is given up
at once: every producer and consumer of it here is told, and looks the stream up again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metadata.errors import NodeExistsError, NoNodeError
from streamlib.broker.dedup import Dedup
from streamlib.protocol.dispatch import ConsumerBusy, Dispatch, Kind, Pending, key_slot
from streamlib.protocol.errors import (
    BadRequestError,
    ConsumerBusyError,
    ProducerBusyError,
    ProducerFencedError,
    StreamlibError,
)
from streamlib.stream.consumer import Consumer
from streamlib.stream.positions import MessageId
from streamlib.stream.producer import Checked, Producer
from streamlib.stream.reader import Message, StreamScanner

log = logging.getLogger(__name__)

ACCESS_MODES = ("shared", "exclusive", "exclusive_with_fencing", "wait_for_exclusive")
SNAPSHOT_EVERY = 1000  # durable messages between dedup snapshots


class StreamGone(StreamlibError):
    """The broker no longer serves this stream (unloaded, or taken over elsewhere)."""


@dataclass
class ProducerSession:
    name: str
    access_mode: str
    fenced: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None


@dataclass(frozen=True)
class Done:
    what: str  # seek | unsubscribe
    error: BaseException | None = None


@dataclass
class ConsumerSession:
    cid: int
    name: str
    kind: Kind
    # Deliveries to send: filled by the dispatcher, drained by the RPC (a Done: a seek or
    # unsubscribe it asked for is done; an error: the session ends with it).
    outbox: asyncio.Queue[list[Message] | Done | BaseException] = field(
        default_factory=asyncio.Queue
    )
    active: bool = True


class SubscriptionDispatcher:
    """Reads the subscription's cursor through one direct consumer (the broker's) and
    hands the messages out by the dispatch rules (streamlib/protocol/dispatch.py)."""

    def __init__(self, inner: Consumer, kind: Kind, nack_delay_s: float) -> None:
        self.inner = inner
        self.dispatch = Dispatch(kind)
        self.sessions: dict[int, ConsumerSession] = {}
        self._nack_delay_s = nack_delay_s
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._messages: dict[MessageId, Message] = {}

    def add(self, session: ConsumerSession) -> None:
        try:
            self.dispatch.add(session.cid, session.name, session.kind)
        except ConsumerBusy as busy:
            raise ConsumerBusyError(str(busy)) from None
        self.sessions[session.cid] = session
        self._active_changed()
        self._wake.set()

    def remove(self, cid: int) -> None:
        if self.sessions.pop(cid, None) is None:
            return
        for pending in self.dispatch.unacked_of(cid):
            pending.ref = pending.ref.redelivered()
        self.dispatch.remove(cid)
        self._active_changed()
        self._wake.set()

    def _active_changed(self) -> None:
        if self.dispatch.kind is not Kind.FAILOVER:
            return
        first = self.dispatch.active()
        for cid, session in self.sessions.items():
            active = cid == first
            if active != session.active:
                session.active = active
                session.outbox.put_nowait([])  # (an empty delivery: the RPC re-reads .active)

    def flow(self, cid: int, permits: int) -> None:
        self.dispatch.flow(cid, permits)
        self._wake.set()

    def ack(self, cid: int, ids: list[MessageId], cumulative: bool) -> None:
        for message_id in ids:
            if cumulative:  # everything up to it that this consumer holds
                held = [m for m in self._held_by(cid) if m <= message_id]
            else:
                held = [message_id]
            for one in held:
                if self.dispatch.ack(cid, one) is None:
                    continue
                message = self._messages.pop(one, None)
                if message is not None:
                    self.inner.acknowledge(message)
        self._wake.set()

    def _held_by(self, cid: int) -> list[MessageId]:
        return sorted(p.message_id for p in self.dispatch.unacked_of(cid))

    def nack(self, cid: int, ids: list[MessageId]) -> None:
        back = [p for p in (self.dispatch.take_back(cid, i) for i in ids) if p is not None]
        if not back:
            return
        for pending in back:
            pending.ref = pending.ref.redelivered()
        asyncio.get_running_loop().call_later(self._nack_delay_s, self._redeliver, back)

    def _redeliver(self, back: list[Pending]) -> None:
        self.dispatch.redeliver(back)
        self._wake.set()

    async def _run(self) -> None:
        """Read while someone can take messages; deliver what the rules allow. (A read
        waits in a task of its own: a consumer leaving or acking must not wait for the
        next message to be handed out.)"""
        loop = asyncio.get_running_loop()
        receiving: asyncio.Task[Message] | None = None
        try:
            while True:
                while receiving is None and self.dispatch.wants_more():
                    message = self.inner.receive_nowait()
                    if message is None:
                        break
                    self._offer(message)
                self._deliver()
                if receiving is None and self.dispatch.wants_more():
                    receiving = loop.create_task(self.inner.receive())
                self._wake.clear()
                waker = loop.create_task(self._wake.wait())
                waiting: set[asyncio.Task[Any]] = (
                    {waker} if receiving is None else {waker, receiving}
                )
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                waker.cancel()
                if receiving is not None and receiving in done:
                    self._offer(receiving.result())
                    receiving = None
                    # ... and whatever else was read ahead meanwhile, at once: one task
                    # per message would cost more than the message.
                    while self.dispatch.wants_more():
                        message = self.inner.receive_nowait()
                        if message is None:
                            break
                        self._offer(message)
        finally:
            if receiving is not None:
                receiving.cancel()

    def _offer(self, message: Message) -> None:
        self._messages[message.message_id] = message
        self.dispatch.offer(
            Pending(message, message.message_id, key_slot(message.key, message.message_id))
        )

    def _deliver(self) -> None:
        grouped: dict[Any, list[Message]] = collections.defaultdict(list)
        for cid, pending in self.dispatch.deliveries():
            self._messages[pending.message_id] = pending.ref  # (a redelivery: a new count)
            grouped[cid].append(pending.ref)
        for cid, messages in grouped.items():
            session = self.sessions.get(cid)
            if session is not None:
                session.outbox.put_nowait(messages)

    async def seek(self, target: MessageId | int) -> None:
        """Move the cursor (Pulsar's seek): what was read or handed out is forgotten,
        the cursor is written, and every consumer is disconnected: each reconnects and
        receives from the new position."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.dispatch.reset()
        self._messages.clear()
        try:
            await self.inner.seek(target)
        finally:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def disconnect_all(self, why: str, done: Done | None = None, to: int | None = None) -> None:
        for cid, session in self.sessions.items():
            if done is not None and cid == to:
                session.outbox.put_nowait(done)
            session.outbox.put_nowait(StreamGone(why))

    async def unsubscribe(self, cid: int) -> None:
        """Delete the subscription; ConsumerBusyError while others are connected."""
        others = [c for c in self.sessions if c != cid]
        if others:
            raise ConsumerBusyError(
                f"subscription {self.inner.subscription!r} has {len(others)} other consumers"
            )
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.inner.unsubscribe()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.inner.close()


class OwnedStream:
    def __init__(self, broker: Any, stream: str) -> None:
        self.broker = broker
        self.stream = stream
        self.client = broker.client
        self.producer: Producer | None = None
        self.dedup = Dedup()
        self.producers: dict[str, ProducerSession] = {}
        self._producers_changed = asyncio.Condition()
        self.subscriptions: dict[str, SubscriptionDispatcher] = {}
        self._subscribing: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self.gone: BaseException | None = None
        self.gone_event = asyncio.Event()
        self._snapshotting = False
        self._consumer_ids = iter(range(1, 2**62))

    def _dedup_path(self) -> str:
        return f"{self.client.streams.registry.stream_path(self.stream)}/dedup"

    async def start(self) -> None:
        """Take the stream over (fencing whoever wrote it), then rebuild the dedup state
        from the snapshot and the tail after it."""
        self.producer = await self.client.create_producer(
            self.stream, initial_sequence_id=-1, batching_max_publish_delay_ms=1.0
        )
        try:
            data: bytes | None = (await self.client.store.get(self._dedup_path())).data
        except NoNodeError:
            data = None
        dedup = Dedup.restore(data)
        scanner = StreamScanner(
            self.client.ledgers,
            self.client.streams.registry,
            self.stream,
            dedup.position,
            tail=False,
        )
        async for batch in scanner.batches():
            if batch.producers is None or batch.sequence_ids is None:
                continue
            for message in batch:
                if message.producer_name:
                    dedup.observe(message.producer_name, message.sequence_id, message.message_id)
        self.dedup = dedup

    # -- producers ----------------------------------------------------------------------

    async def add_producer(self, name: str, access_mode: str) -> ProducerSession:
        if access_mode not in ACCESS_MODES:
            raise BadRequestError(
                f"access_mode is one of {', '.join(ACCESS_MODES)}: {access_mode!r}"
            )
        name = name or f"{self.broker.broker_id}-{uuid.uuid4().hex[:10]}"
        async with self._producers_changed:
            if name in self.producers:
                raise ProducerBusyError(
                    f"a producer named {name!r} is connected to {self.stream!r}"
                )
            while True:
                exclusive = [p for p in self.producers.values() if p.access_mode != "shared"]
                if exclusive and access_mode != "exclusive_with_fencing":
                    if access_mode == "wait_for_exclusive":
                        await self._producers_changed.wait()
                        continue
                    raise ProducerBusyError(
                        f"stream {self.stream!r} has an exclusive producer ({exclusive[0].name})"
                    )
                if access_mode == "exclusive" and self.producers:
                    raise ProducerBusyError(
                        f"stream {self.stream!r} has {len(self.producers)} producers: "
                        "exclusive access needs none"
                    )
                if access_mode == "wait_for_exclusive" and self.producers:
                    await self._producers_changed.wait()
                    continue
                break
            if access_mode == "exclusive_with_fencing":
                for other in list(self.producers.values()):
                    other.error = ProducerFencedError(
                        f"producer {name!r} took {self.stream!r} with exclusive_with_fencing"
                    )
                    other.fenced.set()
                    del self.producers[other.name]
            session = ProducerSession(name, access_mode)
            self.producers[name] = session
            return session

    async def remove_producer(self, session: ProducerSession) -> None:
        async with self._producers_changed:
            if self.producers.get(session.name) is session:
                del self.producers[session.name]
            self._producers_changed.notify_all()

    async def room(self) -> None:
        """Wait while the stream's writer has its max_pending_messages pending."""
        if self.producer is not None and self.gone is None:
            await self.producer.wait_for_room()

    def publish(
        self, session: ProducerSession, sequence_id: int, checked: Checked
    ) -> asyncio.Future[MessageId] | MessageId:
        """Take one message of a producer: a future of its position, or (a duplicate)
        where the original went (EARLIEST: too old to remember)."""
        if self.gone is not None:
            raise self.gone
        if session.error is not None:
            raise session.error
        seen = self.dedup.check(session.name, sequence_id)
        if seen is not None:
            return seen
        assert self.producer is not None
        future = self.producer.queue_checked(checked, sequence_id, session.name)
        self.dedup.taken(session.name, sequence_id, future)
        future.add_done_callback(lambda done: self._written(session.name, sequence_id, done))
        return future

    def _written(self, name: str, sequence_id: int, done: asyncio.Future[MessageId]) -> None:
        if done.cancelled() or done.exception() is not None:
            self.dedup.durable(name, sequence_id, None)
            error = done.exception() if not done.cancelled() else StreamGone("cancelled")
            # The writer failed: fenced by another owner, or out of bookies. Either way
            # this broker can write no more of the stream: give it up.
            self.broker.give_up(self.stream, error)
            return
        self.dedup.durable(name, sequence_id, done.result())
        if self.dedup.since_snapshot >= SNAPSHOT_EVERY and not self._snapshotting:
            self._snapshotting = True
            asyncio.get_running_loop().create_task(self._snapshot())

    async def _snapshot(self) -> None:
        try:
            data = self.dedup.snapshot()
            path = self._dedup_path()
            try:
                await self.client.store.set(path, data)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    await self.client.store.create(path, data)
        except Exception as error:  # the tail scan covers what a snapshot misses
            log.warning("stream %s: dedup snapshot failed: %s", self.stream, error)
        finally:
            self._snapshotting = False

    # -- consumers ----------------------------------------------------------------------

    async def add_consumer(
        self,
        subscription: str,
        kind: Kind,
        name: str,
        initial_position: str,
        nack_delay_ms: int,
    ) -> tuple[SubscriptionDispatcher, ConsumerSession]:
        if self.gone is not None:
            raise self.gone
        async with self._subscribing[subscription]:
            dispatcher = self.subscriptions.get(subscription)
            if dispatcher is None:
                inner = await self.client.subscribe(
                    self.stream,
                    subscription,
                    initial_position,
                    consumer_type="failover",  # the broker's own: stands by while another reads
                    consumer_name=self.broker.broker_id,
                    receiver_queue_size=1000,
                )
                dispatcher = SubscriptionDispatcher(inner, kind, nack_delay_ms / 1000.0)
                self.subscriptions[subscription] = dispatcher
            session = ConsumerSession(next(self._consumer_ids), name or uuid.uuid4().hex[:8], kind)
            dispatcher.add(session)
            return dispatcher, session

    async def remove_consumer(
        self, subscription: str, dispatcher: SubscriptionDispatcher, session: ConsumerSession
    ) -> None:
        dispatcher.remove(session.cid)
        if not dispatcher.sessions:  # the last one left: persist and stop reading
            async with self._subscribing[subscription]:
                if not dispatcher.sessions and self.subscriptions.get(subscription) is dispatcher:
                    del self.subscriptions[subscription]
                    await dispatcher.close()

    async def seek(
        self,
        subscription: str,
        dispatcher: SubscriptionDispatcher,
        cid: int,
        target: MessageId | int,
    ) -> None:
        async with self._subscribing[subscription]:
            try:
                await dispatcher.seek(target)
            except Exception as error:
                dispatcher.sessions[cid].outbox.put_nowait(Done("seek", error))
                return
            dispatcher.disconnect_all("the subscription was reset (seek): reconnect",
                                      Done("seek"), cid)  # fmt: skip

    async def unsubscribe(
        self, subscription: str, dispatcher: SubscriptionDispatcher, cid: int
    ) -> None:
        async with self._subscribing[subscription]:
            try:
                await dispatcher.unsubscribe(cid)
            except Exception as error:
                dispatcher.sessions[cid].outbox.put_nowait(Done("unsubscribe", error))
                return
            if self.subscriptions.get(subscription) is dispatcher:
                del self.subscriptions[subscription]
            dispatcher.disconnect_all("unsubscribed", Done("unsubscribe"), cid)

    # -- the end ------------------------------------------------------------------------

    async def close(self, error: BaseException) -> None:
        """Stop serving: every session is told `error`."""
        if self.gone is None:
            self.gone = error
        self.gone_event.set()
        for session in self.producers.values():
            session.error = session.error or error
            session.fenced.set()
        for dispatcher in list(self.subscriptions.values()):
            for consumer in dispatcher.sessions.values():
                consumer.outbox.put_nowait(error)
            with contextlib.suppress(Exception):
                await dispatcher.close()
        self.subscriptions.clear()
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await self.producer.close()


def on_done_log(what: str) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s failed: %s", what, task.exception())

    return done
