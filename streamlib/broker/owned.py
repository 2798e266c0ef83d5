"""A stream a broker owns: its one writer, the producers publishing through it, and
its subscriptions (each dispatched by dispatcher.py).

A broker serves a stream only after it holds the stream's lease. It takes the stream
over as writer (fences the last two ledgers, creates one, CAS's the list: StreamWriter)
when its first producer arrives, and only then takes entries -- built by the producers
(streamlib/stream/producer.py), checked here, deduplicated, and appended as they are:
the fencing is what makes a deposed owner unable to acknowledge anything. Consumers and readers need no takeover
(their safety is the subscription's lock and the cursor's CAS, as in direct mode), so
one that only reads fences no writer -- a direct-mode producer of the stream included.
If the writer fails -- another broker or writer took over and fenced it -- the stream
is given up at once: every producer and consumer of it here is told, and looks the
stream up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from typing import Any

from streamlib.broker import dedup_store
from streamlib.broker.dedup import MAX_NAME_CHARS, Dedup
from streamlib.broker.dispatcher import SubscriptionDispatcher
from streamlib.broker.load import Traffic
from streamlib.broker.sessions import ConsumerSession, Done, ProducerSession, StreamGone
from streamlib.protocol.dispatch import Kind
from streamlib.protocol.errors import (
    BadRequestError,
    ProducerBusyError,
    ProducerFencedError,
    StreamlibError,
    TooLargeError,
)
from streamlib.protocol.ownership import may_take_over
from streamlib.pulsar import entries as pulsar_entries
from streamlib.pulsar.entries import is_pulsar_entry
from streamlib.stream.batch import MAX_CHUNKED_MESSAGE_BYTES, DecodedBatch, decode_batch
from streamlib.stream.positions import MessageId
from streamlib.stream.producer import (
    ACCESS_MODES,
    CHUNK_BYTES,
    MAX_BATCH_MESSAGES,
    MAX_CHUNKS,
    MAX_ENTRY_BYTES,
)
from streamlib.stream.reader import StreamScanner
from streamlib.stream.writer import StreamWriter
from streamlib.tasks import HeldTasks

log = logging.getLogger(__name__)

SNAPSHOT_EVERY = 1000  # durable messages between dedup snapshots (and after a failed one)
# ... and at least this long between two (Pulsar's brokerDeduplicationSnapshotIntervalSeconds):
# a snapshot is a ledger written, closed and the last one deleted -- at 20,000 msgs/s, one
# per 1,000 messages cost a single producer a tenth of its rate. The next owner's tail scan
# covers what came since.
SNAPSHOT_INTERVAL_S = 10.0
# Entries appended and not yet durable, per stream: then taking more waits (the
# producers' gRPC streams stop being read: flow control pushes back on them).
MAX_ENTRIES_IN_FLIGHT = 2000


class OwnedStream:
    def __init__(self, broker: Any, stream: str) -> None:
        self.broker = broker
        self.stream = stream
        self.client = broker.client
        self.writer: StreamWriter | None = None
        self._in_flight = 0  # entries appended, not yet durable
        self._room = asyncio.Event()
        self._room.set()
        self.dedup = Dedup()
        self.dedup.share(broker.recent_ids)
        self.producers: dict[str, ProducerSession] = {}
        self._producers_changed = asyncio.Condition()
        self.subscriptions: dict[str, SubscriptionDispatcher] = {}
        self._subscribing = asyncio.Lock()  # subscriptions come, change and go one at a time
        self.gone: BaseException | None = None
        self._snapshotting = False
        self._consumer_ids = iter(range(1, 2**62))
        self._taking_over = asyncio.Lock()
        self._next_snapshot_at = 0.0  # (the loop's clock)
        self.tasks = HeldTasks(f"stream {stream!r}")  # (snapshots, wake-ups, closes)
        self.traffic = Traffic()  # (counted per entry: the broker's load report)

    async def ensure_writer(self) -> None:
        """Take the stream over as its writer, once (its first producer's open waits for
        it; a failed takeover is tried again by the next)."""
        if self.writer is not None:
            return
        async with self._taking_over:
            if self.gone is not None:
                raise self.gone
            if self.writer is None:
                # Still the lease's holder? (Served for consumers until now, it may have
                # been stopped or cut off meanwhile: it must not fence the new owner.)
                if not may_take_over(await self.broker.holds(self.stream)):
                    gone = StreamGone(f"this broker no longer owns {self.stream!r}")
                    self.broker.give_up(self, gone)
                    raise gone
                await self._take_over()

    async def _take_over(self) -> None:
        """Take the stream over (fencing whoever wrote it), then rebuild the dedup state
        from the snapshot and the tail after it."""
        writer = await self.client.take_over(self.stream, fail_stop=True)
        try:
            await self._restore_dedup()
        except BaseException:
            with contextlib.suppress(Exception):
                await writer.close()
            raise
        self.writer = writer
        if self.gone is not None:  # (it went meanwhile: close() may have missed it)
            with contextlib.suppress(Exception):
                await writer.close()
            raise self.gone

    async def _restore_dedup(self) -> None:
        timeout_s = self.broker.dedup_inactivity_timeout_s
        found = await dedup_store.load(self.client, self.stream, timeout_s)
        dedup = found if found is not None else Dedup(timeout_s)
        scanner = StreamScanner(
            self.client.ledgers,
            self.client.streams.registry,
            self.stream,
            dedup.position,
            tail=False,
        )
        # Names and sequence ids only: the entries are not decoded whole (a Pulsar
        # producer's encrypted entry reads so too, as opaque messages, not as an error).
        scanner.keep_raw = True
        scanned = 0
        async for batch in scanner.batches():
            if batch.producers is None or batch.sequence_ids is None:
                continue
            if batch.chunk is not None and batch.chunk.index < batch.chunk.count - 1:
                continue  # (a chunked message counts once its last piece is stored)
            for message in batch:
                if message.producer_name:
                    dedup.observe(message.producer_name, message.sequence_id, message.message_id)
                    scanned += 1
        dedup.share(self.broker.recent_ids)
        self.dedup = dedup
        # The next owner starts from here -- unless the scan found nothing: then the
        # state is the one it started from (none at all for a new stream, where the
        # snapshot would be a ledger written for an empty state, and a broker opening
        # thousands of streams would write thousands).
        if scanned:
            await self.write_snapshot(force=True)

    def mark_gone(self, error: BaseException) -> None:
        """Serve nothing more, from now: every producer is cut off, every consumer told,
        and whoever waits to be admitted wakes to the error."""
        if self.gone is not None:
            return
        self.gone = error
        for session in self.producers.values():
            session.error = session.error or error
            session.fenced.set()
        for dispatcher in self.subscriptions.values():
            dispatcher.disconnect_all(str(error))

        async def wake_waiters() -> None:
            async with self._producers_changed:
                self._producers_changed.notify_all()

        self.tasks.spawn(wake_waiters())

    # -- producers ----------------------------------------------------------------------

    @staticmethod
    def check_producer(name: str, access_mode: str) -> None:
        """BadRequestError for an open no producer may make (before anything is done for
        it: a takeover included)."""
        if access_mode not in ACCESS_MODES:
            raise BadRequestError(
                f"access_mode is one of {', '.join(ACCESS_MODES)}: {access_mode!r}"
            )
        if len(name) > MAX_NAME_CHARS:
            raise BadRequestError(f"a producer name is at most {MAX_NAME_CHARS} characters")

    async def add_producer(
        self, name: str, access_mode: str, resume: bool = False, principal: str | None = None
    ) -> ProducerSession:
        self.check_producer(name, access_mode)
        name = name or f"{self.broker.broker_id}-{uuid.uuid4().hex[:10]}"
        async with self._producers_changed:
            if self.gone is not None:
                raise self.gone
            if name in self.producers and resume and self.producers[name].principal == principal:
                # The same producer again, after its connection broke: the broker may
                # not have noticed the old one's end yet. The new one takes its place --
                # if the same principal opened it (another's resume would take over its
                # name, its sequence ids and its exclusivity).
                old = self.producers.pop(name)
                old.error = StreamGone(f"producer {name!r} reconnected")
                old.fenced.set()
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
                    busy = ProducerBusyError(
                        f"stream {self.stream!r} has an exclusive producer ({exclusive[0].name})"
                    )
                    raise _exclusive(busy) if access_mode == "exclusive" else busy
                if access_mode == "exclusive" and self.producers:
                    raise _exclusive(ProducerBusyError(
                        f"stream {self.stream!r} has {len(self.producers)} producers: "
                        "exclusive access needs none"
                    ))  # fmt: skip
                if access_mode == "wait_for_exclusive" and self.producers:
                    await self._producers_changed.wait()
                    continue
                break
            if self.gone is not None:  # (it went while this one waited)
                raise self.gone
            if access_mode == "exclusive_with_fencing":
                for other in list(self.producers.values()):
                    other.error = ProducerFencedError(
                        f"producer {name!r} took {self.stream!r} with exclusive_with_fencing"
                    )
                    other.fenced.set()
                    del self.producers[other.name]
            session = ProducerSession(name, access_mode, principal)
            self.producers[name] = session
            return session

    async def remove_producer(self, session: ProducerSession) -> None:
        async with self._producers_changed:
            if self.producers.get(session.name) is session:
                del self.producers[session.name]
            self._producers_changed.notify_all()

    async def room(self) -> None:
        """Wait while the stream's writer has MAX_ENTRIES_IN_FLIGHT entries in flight."""
        while self._in_flight >= MAX_ENTRIES_IN_FLIGHT and self.gone is None:
            self._room.clear()
            await self._room.wait()

    def publish(self, session: ProducerSession, send: Any) -> asyncio.Future[MessageId] | MessageId:
        """Take one entry of a producer (an EntrySend): a future of its last message's
        position, or (a duplicate: its last sequence id was taken before) where that one
        went (EARLIEST: too old to remember). BadRequestError / TooLargeError for an entry
        that is not this producer's well-formed batch (it alone is refused)."""
        if self.gone is not None:
            raise self.gone
        if session.error is not None:
            raise session.error
        decoded = self._checked(session, send)
        last = send.last_sequence_id
        # The pieces of a chunked message before its last are stored as they come (a
        # resend stores them again: readers drop unfinished pieces); the last piece is
        # the message, for deduplication.
        piece = decoded.chunk is not None and decoded.chunk.index < decoded.chunk.count - 1
        if not piece:
            seen = self.dedup.check(session.name, last)
            if seen is not None:
                return seen
        assert self.writer is not None
        try:
            appended = self.writer.append_nowait(send.entry)
        except StreamlibError as error:  # fenced: another owner took the stream over
            gone = StreamGone(f"the stream's writer failed: {error}")
            self.broker.give_up(self, gone)
            raise gone from None
        future: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        count = len(decoded.payloads)  # (the closure below keeps no decoded payload alive)
        del decoded
        self.traffic.msgs_in += count
        self.traffic.bytes_in += len(send.entry)
        self._in_flight += 1

        def written(done: asyncio.Future[tuple[int, int]]) -> None:
            self._in_flight -= 1
            self._room.set()
            # The write's own outcome, for the dedup state and the stream: `future` may
            # have been cancelled by a waiter meanwhile, and setting it then raised before
            # the outcome reached _written (a failed write was neither given up nor
            # cleared from the dedup state; seen in an hour of chaos, as InvalidStateError).
            outcome: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
            if done.cancelled():
                outcome.set_exception(StreamGone("cancelled"))
            elif (error := done.exception()) is not None:
                outcome.set_exception(error)
            else:
                ledger_id, entry_id = done.result()
                outcome.set_result(MessageId(ledger_id, entry_id, count - 1))
            failure = outcome.exception()
            if future.done():
                pass  # (cancelled by a waiter: nobody reads it)
            elif failure is not None:
                future.set_exception(failure)
            else:
                future.set_result(outcome.result())
            self._written(session.name, last, outcome, 0 if piece else count)

        appended.add_done_callback(written)
        if not piece:
            self.dedup.taken(session.name, last, future)
        return future

    @staticmethod
    def _checked(session: ProducerSession, send: Any) -> DecodedBatch:
        """The entry's messages, if it is a batch of this producer's with the sequence
        ids it claims (a client naming another producer in its entries would corrupt
        that one's deduplication after a failover)."""
        if len(send.entry) > MAX_ENTRY_BYTES:
            raise TooLargeError(
                f"an entry is at most {MAX_ENTRY_BYTES} bytes, got {len(send.entry)}"
            )
        # (A producer never builds more: a compressed entry claiming more is a bomb. The
        # payloads are not needed: the entry is stored as it came.)
        pulsar = is_pulsar_entry(send.entry)
        if pulsar:  # (a Pulsar producer's: checked whole; its front end checked its CRC)
            decoded = pulsar_entries.check(
                send.entry, "the entry sent", MAX_ENTRY_BYTES + (1 << 20), verify=False
            )
        else:
            decoded = decode_batch(
                send.entry, "the entry sent", MAX_ENTRY_BYTES + (1 << 20), payloads=False
            )
        ids, names = decoded.sequence_ids, decoded.producers
        count = len(decoded.payloads)
        chunk = decoded.chunk
        if pulsar and chunk is not None:
            # (A Pulsar client cuts its pieces as large as its broker allows, or smaller:
            # what bounds them is the whole's size, which a reader puts together.)
            if not chunk.count <= max(1, chunk.total_size) <= MAX_CHUNKED_MESSAGE_BYTES:
                raise BadRequestError(
                    f"a chunked message is at most {MAX_CHUNKED_MESSAGE_BYTES} bytes, in "
                    "pieces of a byte or more"
                )
        elif chunk is not None and not (
            chunk.count <= MAX_CHUNKS
            and len(decoded.payloads[0]) <= CHUNK_BYTES
            and (chunk.count - 1) * CHUNK_BYTES < chunk.total_size <= chunk.count * CHUNK_BYTES
        ):
            raise BadRequestError(
                f"a piece of a chunked message holds at most {CHUNK_BYTES} bytes, of a message "
                f"of at most {MAX_CHUNKS} pieces that add up to its size"
            )
        if count > MAX_BATCH_MESSAGES:
            raise BadRequestError(f"an entry holds at most {MAX_BATCH_MESSAGES} messages")
        if (
            not count
            or count != send.messages
            or ids is None
            or names is None
            or ids[0] != send.first_sequence_id
            or ids[-1] != send.last_sequence_id
            or ids[0] < 0
            or (not isinstance(ids, range) and any(b < a for a, b in itertools.pairwise(ids)))
            or set(names) != {session.name}
        ):
            raise BadRequestError(
                f"an entry must hold its {send.messages} messages of producer "
                f"{session.name!r} with sequence ids {send.first_sequence_id}.."
                f"{send.last_sequence_id}, rising"
            )
        return decoded

    def _written(
        self, name: str, sequence_id: int, done: asyncio.Future[MessageId], messages: int
    ) -> None:
        if done.cancelled() or done.exception() is not None:
            if messages:
                self.dedup.durable(name, sequence_id, None)
            error = done.exception() if not done.cancelled() else StreamGone("cancelled")
            # The writer failed: fenced by another owner, or out of bookies. Either way
            # this broker can write no more of the stream: give it up (at once: nothing
            # more is taken, and no duplicate answered from a state that is now stale).
            self.broker.give_up(self, error)
            return
        if not messages:
            return
        self.dedup.durable(name, sequence_id, done.result(), messages)
        if (
            self.dedup.since_snapshot >= SNAPSHOT_EVERY
            and not self._snapshotting
            and asyncio.get_running_loop().time() >= self._next_snapshot_at
        ):
            self.tasks.spawn(self.write_snapshot())

    async def write_snapshot(self, force: bool = False) -> None:
        """Write the dedup state where the next owner starts (dedup_store.py), names idle
        past the inactivity timeout forgotten first. Its tail scan covers what a
        snapshot misses, so a failed one costs only time: it is tried again after
        another SNAPSHOT_EVERY messages, not on the next one. Only a writer has one."""
        if self._snapshotting or (self.writer is None and not force):
            return
        self._snapshotting = True
        self._next_snapshot_at = (
            asyncio.get_running_loop().time() + self.broker.dedup_snapshot_interval_s
        )
        covered = self.dedup.since_snapshot
        try:
            self.dedup.forget_idle(keep=self.producers)
            await dedup_store.save(self.client, self.stream, self.dedup)
        except Exception as error:
            log.warning("stream %s: dedup snapshot failed: %s", self.stream, error)
        finally:
            self.dedup.since_snapshot -= covered
            self._snapshotting = False

    # -- consumers ----------------------------------------------------------------------

    async def add_consumer(
        self,
        subscription: str,
        kind: Kind,
        name: str,
        initial_position: str,
        nack_delay_ms: int,
        persist_interval_ms: int = 100,
        resume: bool = False,
        principal: str | None = None,
        read_compacted: bool = False,
    ) -> tuple[SubscriptionDispatcher, ConsumerSession]:
        """A consumer session of the subscription's dispatcher (made for the first one:
        its initial position, persist interval and read_compacted are the
        subscription's on this broker)."""
        if self.gone is not None:
            raise self.gone
        async with self._subscribing:
            dispatcher = self.subscriptions.get(subscription)
            if dispatcher is None:
                inner = await self.client.subscribe(
                    self.stream,
                    subscription,
                    initial_position,
                    consumer_type="failover",  # the broker's own: stands by while another reads
                    consumer_name=self.broker.broker_id,
                    receiver_queue_size=1000,
                    cursor_persist_interval_ms=persist_interval_ms,
                    read_compacted=read_compacted,
                )
                if self.gone is not None:  # (it went while this one subscribed)
                    await inner.close()
                    raise self.gone
                inner.source.keep_entries()  # type: ignore[attr-defined]
                dispatcher = SubscriptionDispatcher(
                    inner,
                    kind,
                    nack_delay_ms / 1000.0,
                    on_fail=self._dispatcher_failed,
                    budgets=self.broker.budgets,
                    traffic=self.traffic,
                )
                self.subscriptions[subscription] = dispatcher
            if resume and name:
                # The same consumer again, after its connection broke: the old session
                # may not have ended here yet. The new one takes its place.
                for cid, old in list(dispatcher.sessions.items()):
                    if old.name == name and old.principal == principal:
                        old.outbox.put_nowait(StreamGone(f"consumer {name!r} reconnected"))
                        dispatcher.remove(cid)
            session = ConsumerSession(
                next(self._consumer_ids), name or uuid.uuid4().hex[:8], kind, principal
            )
            dispatcher.add(session)
            return dispatcher, session

    def _dispatcher_failed(self, dispatcher: SubscriptionDispatcher, error: BaseException) -> None:
        """Its reading failed (its consumers were told): the next consumer starts anew."""
        for name, found in list(self.subscriptions.items()):
            if found is dispatcher:
                del self.subscriptions[name]
        self.tasks.spawn(dispatcher.close())

    async def remove_consumer(
        self, subscription: str, dispatcher: SubscriptionDispatcher, session: ConsumerSession
    ) -> None:
        dispatcher.remove(session.cid)
        if not dispatcher.sessions:  # the last one left: persist and stop reading
            async with self._subscribing:
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
        async with self._subscribing:
            try:
                await dispatcher.seek(target)
            except Exception as error:
                # What was read and handed out is forgotten either way: every consumer
                # reconnects and starts again from the cursor as it is.
                dispatcher.disconnect_all(f"a seek failed: {error}", Done("seek", error), cid)
                return
            dispatcher.disconnect_all("the subscription was reset (seek): reconnect",
                                      Done("seek"), cid)  # fmt: skip

    async def unsubscribe(
        self, subscription: str, dispatcher: SubscriptionDispatcher, cid: int
    ) -> None:
        async with self._subscribing:
            try:
                await dispatcher.unsubscribe(cid)
            except Exception as error:
                asker = dispatcher.sessions.get(cid)  # (it may have left meanwhile)
                if asker is not None:
                    asker.outbox.put_nowait(Done("unsubscribe", error))
                return
            if self.subscriptions.get(subscription) is dispatcher:
                del self.subscriptions[subscription]
            dispatcher.disconnect_all("unsubscribed", Done("unsubscribe"), cid)

    # -- the end ------------------------------------------------------------------------

    async def close(self, error: BaseException) -> None:
        """Stop serving: every session is told `error`."""
        self.mark_gone(error)
        async with self._subscribing:  # (none is being added meanwhile)
            dispatchers = list(self.subscriptions.values())
            self.subscriptions.clear()
        for dispatcher in dispatchers:
            with contextlib.suppress(Exception):
                await dispatcher.close()
        self._room.set()
        await self.tasks.wait()  # (a snapshot being written, a failed dispatcher closing)
        if self.writer is not None:
            with contextlib.suppress(Exception):
                await self.writer.close()


def _exclusive(error: ProducerBusyError) -> ProducerBusyError:
    """Marked as an exclusive producer's conflict (Pulsar answers it ProducerFenced; a
    shared producer's, or a name in use, ProducerBusy)."""
    error.exclusive = True  # type: ignore[attr-defined]
    return error
