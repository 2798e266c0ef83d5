"""A subscription's dispatch on its stream's owner: one direct consumer (the broker's)
reads the subscription's cursor, and the dispatch rules (streamlib/protocol/dispatch.py)
hand its messages to the connected consumers."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from streamlib.broker.access import Budgets
from streamlib.broker.sessions import ConsumerSession, Done, StreamGone
from streamlib.closing import CloseOnce
from streamlib.protocol.dispatch import ConsumerBusy, Kind, Pending, key_slot
from streamlib.protocol.errors import (
    ConsumerBusyError,
)
from streamlib.stream.consumer import Consumer
from streamlib.stream.positions import MessageId
from streamlib.stream.reader import Message

log = logging.getLogger(__name__)


class SubscriptionDispatcher:
    """Reads the subscription's cursor through one direct consumer (the broker's) and
    hands the messages out by the dispatch rules (streamlib/protocol/dispatch.py)."""

    def __init__(
        self,
        inner: Consumer,
        kind: Kind,
        nack_delay_s: float,
        on_fail: Callable[[SubscriptionDispatcher, BaseException], None] | None = None,
        budgets: Budgets | None = None,
    ) -> None:
        self.inner = inner
        self.dispatch = (budgets or Budgets()).dispatch(kind)
        self.sessions: dict[int, ConsumerSession] = {}
        self._nack_delay_s = nack_delay_s
        self._wake = asyncio.Event()
        self._generation = 0  # a seek starts a new one: older redeliveries are dropped
        self._on_fail = on_fail
        self.failed: BaseException | None = None
        self._closing = CloseOnce()
        self._task = self._start_task()

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
        if cumulative and ids:  # everything up to the highest that this consumer holds
            upto = max(ids)
            ids = sorted(
                p.message_id for p in self.dispatch.unacked_of(cid) if p.message_id <= upto
            )
        for one in ids:
            pending = self.dispatch.ack(cid, one)
            if pending is not None:  # (its ref: the message as this consumer got it)
                self.inner.acknowledge(pending.ref)
        self._wake.set()

    def nack(self, cid: int, ids: list[MessageId]) -> None:
        back = [p for p in (self.dispatch.take_back(cid, i) for i in ids) if p is not None]
        if not back:
            return
        for pending in back:
            pending.ref = pending.ref.redelivered()
        asyncio.get_running_loop().call_later(
            self._nack_delay_s, self._redeliver, back, self._generation
        )

    def _redeliver(self, back: list[Pending], generation: int) -> None:
        if generation != self._generation:  # a seek came between: these are the past
            return
        self.dispatch.redeliver(back)
        self._wake.set()

    def _start_task(self) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._run())
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The reading loop stopped: cancelled (a seek, the end), or failed (a read no
        bookie could serve, ...): then every consumer is told, and reconnects to a new
        dispatcher."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        assert error is not None
        log.warning("subscription %s: reading failed: %s", self.inner.subscription, error)
        self.failed = StreamGone(f"the subscription's reading failed: {error}")
        self.disconnect_all(str(self.failed))
        if self._on_fail is not None:
            self._on_fail(self, self.failed)

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
        self.dispatch.offer(
            Pending(
                message,
                message.message_id,
                key_slot(message.key, message.message_id, message.ordering_key()),
                len(message.data),
            )
        )

    def _deliver(self) -> None:
        grouped: dict[Any, list[Message]] = collections.defaultdict(list)
        for cid, pending in self.dispatch.deliveries():
            grouped[cid].append(pending.ref)
        for cid, messages in grouped.items():
            session = self.sessions.get(cid)
            if session is not None:
                session.outbox.put_nowait(messages)

    async def seek(self, target: MessageId | int) -> None:
        """Move the cursor (Pulsar's seek): what was read or handed out is forgotten,
        the cursor is written, and every consumer is disconnected: each reconnects and
        receives from the new position. (A seek that fails disconnects them too: they
        start again from the cursor as it is.)"""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        # Forget what was handed out BEFORE the cursor moves: an ack of it arriving while
        # the seek runs must find nothing to pass on (applied to the moved cursor, it would
        # skip that message for good). A seek that fails disconnects every consumer too.
        self._generation += 1
        self.dispatch.reset()
        try:
            await self.inner.seek(target)
        finally:
            self._task = self._start_task()

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
        try:
            await self.inner.unsubscribe()
        except BaseException:
            self._task = self._start_task()  # it stays: reading goes on
            raise

    async def close(self) -> None:
        """Stop reading and close the direct consumer (persisting its cursor, leaving
        the subscription's line): to its end even when the RPC that closes is cancelled
        (closing.py), or the next dispatcher of the subscription waits behind it."""
        await self._closing.run(self._close)

    async def _close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.inner.close()
