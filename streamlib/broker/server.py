"""The broker's gRPC front end (streamlib/wire/broker.proto): each call is one
producer's or consumer's session, admitted for its caller (access.py) and served by the
broker core -- ownership (ownership.py), a stream's writer and subscriptions (owned.py,
dispatcher.py). Clients: streamlib/service/. A second wire front end (Pulsar's binary
protocol) would serve the same core.

    streamlib broker --metadata URI [--host H --port P --advertised-address A]
                     [--broker-id ID] [--tls-cert F --tls-key F [--tls-ca F]]
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, NoReturn

import grpc

from bookie.errors import UnauthenticatedError as BookieUnauthenticated
from bookie.errors import UnauthorizedError as BookieUnauthorized
from metadata.errors import InvalidNameError, MetadataError, StreamExistsError
from streamlib.broker import admin
from streamlib.broker.access import BrokerAccess, HeldBytes, SessionLimits
from streamlib.broker.dispatcher import Handed
from streamlib.broker.mux import Handler, ServedSession
from streamlib.broker.owned import OwnedStream
from streamlib.broker.ownership import Broker, NotOwnerError
from streamlib.broker.sessions import Done, StreamGone
from streamlib.closing import to_its_end
from streamlib.protocol.dispatch import Kind
from streamlib.protocol.errors import (
    BadRequestError,
    NoSuchStreamError,
    StreamlibError,
    TooLargeError,
    UnauthorizedError,
    is_retriable,
)
from streamlib.protocol.ownership import may_answer_ready
from streamlib.protocol.service_access import Caller, Operation, may_create
from streamlib.stream.admin import partitions_of
from streamlib.stream.batch import MAX_CHUNKED_MESSAGE_BYTES, MessageDecodeError
from streamlib.stream.compacted import check_read_compacted
from streamlib.stream.positions import EARLIEST, LATEST, MessageId
from streamlib.stream.reader import ScannerFeed
from streamlib.stream.subscription import parse_consumer_type
from streamlib.wire import broker_pb2 as pb
from streamlib.wire import broker_pb2_grpc as pb_grpc
from streamlib.wire.convert import error_pb, from_json, id_from_pb, id_pb, to_json

log = logging.getLogger(__name__)

MAX_RECEIPTS_PER_RESPONSE = 10_000  # (about 40 B each, far below a gRPC message)
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # a gRPC message (a batch of sends, or deliveries)
PENDING_BATCHES = 16  # a producer's batches taken and not yet settled (then reading waits)
MAX_ENTRIES_PER_REQUEST = 10_000
RECENT_AT_OPEN = 1000  # a producer's last sends' positions its Ready tells it (dedup)
# What a consumer's client must read (ConsumerOpen.protocol_version): entries whole.
CONSUMER_PROTOCOL = 2
DELIVERY_BYTES = 1 << 20  # deliveries are sent in gRPC messages of about this size
OPEN_WITHIN_S = 10.0  # a call's first message, its Open, comes within this
LOOK_AGAIN_S = 1.0  # a reader's session checks this often whether its client half-closed
KINDS = {
    "exclusive": Kind.EXCLUSIVE,
    "failover": Kind.FAILOVER,
    "shared": Kind.SHARED,
    "key_shared": Kind.KEY_SHARED,
}


class BrokerService(pb_grpc.BrokerServicer):
    """The gRPC front end. access: who calls and what they may do (access.py; None:
    authentication off, everyone may do everything); limits: sessions per broker and
    per principal. Every operation is checked against the caller's principal
    (streamlib/protocol/service_access.py) before the broker does anything for it."""

    def __init__(
        self,
        broker: Broker,
        access: BrokerAccess | None = None,
        limits: SessionLimits | None = None,
    ) -> None:
        self.broker = broker
        self.access = access or BrokerAccess()
        self.limits = limits or SessionLimits()

    async def _caller(self, context: Any) -> Caller:
        """For unary calls: abort with UNAUTHENTICATED when nobody the broker accepts."""
        try:
            return self.access.caller(context)
        except BookieUnauthenticated as error:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"UnauthenticatedError: {error}")
            raise  # (abort raises)

    async def _allowed(
        self, context: Any, caller: Caller, operation: Operation, stream: str = ""
    ) -> None:
        """For unary calls: abort with PERMISSION_DENIED unless the caller may."""
        try:
            self.access.check(caller, operation, stream)
        except UnauthorizedError as error:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"UnauthorizedError: {error}")

    async def exists(self, caller: Caller, stream: str, create: bool = True) -> int:
        """The stream's partitions (0: not partitioned), after creating the stream if it
        does not exist, `create` asks it, and the cluster's policy and the caller's roles
        allow; else NoSuchStreamError, and nothing is made."""
        streams = self.broker.client.streams
        try:
            return int(await streams.partitions(stream))
        except NoSuchStreamError:
            if not create:
                raise
            if not may_create(caller, self.broker.allow_auto_create):
                why = (
                    "this cluster does not create streams on first use (allow_auto_create "
                    "is off): create it with `streamlib admin streams create`"
                    if not self.broker.allow_auto_create
                    else f"principal {caller.principal!r} may not create streams (the "
                    "write role may)"
                )
                raise NoSuchStreamError(f"stream {stream!r} does not exist: {why}") from None
        try:
            return partitions_of(await streams.create(stream))
        except StreamExistsError:  # (made meanwhile, by another producer or an admin)
            return int(await streams.partitions(stream))

    async def Lookup(self, request: pb.LookupRequest, context: Any) -> pb.LookupResponse:
        caller = await self._caller(context)
        if not request.stream:  # (a client checking a broker answers)
            me = self.broker.info
            return pb.LookupResponse(broker_id=me.broker_id, address=me.address)
        await self._allowed(context, caller, Operation.LOOKUP, request.stream)
        try:
            partitions = await self.exists(caller, request.stream, request.create)
            if partitions:  # no owner: its partitions are streams of their own
                return pb.LookupResponse(partitions=partitions)
            info = await self.broker.lookup(request.stream)
        except (InvalidNameError, BadRequestError) as error:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{type(error).__name__}: {error}"
            )
        except NoSuchStreamError as error:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"{type(error).__name__}: {error}"
            )
        except Exception as error:  # the metadata store, a takeover: another try may do
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{type(error).__name__}: {error}")
        return pb.LookupResponse(broker_id=info.broker_id, address=info.address)

    async def Unload(self, request: pb.UnloadRequest, context: Any) -> pb.UnloadResponse:
        caller = await self._caller(context)
        await self._allowed(context, caller, Operation.UNLOAD, request.stream)
        return pb.UnloadResponse(unloaded=await self.broker.unload(request.stream))

    async def LastMessageId(
        self, request: pb.LastMessageIdRequest, context: Any
    ) -> pb.LastMessageIdResponse:
        """Any broker answers (reading fences nothing)."""
        caller = await self._caller(context)
        await self._allowed(context, caller, Operation.READ, request.stream)
        client = self.broker.client
        scanner = client.scanner(request.stream, request.read_compacted)
        try:
            if request.HasField("before_time_ms"):
                found = await scanner.position_before_time(request.before_time_ms)
                last = None if found == LATEST else found
            else:
                last = await scanner.last_message()
        except Exception as error:
            await _abort(context, error)
        answer = pb.LastMessageIdResponse()
        if last is not None:
            answer.message_id.CopyFrom(id_pb(last))
        return answer

    async def Admin(self, request: pb.AdminRequest, context: Any) -> pb.AdminResponse:
        """A call of the streams' administration (streamlib/broker/admin.py), for the
        caller; its error as the class it raised."""
        caller = await self._caller(context)
        try:
            result = await admin.run(
                self.broker.client.streams, caller, request.call, from_json(request.arguments_json)
            )
        except Exception as error:
            await _abort(context, error)
        return pb.AdminResponse(result_json=to_json(result))

    # -- many producers and consumers on one call ------------------------------------------

    async def Session(
        self, requests: AsyncIterator[pb.SessionRequest], context: Any
    ) -> AsyncIterator[pb.SessionResponse]:
        """Each handle of the call served as its own Produce or Consume call (mux.py)."""
        handlers: dict[str, Handler] = {"produce": self.Produce, "consume": self.Consume}
        served = ServedSession(handlers, context, self.limits.max_per_principal)
        async for response in served.serve(requests):
            yield response

    # -- producing ----------------------------------------------------------------------

    async def Produce(
        self, requests: AsyncIterator[pb.ProduceRequest], context: Any
    ) -> AsyncIterator[pb.ProduceResponse]:
        iterator = requests.__aiter__()
        opened = await _opening(iterator)  # (within OPEN_WITHIN_S, or the call ends)
        if not isinstance(opened, pb.ProducerOpen):
            if opened is not None:
                yield pb.ProduceResponse(error=error_pb(BadRequestError("open the producer first")))
            return
        try:
            caller = self._admit(context, Operation.PRODUCE, opened.stream)
        except Exception as error:
            yield pb.ProduceResponse(error=error_pb(error))
            return
        try:
            async for response in self._produce(opened, iterator, caller):
                yield response
        finally:
            self.limits.give_back(caller)

    def _refusal(self, context: Any, stream: str, subscription: str) -> BaseException | None:
        """Why the caller may not manage the subscription NOW (its roles, grants and
        token as they are at this request, not as they were at the open), or None."""
        try:
            caller = self.access.caller(context)
            self.access.check(caller, Operation.MANAGE_SUBSCRIPTION, stream, subscription)
        except (UnauthorizedError, BookieUnauthenticated) as refused:
            return refused
        return None

    def _admit(
        self, context: Any, operation: Operation, stream: str, subscription: str | None = None
    ) -> Caller:
        """The caller of a session, authorized for operation and holding a session (give
        it back at the session's end)."""
        caller = self.access.caller(context)
        self.access.check(caller, operation, stream, subscription)
        self.limits.take(caller)
        return caller

    async def _produce(
        self, opened: pb.ProducerOpen, iterator: AsyncIterator[pb.ProduceRequest], caller: Caller
    ) -> AsyncIterator[pb.ProduceResponse]:
        try:
            OwnedStream.check_producer(opened.producer_name, opened.access_mode or "shared")
            _not_partitioned(opened.stream, await self.exists(caller, opened.stream))
            owned = await self.broker.own(opened.stream)
            if opened.schema_type:
                stored = await owned.client.streams.offer_schema(
                    opened.stream,
                    opened.schema_type,
                    opened.schema_definition,
                    (opened.schema_checked_type, opened.schema_checked_definition),
                )
                if stored is not None:  # the client checks it, and opens again
                    yield pb.ProduceResponse(
                        error=pb.Error(code="SchemaCheckNeeded", message=json.dumps(stored))
                    )
                    return
            await owned.ensure_writer()  # (after the schema: a refused one fences nothing)
            session = await owned.add_producer(
                opened.producer_name,
                opened.access_mode or "shared",
                resume=opened.resume,
                principal=caller.principal,
            )
            try:
                await self.still_owner(owned)
            except BaseException:
                await owned.remove_producer(session)
                raise
        except Exception as error:
            yield pb.ProduceResponse(error=error_pb(error))
            return
        tasks: list[asyncio.Task[Any]] = []  # the session's: stopped at its end
        in_flight = HeldBytes(self.broker.publish_buffer)  # its sends' bytes, until settled
        try:
            ready = pb.ProducerReady(
                producer_name=session.name, last_sequence_id=owned.dedup.last(session.name)
            )
            for sequence_id, where in owned.dedup.recent(session.name, RECENT_AT_OPEN):
                ready.recent.add(sequence_id=sequence_id, message_id=id_pb(where))
            yield pb.ProduceResponse(ready=ready)
            # (bounded: a client that does not read its receipts stops being read)
            receipts: asyncio.Queue[pb.ProduceResponse | None] = asyncio.Queue(PENDING_BATCHES)
            pending: asyncio.Queue[Any] = asyncio.Queue(PENDING_BATCHES)  # batches to settle
            loop = asyncio.get_running_loop()
            reader = loop.create_task(
                self._take_sends(iterator, owned, session, pending, in_flight)
            )
            settler = loop.create_task(self._settle(pending, receipts, in_flight))

            async def wake_when_fenced() -> None:
                await session.fenced.wait()
                with contextlib.suppress(asyncio.QueueFull):  # (full: no wait to end)
                    receipts.put_nowait(None)

            tasks += (reader, settler, loop.create_task(wake_when_fenced()))
            held: list[pb.ProduceResponse | None] = []  # taken while merging, answered next
            while True:
                if held:
                    response = held.pop()
                else:
                    # (No heartbeats: gRPC's keepalive checks each connection, once for
                    # however many sessions it carries.)
                    response = None if session.fenced.is_set() else await receipts.get()
                    if response is None and session.fenced.is_set():
                        yield pb.ProduceResponse(
                            error=error_pb(session.error or StreamGone("gone"))
                        )
                        return
                if response is None:
                    return
                yield _merged_receipts(response, receipts, held)
        finally:

            async def end() -> None:  # (its sends' bytes too: to its end, see _stop_then)
                in_flight.give_back_all()
                await owned.remove_producer(session)

            await _stop_then(tasks, end)

    async def still_owner(self, owned: OwnedStream) -> None:
        """Before a Ready: this broker still holds the stream's lease. (A broker that was
        stopped or cut off past its session may not have noticed that another took the
        stream over; its dedup state would tell a producer a stale last sequence id.)"""
        if owned.gone is not None:
            raise owned.gone
        if not may_answer_ready(await self.broker.holds(owned.stream), gone=False):
            gone = NotOwnerError(f"this broker no longer owns {owned.stream!r}")
            self.broker.give_up(owned, gone)
            raise gone

    async def _take_sends(
        self,
        iterator: AsyncIterator[pb.ProduceRequest],
        owned: OwnedStream,
        session: Any,
        pending: asyncio.Queue[Any],
        held: HeldBytes,
    ) -> None:
        """Each request's entries: appended in order, and queued (bounded: a flood waits
        here, and its gRPC stream stops being read) for _settle to answer once durable
        (in order: one stream, in order). Their bytes count against the broker's
        publish buffer until then: while that is spent, producers wait here. An entry
        the broker refuses (too large, not the producer's batch) fails alone; a write
        that fails (fenced: the stream moved) ends the session with a retryable error
        and no receipt, so the client sends again, the same entries, to the next owner."""
        async for request in iterator:
            if request.WhichOneof("kind") != "entries":
                await pending.put(BadRequestError("a producer only sends entries"))
                return
            entries = request.entries.entries
            if len(entries) > MAX_ENTRIES_PER_REQUEST:
                await pending.put(BadRequestError(
                    f"at most {MAX_ENTRIES_PER_REQUEST} entries per request, got {len(entries)}"))  # fmt: skip
                return
            size = request.ByteSize()
            await held.take(size)
            outcomes: list[tuple[int, Any]] = []
            try:
                for send in entries:
                    # Producers flooding one stream wait here, and their gRPC streams
                    # stop being read: flow control pushes back on them.
                    await owned.room()
                    outcomes.append((send.last_sequence_id, self._publish(owned, session, send)))
            except Exception as error:  # (gone, fenced, or a fault: the session ends with it)
                await pending.put((outcomes, size))
                await pending.put(error)
                return
            await pending.put((outcomes, size))
        await pending.put(None)  # the client is done sending

    @staticmethod
    def _publish(owned: OwnedStream, session: Any, send: pb.EntrySend) -> Any:
        """The outcome of one entry: its write's future, a duplicate's position, or the
        error that refuses this entry alone (bad input)."""
        try:
            return owned.publish(session, send)
        except (BadRequestError, TooLargeError, MessageDecodeError) as error:
            return error

    async def _settle(
        self,
        pending: asyncio.Queue[Any],
        receipts: asyncio.Queue[pb.ProduceResponse | None],
        held: HeldBytes,
    ) -> None:
        """Answer each entry once durable, in the order sent: receipts, and a refused
        entry's failure between them where it came."""
        while (taken := await pending.get()) is not None:
            if isinstance(taken, BaseException):  # the session ends with it
                await receipts.put(pb.ProduceResponse(error=error_pb(taken)))
                break
            outcomes, size = taken
            batch = pb.ReceiptBatch()
            for sequence_id, outcome in outcomes:
                if isinstance(outcome, BaseException):
                    if batch.receipts:
                        await receipts.put(pb.ProduceResponse(receipts=batch))
                        batch = pb.ReceiptBatch()
                    failed = pb.SendFailed(sequence_ids=[sequence_id], error=error_pb(outcome))
                    await receipts.put(pb.ProduceResponse(failed=failed))
                    continue
                duplicate = not isinstance(outcome, asyncio.Future)
                try:
                    # (shielded: a session that ends must not cancel the write's future --
                    # the stream's dedup keeps it for a resend of the same message)
                    where = outcome if duplicate else await asyncio.shield(outcome)
                except Exception as error:  # the write failed: not this entry's fault
                    if batch.receipts:
                        await receipts.put(pb.ProduceResponse(receipts=batch))
                    gone = StreamGone(f"the stream's writer failed: {error}")
                    await receipts.put(pb.ProduceResponse(error=error_pb(gone)))
                    await receipts.put(None)
                    return
                batch.receipts.add(
                    sequence_id=sequence_id, message_id=id_pb(where), duplicate=duplicate
                )
            held.give_back(size)  # (settled: the writer holds none of it any more)
            if batch.receipts:
                await receipts.put(pb.ProduceResponse(receipts=batch))
        await receipts.put(None)

    # -- consuming ----------------------------------------------------------------------

    async def Consume(
        self, requests: AsyncIterator[pb.ConsumeRequest], context: Any
    ) -> AsyncIterator[pb.ConsumeResponse]:
        iterator = requests.__aiter__()
        opened = await _opening(iterator)  # (within OPEN_WITHIN_S, or the call ends)
        if not isinstance(opened, pb.ConsumerOpen):
            if opened is not None:
                yield pb.ConsumeResponse(error=error_pb(BadRequestError("open the consumer first")))
            return
        if opened.protocol_version < CONSUMER_PROTOCOL:
            yield pb.ConsumeResponse(
                error=error_pb(
                    BadRequestError(
                        "this broker delivers entries whole (consumer protocol "
                        f"{CONSUMER_PROTOCOL}); the client reads messages one by one: "
                        "upgrade it (brokers and clients together)"
                    )
                )
            )
            return
        subscription = opened.subscription or None  # (none: a reader)
        operation = Operation.READ if subscription is None else Operation.CONSUME
        try:
            caller = self._admit(context, operation, opened.stream, subscription)
        except Exception as error:
            yield pb.ConsumeResponse(error=error_pb(error))
            return
        try:
            serve = (
                self._read(opened, iterator)
                if subscription is None
                else self._consume(opened, iterator, caller, context)
            )
            async for response in serve:
                yield response
        finally:
            self.limits.give_back(caller)

    async def _consume(
        self,
        opened: pb.ConsumerOpen,
        iterator: AsyncIterator[pb.ConsumeRequest],
        caller: Caller,
        context: Any,
    ) -> AsyncIterator[pb.ConsumeResponse]:
        try:
            consumer_type = parse_consumer_type(opened.consumer_type or "exclusive", service=True)
            check_read_compacted(opened.read_compacted, consumer_type)
            kind = KINDS[consumer_type.value]
            if opened.initial_position not in ("", "latest", "earliest"):
                raise BadRequestError(
                    f"initial_position is latest or earliest: {opened.initial_position!r}"
                )
            # (A subscription does not create its stream: as in direct mode.)
            _not_partitioned(opened.stream, await self.exists(caller, opened.stream, False))
            owned = await self.broker.own(opened.stream)
            dispatcher, session = await owned.add_consumer(
                opened.subscription,
                kind,
                opened.consumer_name,
                opened.initial_position or "latest",
                _within(opened.negative_ack_redelivery_delay_ms or 1000, 0, 3_600_000),
                _within(opened.cursor_persist_interval_ms or 100, 10, 60_000),
                resume=opened.resume,
                principal=caller.principal,
                read_compacted=opened.read_compacted,
            )
            try:
                await self.still_owner(owned)
            except BaseException:
                await owned.remove_consumer(opened.subscription, dispatcher, session)
                raise
        except Exception as error:
            yield pb.ConsumeResponse(error=error_pb(error))
            return
        loop = asyncio.get_running_loop()

        async def take_requests() -> None:
            try:
                await serve_requests()
            except Exception as error:  # bad input (a malformed id, ...): the session ends
                session.outbox.put_nowait(error)

        async def serve_requests() -> None:
            async for request in iterator:
                which = request.WhichOneof("kind")
                if which == "flow":
                    dispatcher.flow(session.cid, request.flow.permits)
                elif which == "ack":
                    ack = request.ack
                    ids = [id_from_pb(i) for i in ack.ids]
                    if ack.cumulative:
                        if ids:
                            dispatcher.ack_cumulative(session.cid, max(ids))
                        continue
                    entries = _entry_acks(ack.entries, ids)
                    if ack.negative:
                        dispatcher.nack(session.cid, entries)
                    else:
                        dispatcher.ack(session.cid, entries)
                elif which in ("seek", "unsubscribe") and (
                    refused := self._refusal(context, opened.stream, opened.subscription)
                ):
                    session.outbox.put_nowait(Done(which, refused))  # (the session goes on)
                elif which == "seek":
                    seek = request.seek
                    target: MessageId | int = (
                        id_from_pb(seek.message_id)
                        if seek.WhichOneof("target") == "message_id"
                        else int(seek.timestamp_ms)
                    )
                    await owned.seek(opened.subscription, dispatcher, session.cid, target)
                elif which == "unsubscribe":
                    await owned.unsubscribe(opened.subscription, dispatcher, session.cid)
            session.outbox.put_nowait(closed)

        closed = StreamGone("the consumer closed")
        taker = loop.create_task(take_requests())
        try:
            yield pb.ConsumeResponse(ready=pb.ConsumerReady(active=session.active))
            active = session.active
            while True:
                item = await session.outbox.get()  # (no heartbeats: see _produce)
                if isinstance(item, BaseException):
                    if item is not closed:  # (the client half-closed: it reads no more)
                        yield pb.ConsumeResponse(error=error_pb(item))
                    return
                if isinstance(item, Done):
                    done = pb.Done(what=item.what)
                    if item.error is not None:
                        done.error.CopyFrom(error_pb(item.error))
                    yield pb.ConsumeResponse(done=done)
                    continue
                if session.active != active:
                    active = session.active
                    yield pb.ConsumeResponse(active=pb.ActiveChange(active=active))
                if item:
                    for chunk in entry_deliveries(item):
                        yield pb.ConsumeResponse(entries=chunk)
        finally:
            await _stop_then(
                [taker], lambda: owned.remove_consumer(opened.subscription, dispatcher, session)
            )

    async def _read(
        self, opened: pb.ConsumerOpen, iterator: AsyncIterator[pb.ConsumeRequest]
    ) -> AsyncIterator[pb.ConsumeResponse]:
        """A reader: non-durable, served by any broker (reading fences nothing)."""
        try:
            if opened.start_latest:
                start: MessageId | str = LATEST
            elif opened.HasField("start"):
                start = id_from_pb(opened.start)
            else:
                start = EARLIEST
            reader = await self.broker.client.create_reader(
                opened.stream, start, start_message_id_inclusive=opened.start_inclusive,
                read_compacted=opened.read_compacted,
            )  # fmt: skip
        except Exception as error:
            yield pb.ConsumeResponse(error=error_pb(error))
            return
        permits = 0
        given = asyncio.Event()

        async def take_requests() -> None:
            nonlocal permits
            async for request in iterator:
                if request.WhichOneof("kind") == "flow":
                    permits = min(permits + request.flow.permits, 1_000_000)
                    given.set()

        taker = asyncio.get_running_loop().create_task(take_requests())
        feed = reader._feed
        assert isinstance(feed, ScannerFeed)
        feed.keep_entries()
        try:
            yield pb.ConsumeResponse(ready=pb.ConsumerReady(active=True))
            # (No heartbeats, see _produce: a wait ends now and then only to notice a
            # client that half-closed.) Entries go whole, as stored: what is there now
            # while permits last, in one answer.
            while not taker.done():
                if permits <= 0:
                    given.clear()
                    with contextlib.suppress(builtins.TimeoutError):
                        await asyncio.wait_for(given.wait(), LOOK_AGAIN_S)
                    continue
                try:
                    entry = await feed.take_entry(timeout=LOOK_AGAIN_S)
                except builtins.TimeoutError:
                    continue
                handed = []
                while True:
                    indexes = list(range(entry.start, len(entry.payloads)))
                    handed.append(Handed(entry, indexes))
                    permits -= len(indexes)
                    if permits <= 0 or (entry := feed.take_entry_nowait()) is None:  # type: ignore[assignment]
                        break
                for chunk in entry_deliveries(handed):
                    yield pb.ConsumeResponse(entries=chunk)
        finally:
            await _stop_then([taker], reader.close)


async def _abort(context: Any, error: Exception) -> NoReturn:
    """End a unary call with the error, as the client reads it back: refusals are
    answered as such; anything else may pass (another broker, a later try)."""
    if isinstance(error, UnauthorizedError | BookieUnauthorized):
        code = grpc.StatusCode.PERMISSION_DENIED
    elif isinstance(error, BookieUnauthenticated):
        code = grpc.StatusCode.UNAUTHENTICATED
    elif isinstance(error, NoSuchStreamError):
        code = grpc.StatusCode.FAILED_PRECONDITION
    elif not is_retriable(error):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(error, StreamlibError | MetadataError):
        # A typed answer (the client raises it as its class, which says whether to try
        # again): another broker must not run the call a second time.
        code = grpc.StatusCode.FAILED_PRECONDITION
    else:
        code = grpc.StatusCode.UNAVAILABLE
    await context.abort(code, f"{error_pb(error).code}: {error}")
    raise AssertionError("unreachable")  # (abort raises)


def _within(value: int, low: int, high: int) -> int:
    """A client's setting that the subscription's other consumers live with too, kept
    within the broker's bounds (a cursor written never, or on every ack, is theirs too)."""
    return min(max(int(value), low), high)


def _not_partitioned(stream: str, partitions: int) -> None:
    """A partitioned stream is produced to and consumed partition by partition (the
    client does that); the whole would be a writer on every partition at once."""
    if partitions:
        raise BadRequestError(
            f"stream {stream!r} has {partitions} partitions: use them ({stream}-partition-N)"
        )


def _merged_receipts(
    response: pb.ProduceResponse,
    queue: asyncio.Queue[pb.ProduceResponse | None],
    held: list[pb.ProduceResponse | None],
) -> pb.ProduceResponse:
    """Receipts queued behind these, answered with them in one gRPC message: a broker
    busy enough that receipts queue up answers more of them per write, not one write per
    client request (one per message at a moderate rate), which cost more than the rest
    of a message's way through the broker. What is not receipts (an error, the end) is
    left in held, for the next turn."""
    if response.WhichOneof("kind") != "receipts":
        return response
    merged = response.receipts.receipts
    while len(merged) < MAX_RECEIPTS_PER_RESPONSE and not queue.empty():
        more = queue.get_nowait()
        if more is None or more.WhichOneof("kind") != "receipts":
            held.append(more)
            break
        merged.extend(more.receipts.receipts)
    return response


async def _stop_then(tasks: list[asyncio.Task[Any]], then: Callable[[], Awaitable[None]]) -> None:
    """The end of a session: cancel its tasks, wait for them, then `then` -- in a task
    of its own, to the end even if the RPC is cancelled meanwhile (grpc cancels the
    handler of a call its client cancelled, and the client cancels a call as soon as it
    has read the error that ended it). A consumer's session left in its dispatcher would
    be handed messages nobody reads."""

    async def run() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await then()

    await asyncio.shield(to_its_end(run(), "ending a session"))


async def _opening(iterator: AsyncIterator[Any]) -> Any:
    """The Open a producer's or consumer's call starts with; None if the call ended
    first or sent nothing within OPEN_WITHIN_S (a call that never opens holds no session,
    so no limit would count it), and False if it started with something else."""
    try:
        first = await asyncio.wait_for(iterator.__anext__(), OPEN_WITHIN_S)
    except (StopAsyncIteration, builtins.TimeoutError):
        return None
    return first.open if first.WhichOneof("kind") == "open" else False


def entry_deliveries(handed: list[Handed]) -> list[pb.EntryDeliveries]:
    """Entries handed to a consumer, as they are stored, in gRPC messages of about
    DELIVERY_BYTES each."""
    out: list[pb.EntryDeliveries] = []
    current = pb.EntryDeliveries()
    size = 0
    for one in handed:
        entry = one.entry
        stored = entry.stored()
        if size and size + len(stored) > DELIVERY_BYTES:
            out.append(current)
            current, size = pb.EntryDeliveries(), 0
        delivered = current.entries.add(
            ledger_id=entry.ledger_id,
            entry_id=entry.entry_id,
            entry=stored,
            redelivery_count=one.redeliveries,
        )
        if not one.whole:
            delivered.indexes.extend(one.indexes)
        size += len(stored) + 32
    if current.entries:
        out.append(current)
    return out


def _entry_acks(
    entries: Iterable[pb.EntryAck], ids: list[MessageId]
) -> list[tuple[int, int, Iterable[int]]]:
    """Individual acks by entry: as the client sends them, and any by message id."""
    out: list[tuple[int, int, Iterable[int]]] = [
        (e.ledger_id, e.entry_id, e.indexes) for e in entries
    ]
    by_entry: dict[tuple[int, int], list[int]] = {}
    for one in ids:
        by_entry.setdefault((one.ledger_id, one.entry_id), []).append(one.batch_index)
    out.extend((*where, indexes) for where, indexes in by_entry.items())
    return out


def server_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        # (A chunked message is delivered whole: up to 256 MiB in one message.)
        ("grpc.max_send_message_length", MAX_CHUNKED_MESSAGE_BYTES + (1 << 20)),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.http2.ping_timeout_ms", 5_000),  # (gRPC's default: 60 s; see client.py)
        ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
