"""Pulsar's binary protocol on a broker: the official Pulsar clients connect to
`streamlib broker --pulsar-port P` unmodified, over the same core as the gRPC front end
(streamlib/broker/server.py): ownership, deduplication, dispatch and the callers' roles.

One TCP connection carries a client's producers and consumers (ids the client picks),
as frames of BaseCommand (frames.py). What this module decides, and why:

- **Entries as Pulsar stores them.** A producer's SEND is its batch; the broker checks
  the frame's CRC32C and stores the headers-and-payload block as it came (magic and
  checksum included), as Pulsar's broker stores it in BookKeeper. streamlib's readers
  read that format too (entries.py), and entries streamlib's producers wrote are turned
  into Pulsar's on their way to a Pulsar consumer (once per entry).
- **Receipts in order, once durable**, per producer, as the gRPC front end does; a resend
  of a sequence id already stored is answered with where it went (Pulsar's dedup). A
  frame with a bad checksum is answered ChecksumError and stored nowhere.
- **Backpressure by not reading**: a producer's sends wait for room in the stream's
  writer and in the broker's publish buffer; meanwhile the connection is not read (as
  Pulsar's broker stops reading a connection with too many pending sends).
- **Consumers** are the dispatcher's sessions (permits count messages); the part of an
  entry that is a consumer's (a key-split entry, what is left of one to deliver again)
  goes as a batch of its own, one delivery of an entry out to it at a time. A seek
  disconnects the subscription's consumers (CloseConsumer), as Pulsar's broker does: the
  clients reconnect from there.
- **Readers** (non-durable subscriptions) read through any broker, as the gRPC ones.
- **Junk closes that connection only**: a frame over the cap, bytes that are no
  BaseCommand, a command before CONNECT. A client that stops answering pings is dropped.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from bookie.auth import Credentials
from bookie.errors import UnauthenticatedError as BookieUnauthenticated
from bookie.errors import UnauthorizedError as BookieUnauthorized
from bookie.tls import peer_common_name
from metadata.errors import InvalidNameError
from streamlib.broker.access import HeldBytes
from streamlib.broker.dispatcher import Handed, SubscriptionDispatcher
from streamlib.broker.owned import OwnedStream
from streamlib.broker.ownership import NotOwnerError
from streamlib.broker.server import KINDS, BrokerService, _not_partitioned
from streamlib.broker.sessions import ConsumerSession, Done, ProducerSession, StreamGone
from streamlib.closing import to_its_end
from streamlib.protocol.dispatch import Kind
from streamlib.protocol.errors import (
    BadRequestError,
    ConsumerBusyError,
    NoSuchStreamError,
    ProducerBusyError,
    ProducerFencedError,
    StreamlibError,
    TooLargeError,
    TooManySessionsError,
    UnauthorizedError,
    is_retriable,
)
from streamlib.protocol.service_access import Caller, Operation
from streamlib.pulsar import PulsarApi_pb2 as api
from streamlib.pulsar import frames, schemas
from streamlib.pulsar.entries import encode as encode_pulsar
from streamlib.pulsar.entries import is_pulsar_entry, parse, signed, to_pulsar
from streamlib.pulsar.topics import stream_of, topic_of
from streamlib.stream.batch import DecodedBatch, MessageDecodeError, decode_batch
from streamlib.stream.compacted import CompactedScanner, check_read_compacted
from streamlib.stream.message import EntryMessages
from streamlib.stream.positions import EARLIEST, LATEST, MessageId
from streamlib.stream.producer import MAX_ENTRY_BYTES
from streamlib.stream.reader import ScannerFeed
from streamlib.stream.subscription import parse_consumer_type

log = logging.getLogger(__name__)

Type = api.BaseCommand.Type
SERVER_VERSION = "streamlib"
# The newest protocol version this broker speaks (the client's, if older, is used).
PROTOCOL_VERSION = max(api.ProtocolVersion.values())
CONNECT_WITHIN_S = 10.0  # a connection's CONNECT comes within this, or it is closed
KEEPALIVE_S = 30.0  # idle this long: a PING; idle twice as long: the connection ends
MAX_CONNECTIONS = 10_000  # a broker's Pulsar connections at once (then one more is closed)
MAX_SESSIONS_PER_CONNECTION = 10_000  # producers and consumers of one connection
PENDING_SENDS = 1000  # a producer's sends not yet answered (then the connection waits)
WRITE_HIGH_WATER = 4 << 20  # bytes queued to a client before its deliveries wait
MAX_REQUESTS_IN_FLIGHT = 1000  # a connection's lookups, creations, seeks at once
MAX_DELIVERED_KEPT = 100_000  # entries a consumer's acks are read against, at most
WHOLE_ENTRY = 2**31  # a batch index past any entry's last
SOUGHT_KEPT_S = 60.0  # a reader's seek by time waits this long for it to subscribe again
MAX_SOUGHT = 10_000
# What a client may send in one message: an entry's limit, less what a client adds to a
# chunk's piece after it sized it by this (its chunk fields, its headers).
MAX_MESSAGE_BYTES = MAX_ENTRY_BYTES - 16 * 1024
LATEST_ID = (2**63 - 1, 2**63 - 1)  # pulsar-client's MessageId.latest
NONE_ID = (1 << 64) - 1  # -1 as a MessageIdData's uint64: no such message
ACCESS_MODES = {
    api.Shared: "shared",
    api.Exclusive: "exclusive",
    api.WaitForExclusive: "wait_for_exclusive",
    api.ExclusiveWithFencing: "exclusive_with_fencing",
}
SUB_TYPES = {
    api.CommandSubscribe.Exclusive: "exclusive",
    api.CommandSubscribe.Shared: "shared",
    api.CommandSubscribe.Failover: "failover",
    api.CommandSubscribe.Key_Shared: "key_shared",
}


class ConnectionClosed(Exception):
    """This connection ends (junk, a protocol violation, a dead peer)."""


def server_error(error: BaseException) -> int:
    """The ServerError a streamlib error is answered with (the client's retry rules
    follow it: ServiceNotReady and TooManyRequests are tried again)."""
    if isinstance(error, BookieUnauthenticated):
        return api.AuthenticationError
    if isinstance(error, UnauthorizedError | BookieUnauthorized):
        return api.AuthorizationError
    if isinstance(error, ConsumerBusyError):
        return api.ConsumerBusy
    if isinstance(error, ProducerBusyError):
        return api.ProducerFenced if getattr(error, "exclusive", False) else api.ProducerBusy
    if isinstance(error, ProducerFencedError):
        return api.ProducerFenced
    if isinstance(error, NoSuchStreamError):
        return api.TopicNotFound
    if isinstance(error, InvalidNameError):
        return api.InvalidTopicName
    if isinstance(error, schemas.IncompatibleSchemaError):
        return api.IncompatibleSchema
    if isinstance(error, TooManySessionsError):
        return api.TooManyRequests
    if isinstance(error, MessageDecodeError | BadRequestError | TooLargeError):
        return api.NotAllowedError
    if isinstance(error, StreamGone | NotOwnerError) or is_retriable(error):
        return api.ServiceNotReady
    if isinstance(error, StreamlibError):
        return api.UnknownError
    return api.ServiceNotReady


def _command(kind: int, field: str, **values: Any) -> api.BaseCommand:
    command = api.BaseCommand(type=kind)  # type: ignore[arg-type]
    getattr(command, field).SetInParent()
    for name, value in values.items():
        setattr(getattr(command, field), name, value)
    return command


class PulsarFrontEnd:
    """The Pulsar port(s) of one broker: `core` is its gRPC front end, whose checks
    (exists, still_owner, access, limits) both front ends share."""

    def __init__(self, core: BrokerService) -> None:
        self.core = core
        self.broker = core.broker
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[Any]] = set()
        # Readers' seeks by time, by subscription name, until it subscribes again.
        self._sought: dict[str, tuple[float, int]] = {}

    def sought(self, subscription: str, at_time: int) -> None:
        now = asyncio.get_running_loop().time()
        for name, (when, _) in list(self._sought.items()):
            if when < now - SOUGHT_KEPT_S or len(self._sought) >= MAX_SOUGHT:
                del self._sought[name]
        self._sought[subscription] = (now, at_time)

    def sought_time(self, subscription: str) -> int | None:
        """Where a reader of this subscription sought by time (None: it did not, lately)."""
        found = self._sought.pop(subscription, None)
        if found is None or found[0] < asyncio.get_running_loop().time() - SOUGHT_KEPT_S:
            return None
        return found[1]

    async def bind(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen (TLS with ssl_context: the pulsar+ssl:// port); the bound port."""
        server = await asyncio.start_server(self._serve, host, port, ssl=ssl_context, limit=1 << 16)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_CONNECTIONS:
            log.warning("pulsar port: %d connections, its limit: one more refused", MAX_CONNECTIONS)
            writer.close()
            return
        self._connections.add(task)
        connection = Connection(self, reader, writer)
        try:
            await connection.run()
        finally:
            self._connections.discard(task)

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()


class Connection:
    """One client's connection: its frames read in order, its producers and consumers."""

    def __init__(
        self, front: PulsarFrontEnd, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.front = front
        self.core = front.core
        self.broker = front.broker
        self.reader = reader
        self.writer = writer
        self.tls = writer.get_extra_info("ssl_object") is not None
        self.caller: Caller | None = None
        self.context = Credentials(None, None)  # its credentials, from its CONNECT
        self.producers: dict[int, _Producer] = {}
        self.consumers: dict[int, _Consumer | _Reader] = {}
        self._opening: set[tuple[str, int]] = set()  # producers and consumers being made
        self._abandoned: set[tuple[str, int]] = set()  # ... and closed by their client meanwhile
        self._requests: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._handlers: dict[int, Callable[[api.BaseCommand, frames.Frame], Any]] = {
            Type.PING: self._on_ping,
            Type.PONG: lambda command, frame: None,
            Type.LOOKUP: self._on_lookup,
            Type.PARTITIONED_METADATA: self._on_partitioned_metadata,
            Type.PRODUCER: self._on_producer,
            Type.SEND: self._on_send,
            Type.CLOSE_PRODUCER: self._on_close_producer,
            Type.SUBSCRIBE: self._on_subscribe,
            Type.FLOW: self._on_flow,
            Type.ACK: self._on_ack,
            Type.REDELIVER_UNACKNOWLEDGED_MESSAGES: self._on_redeliver,
            Type.CLOSE_CONSUMER: self._on_close_consumer,
            Type.UNSUBSCRIBE: self._on_unsubscribe,
            Type.SEEK: self._on_seek,
            Type.GET_LAST_MESSAGE_ID: self._on_last_message_id,
            Type.CONSUMER_STATS: self._on_consumer_stats,
            Type.GET_TOPICS_OF_NAMESPACE: self._on_topics_of_namespace,
            Type.GET_SCHEMA: self._on_get_schema,
            Type.GET_OR_CREATE_SCHEMA: self._on_get_or_create_schema,
        }

    # -- the connection -----------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._read_all()
        except (ConnectionClosed, frames.FrameError) as error:
            log.info("pulsar connection %s closed: %s", self._peer(), error)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        except Exception as error:  # (a fault of this broker's: this connection only ends)
            log.warning("pulsar connection %s failed: %r", self._peer(), error)
        finally:
            await to_its_end(self._close_all(), "closing a Pulsar connection")

    def _peer(self) -> str:
        return str(self.writer.get_extra_info("peername"))

    async def _read_all(self) -> None:
        decoder = frames.FrameDecoder()
        idle = 0
        while True:
            timeout = CONNECT_WITHIN_S if self.caller is None else KEEPALIVE_S
            try:
                data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
            except builtins.TimeoutError:
                if self.caller is None:
                    raise ConnectionClosed("no CONNECT in time") from None
                idle += 1
                if idle > 1:
                    raise ConnectionClosed("the client answers no ping") from None
                self._write(_command(Type.PING, "ping"))
                continue
            if not data:
                return
            idle = 0
            await self._drained()  # (a client that does not read its answers is not read)
            try:
                decoded = decoder.feed(data)
            except frames.FrameError as error:  # (what came whole before the junk counts)
                for frame in error.frames or ():
                    await self._handle(frame)
                raise
            for frame in decoded:
                await self._handle(frame)

    async def _handle(self, frame: frames.Frame) -> None:
        while len(self._requests) >= MAX_REQUESTS_IN_FLIGHT:  # (a flood of lookups, ...)
            await asyncio.wait(set(self._requests), return_when=asyncio.FIRST_COMPLETED)
        command = frame.command
        if self.caller is None:
            if command.type != Type.CONNECT:
                raise ConnectionClosed(f"{Type.Name(command.type)} before CONNECT")
            self._connect(command.connect)
            return
        handler = self._handlers.get(command.type)
        if handler is None:
            self._not_served(command)
            return
        result = handler(command, frame)
        if asyncio.iscoroutine(result):
            await result

    def _not_served(self, command: api.BaseCommand) -> None:
        """A command this broker does not serve (transactions, topic-list watchers, a
        second CONNECT, ...): a request is answered NotAllowedError, and the connection
        goes on; anything else ends it (a client that sends what only a broker sends)."""
        name = Type.Name(command.type)
        inner = frames.inner_command(command)
        request_id = getattr(inner, "request_id", None)
        if request_id is None or command.type in (Type.CONNECT, Type.CONNECTED):
            raise ConnectionClosed(f"{name} is not served here")
        self._error(request_id, BadRequestError(f"this broker does not serve {name}"))

    def _connect(self, connect: Any) -> None:
        token = None  # (a token only when the client says it is one: "token")
        if connect.auth_method_name == "token" and connect.auth_data:
            token = connect.auth_data.decode(errors="replace")
        self.context = context = Credentials(token, peer_common_name(self.writer))
        try:
            self.caller = self.core.access.caller(context)
        except BookieUnauthenticated as error:
            self._write(_command(Type.ERROR, "error", request_id=0,
                                 error=api.AuthenticationError, message=str(error)))  # fmt: skip
            raise ConnectionClosed(f"unauthenticated: {error}") from None
        self._write(
            _command(
                Type.CONNECTED,
                "connected",
                server_version=SERVER_VERSION,
                protocol_version=min(connect.protocol_version, PROTOCOL_VERSION),
                max_message_size=MAX_MESSAGE_BYTES,
            )
        )

    def _write(self, command: api.BaseCommand, payload: bytes | None = None) -> None:
        if self._closed:
            return
        if payload is None:
            self.writer.write(frames.encode_command(command))
        else:
            self.writer.write(frames.encode_with_headers(command, payload))

    async def _drained(self) -> None:
        """Wait while the client has not read what was written to it; a client that
        reads nothing for 2 x KEEPALIVE_S (stopped, cut off) loses its connection (and
        with it its seat in an exclusive or failover subscription, its unacked messages)."""
        transport = self.writer.transport
        if transport.get_write_buffer_size() > WRITE_HIGH_WATER and not self._closed:
            try:
                await asyncio.wait_for(self.writer.drain(), 2 * KEEPALIVE_S)
            except builtins.TimeoutError:
                transport.abort()
                raise ConnectionClosed("the client reads nothing") from None

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """A request answered in a task of its own (the next frames are read meanwhile;
        at most MAX_REQUESTS_IN_FLIGHT at once: then the reading waits, _handle)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    def _error(self, request_id: int, error: BaseException) -> None:
        self._write(_command(Type.ERROR, "error", request_id=request_id,
                             error=server_error(error), message=str(error) or type(error).__name__))  # fmt: skip

    def _success(self, request_id: int) -> None:
        self._write(_command(Type.SUCCESS, "success", request_id=request_id))

    async def _close_all(self) -> None:
        self._closed = True
        for task in list(self._requests):
            task.cancel()
        await asyncio.gather(*self._requests, return_exceptions=True)
        for producer in list(self.producers.values()):
            await producer.close()
        for consumer in list(self.consumers.values()):
            await consumer.close()
        self.producers.clear()
        self.consumers.clear()
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()

    def _check(self, operation: Operation, stream: str, subscription: str | None = None) -> None:
        # (Who calls, as of now: a token that expired since CONNECT is refused, and the
        # principal's roles and grants are read again, as the gRPC front end reads them
        # on every call.)
        self.caller = self.core.access.caller(self.context)
        self.core.access.check(self.caller, operation, stream, subscription)

    def _take_session(self, key: tuple[str, int]) -> None:
        """Count a producer or consumer (("producer" or "consumer", its id)) against the
        caller's and the connection's limits (give it back with _give_back_session)."""
        kind, some_id = key
        known = self.producers if kind == "producer" else self.consumers
        if key in self._opening or some_id in known:
            raise BadRequestError(f"{kind} id {some_id} is in use on this connection")
        if len(self.producers) + len(self.consumers) + len(self._opening) >= (
            MAX_SESSIONS_PER_CONNECTION
        ):
            raise TooManySessionsError(
                f"at most {MAX_SESSIONS_PER_CONNECTION} producers and consumers a connection"
            )
        assert self.caller is not None
        self.core.limits.take(self.caller)

    def _give_back_session(self) -> None:
        assert self.caller is not None
        self.core.limits.give_back(self.caller)

    # -- connection-level requests ------------------------------------------------------

    def _on_ping(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        self._write(_command(Type.PONG, "pong"))

    def _on_lookup(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        self._spawn(self._lookup(command.lookupTopic))

    async def _lookup(self, lookup: Any) -> None:
        answer = _command(Type.LOOKUP_RESPONSE, "lookupTopicResponse", request_id=lookup.request_id)
        response = answer.lookupTopicResponse
        try:
            stream = stream_of(lookup.topic)
            self._check(Operation.LOOKUP, stream)
            try:
                partitions = await self.core.exists(self._caller(), stream, create=False)
            except NoSuchStreamError:
                partitions = -1  # (a producer or consumer of it creates it: here)
            owner = self.broker.info if partitions else await self.broker.lookup(stream)
            url = owner.pulsar_url_tls if self.tls else owner.pulsar_url
            if not url:
                raise StreamGone(
                    f"the broker that owns {stream!r} ({owner.broker_id}) serves no Pulsar "
                    f"{'TLS ' if self.tls else ''}port"
                )
            response.response = api.CommandLookupTopicResponse.Connect
            response.brokerServiceUrl = owner.pulsar_url or url
            response.brokerServiceUrlTls = owner.pulsar_url_tls
            response.authoritative = True
        except Exception as error:
            response.response = api.CommandLookupTopicResponse.Failed
            response.error = server_error(error)  # type: ignore[assignment]
            response.message = str(error)
        self._write(answer)

    def _caller(self) -> Caller:
        assert self.caller is not None
        return self.caller

    def _on_partitioned_metadata(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        self._spawn(self._partitioned_metadata(command.partitionMetadata))

    async def _partitioned_metadata(self, request: Any) -> None:
        answer = _command(Type.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                          request_id=request.request_id)  # fmt: skip
        response = answer.partitionMetadataResponse
        try:
            stream = stream_of(request.topic)
            self._check(Operation.LOOKUP, stream)
            try:
                response.partitions = await self.core.exists(self._caller(), stream, create=False)
            except NoSuchStreamError:
                response.partitions = 0  # (not partitioned: its producer creates it)
            response.response = api.CommandPartitionedTopicMetadataResponse.Success
        except Exception as error:
            response.response = api.CommandPartitionedTopicMetadataResponse.Failed
            response.error = server_error(error)  # type: ignore[assignment]
            response.message = str(error)
        self._write(answer)

    def _on_topics_of_namespace(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        self._spawn(self._topics_of_namespace(command.getTopicsOfNamespace))

    async def _topics_of_namespace(self, request: Any) -> None:
        try:
            self._check(Operation.LOOKUP, "")
            namespace = request.namespace
            names = [topic_of(s) for s in await self.broker.client.streams.list()]
            prefix = f"persistent://{namespace}/"
            answer = _command(Type.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                              "getTopicsOfNamespaceResponse", request_id=request.request_id)  # fmt: skip
            answer.getTopicsOfNamespaceResponse.topics.extend(
                n for n in names if n.startswith(prefix)
            )
            self._write(answer)
        except Exception as error:
            self._error(request.request_id, error)

    def _on_get_schema(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        self._spawn(self._get_schema(command.getSchema))

    async def _get_schema(self, request: Any) -> None:
        answer = _command(Type.GET_SCHEMA_RESPONSE, "getSchemaResponse",
                          request_id=request.request_id)  # fmt: skip
        response = answer.getSchemaResponse
        try:
            stream = stream_of(request.topic)
            self._check(Operation.READ, stream)
            found = await schemas.kept(self.broker.client.streams, stream)
            if found is None:
                response.error_code = api.TopicNotFound
                response.error_message = f"stream {stream!r} keeps no Pulsar schema"
            else:
                response.schema.CopyFrom(found)
                response.schema_version = schemas.VERSION
        except Exception as error:
            response.error_code = server_error(error)  # type: ignore[assignment]
            response.error_message = str(error)
        self._write(answer)

    def _on_get_or_create_schema(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        self._spawn(self._get_or_create_schema(command.getOrCreateSchema))

    async def _get_or_create_schema(self, request: Any) -> None:
        answer = _command(Type.GET_OR_CREATE_SCHEMA_RESPONSE, "getOrCreateSchemaResponse",
                          request_id=request.request_id)  # fmt: skip
        response = answer.getOrCreateSchemaResponse
        try:
            stream = stream_of(request.topic)
            self._check(Operation.PRODUCE, stream)
            response.schema_version = await schemas.offer(
                self.broker.client.streams, stream, request.schema
            )
        except Exception as error:
            response.error_code = server_error(error)  # type: ignore[assignment]
            response.error_message = str(error)
        self._write(answer)

    # -- producers ----------------------------------------------------------------------

    def _on_producer(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.producer
        self._open(("producer", request.producer_id), request.request_id,
                   lambda: self._open_producer(request))  # fmt: skip

    def _open(
        self,
        key: tuple[str, int],
        request_id: int,
        make: Callable[[], Awaitable[_Session]],
    ) -> None:
        """Make a producer or consumer (("producer" or "consumer", its id)) in a task of
        its own: counted against the limits first, and answered -- its ready answer, or
        the error that refused it -- when made."""
        try:
            self._take_session(key)
        except Exception as error:
            self._error(request_id, error)
            return
        self._opening.add(key)

        async def run() -> None:
            try:
                session = await make()
            except BaseException as error:
                self._opening.discard(key)
                self._abandoned.discard(key)
                self._give_back_session()
                if isinstance(error, Exception):
                    self._error(request_id, error)
                raise_if_cancelled(error)
                return
            self._opening.discard(key)
            if self._closed or key in self._abandoned:  # (closed by its client meanwhile)
                self._abandoned.discard(key)
                await session.close()
                return
            known: dict[int, Any] = self.producers if key[0] == "producer" else self.consumers
            known[key[1]] = session
            session.ready(request_id)
            session.start()

        self._spawn(run())

    async def _open_producer(self, request: Any) -> _Producer:
        producer_id = request.producer_id
        stream = stream_of(request.topic)
        self._check(Operation.PRODUCE, stream)
        access_mode = ACCESS_MODES.get(request.producer_access_mode, "")
        name = request.producer_name if request.HasField("producer_name") else ""
        OwnedStream.check_producer(name, access_mode)
        _not_partitioned(stream, await self.core.exists(self._caller(), stream))
        owned = await self.broker.own(stream)
        version = b""
        if request.HasField("schema") and not schemas.is_bytes(request.schema):
            version = await schemas.offer(self.broker.client.streams, stream, request.schema)
        await owned.ensure_writer()  # (after the schema: a refused one fences nothing)
        if access_mode == "wait_for_exclusive" and owned.producers:
            # (Pulsar's answer while it waits: created, not ready.)
            self._write(_command(Type.PRODUCER_SUCCESS, "producer_success",
                                 request_id=request.request_id, producer_name=name,
                                 last_sequence_id=-1, producer_ready=False))  # fmt: skip
        # A name the broker gave before (not the user's): the same producer again,
        # after its connection broke.
        resume = bool(name) and not request.user_provided_producer_name
        session = await owned.add_producer(
            name, access_mode, resume=resume, principal=self._caller().principal
        )
        try:
            await self.core.still_owner(owned)
        except BaseException:
            await owned.remove_producer(session)
            raise
        return _Producer(self, producer_id, owned, session, version)

    async def _on_send(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        send = command.send
        producer = self.producers.get(send.producer_id)
        if producer is None:  # (closed since, by the broker or its client: as Pulsar's,
            return  # ignored -- pulsar-client drops the connection on a SendError)
        await producer.send(send, frame)

    def _on_close_producer(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.close_producer
        self._close(("producer", request.producer_id), request.request_id)

    def _close(self, key: tuple[str, int], request_id: int) -> None:
        """A client's close of its producer or consumer: answered once it is closed (one
        still being made is closed when it is)."""
        known: dict[int, Any] = self.producers if key[0] == "producer" else self.consumers
        session = known.pop(key[1], None)
        if key in self._opening:
            self._abandoned.add(key)

        async def close() -> None:
            if session is not None:
                await session.close()
            self._success(request_id)

        self._spawn(close())

    # -- consumers ----------------------------------------------------------------------

    def _on_subscribe(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.subscribe
        self._open(("consumer", request.consumer_id), request.request_id,
                   lambda: self._subscribe(request))  # fmt: skip

    async def _subscribe(self, request: Any) -> _Consumer | _Reader:
        stream = stream_of(request.topic)
        if request.durable:
            return await self._durable(stream, request)
        return await self._non_durable(stream, request)

    async def _durable(self, stream: str, request: Any) -> _Consumer:
        subscription = request.subscription
        self._check(Operation.CONSUME, stream, subscription)
        consumer_type = parse_consumer_type(SUB_TYPES[request.subType], service=True)
        check_read_compacted(request.read_compacted, consumer_type)
        kind = KINDS[consumer_type.value]
        # (Pulsar's clients subscribe before anything is produced: the topic is made,
        # where the cluster and the caller's roles allow it.)
        _not_partitioned(stream, await self.core.exists(self._caller(), stream))
        owned = await self.broker.own(stream)
        initial = (
            "earliest" if request.initialPosition == api.CommandSubscribe.Earliest else "latest"
        )
        dispatcher, session = await owned.add_consumer(
            subscription,
            kind,
            request.consumer_name,
            initial,
            0,  # (the client waits its own negative-ack delay, then asks)
            100,
            principal=self._caller().principal,
            read_compacted=request.read_compacted,
        )
        try:
            await self.core.still_owner(owned)
        except BaseException:
            await owned.remove_consumer(subscription, dispatcher, session)
            raise
        consumer = _Consumer(self, request.consumer_id, owned, subscription, dispatcher,
                             session, request.consumer_epoch)  # fmt: skip
        consumer.read_compacted = request.read_compacted
        return consumer

    async def _non_durable(self, stream: str, request: Any) -> _Reader:
        self._check(Operation.READ, stream)
        start: MessageId | str
        inclusive = False
        if request.HasField("start_message_id"):
            # (From that entry, whole, as Pulsar's broker starts a non-durable cursor: the
            # client drops what comes before its start, or at it when not inclusive.)
            start = _entry_of(request.start_message_id)
            inclusive = start not in (EARLIEST, LATEST)
        else:
            start = EARLIEST if request.initialPosition == api.CommandSubscribe.Earliest else LATEST
        at_time = self.front.sought_time(request.subscription)
        if at_time is not None:
            start, inclusive = EARLIEST, False
        reader = await self.broker.client.create_reader(
            stream, start, start_message_id_inclusive=inclusive,
            read_compacted=request.read_compacted,
        )  # fmt: skip
        try:
            if at_time is not None:
                await reader.seek(at_time)
        except BaseException:
            await reader.close()
            raise
        made = _Reader(self, request.consumer_id, reader, request.subscription)
        made.read_compacted = request.read_compacted
        return made

    def _consumer(self, consumer_id: int) -> _Consumer | _Reader | None:
        return self.consumers.get(consumer_id)

    def _on_flow(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        flow = command.flow
        consumer = self._consumer(flow.consumer_id)
        if consumer is not None:
            consumer.flow(flow.messagePermits)

    def _on_ack(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        ack = command.ack
        consumer = self._consumer(ack.consumer_id)
        if isinstance(consumer, _Consumer):
            consumer.ack(ack)
        if ack.HasField("request_id"):
            self._write(_command(Type.ACK_RESPONSE, "ackResponse",
                                 consumer_id=ack.consumer_id, request_id=ack.request_id))  # fmt: skip

    def _on_redeliver(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.redeliverUnacknowledgedMessages
        consumer = self._consumer(request.consumer_id)
        if isinstance(consumer, _Consumer):
            consumer.redeliver(request)

    def _on_close_consumer(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.close_consumer
        self._close(("consumer", request.consumer_id), request.request_id)

    def _on_unsubscribe(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.unsubscribe
        consumer = self._consumer(request.consumer_id)
        if not isinstance(consumer, _Consumer):
            self._error(request.request_id, BadRequestError("no such durable consumer"))
            return
        try:
            self._check(Operation.MANAGE_SUBSCRIPTION, consumer.owned.stream, consumer.subscription)
        except Exception as error:
            self._error(request.request_id, error)
            return
        consumer.asked["unsubscribe"] = request.request_id
        # (To its end even if the connection drops meanwhile: a cursor half moved, or a
        # dispatcher half stopped, would leave the subscription's other consumers waiting.)
        self._spawn(_to_its_end(consumer.owned.unsubscribe(
            consumer.subscription, consumer.dispatcher, consumer.session.cid), "an unsubscribe"))  # fmt: skip

    def _on_seek(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.seek
        consumer = self._consumer(request.consumer_id)
        if consumer is None:
            self._error(request.request_id, BadRequestError("no such consumer"))
            return
        target: MessageId | int
        if request.HasField("message_publish_time"):
            target = int(request.message_publish_time)
        elif request.HasField("message_id"):
            # (Pulsar resets the cursor to that entry; the client drops what is before.)
            target = _entry_of(request.message_id)
        else:
            self._error(request.request_id, BadRequestError("a seek names a message or a time"))
            return
        if isinstance(consumer, _Reader):
            # A reader starts again there: it is closed (its client reconnects from the
            # position it sought), then answered, in this order, as by Pulsar's broker.
            # A time is not in what the client subscribes with again: it is kept here,
            # for the subscription's next subscribe, as Pulsar keeps the cursor it reset.
            if isinstance(target, int):
                self.front.sought(consumer.subscription, target)
            consumer.end()
            self._success(request.request_id)
            return
        try:
            self._check(Operation.MANAGE_SUBSCRIPTION, consumer.owned.stream, consumer.subscription)
        except Exception as error:
            self._error(request.request_id, error)
            return
        consumer.asked["seek"] = request.request_id
        self._spawn(_to_its_end(consumer.owned.seek(
            consumer.subscription, consumer.dispatcher, consumer.session.cid, target), "a seek"))  # fmt: skip

    def _on_last_message_id(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.getLastMessageId
        consumer = self._consumer(request.consumer_id)
        if consumer is None:
            self._error(request.request_id, BadRequestError("no such consumer"))
            return
        self._spawn(self._last_message_id(request, consumer.stream, consumer.read_compacted))

    async def _last_message_id(self, request: Any, stream: str, read_compacted: bool) -> None:
        scanner = self.broker.client.scanner(stream, read_compacted)
        last: tuple[int, int, Any] | None
        try:
            last = await scanner.last_entry()
            index = -1 if last is None else last_index(last[2], f"entry {last[0]}:{last[1]}")
            if read_compacted and last is not None:
                # Before the horizon: the view's last (the stream's may be compacted out),
                # in a batch of streamlib's, so its index is its own.
                assert isinstance(scanner, CompactedScanner)
                view = await scanner.view()
                if view is not None and (last[0], last[1]) <= view.horizon[:2]:
                    in_view = await scanner.last_message()
                    last, index = (None, -1) if in_view is None else (in_view, in_view[2])
        except Exception as error:
            self._error(request.request_id, error)
            return
        answer = _command(Type.GET_LAST_MESSAGE_ID_RESPONSE, "getLastMessageIdResponse",
                          request_id=request.request_id)  # fmt: skip
        found = answer.getLastMessageIdResponse.last_message_id
        if last is None:
            found.ledgerId, found.entryId = NONE_ID, NONE_ID
        else:
            found.ledgerId, found.entryId = last[0], last[1]
            found.batch_index = index
        self._write(answer)

    def _on_consumer_stats(self, command: api.BaseCommand, frame: frames.Frame) -> None:
        request = command.consumerStats
        consumer = self._consumer(request.consumer_id)
        answer = _command(Type.CONSUMER_STATS_RESPONSE, "consumerStatsResponse",
                          request_id=request.request_id)  # fmt: skip
        stats = answer.consumerStatsResponse
        if consumer is None:
            stats.error_code = api.ConsumerNotFound
            stats.error_message = "no such consumer"
        else:
            stats.consumerName = consumer.name
            stats.type = consumer.type_name
        self._write(answer)


async def _to_its_end(work: Any, what: str) -> None:
    """Work that goes on to its end if the one waiting for it is cancelled (closing.py)."""
    await asyncio.shield(to_its_end(work, what))


def raise_if_cancelled(error: BaseException) -> None:
    if not isinstance(error, Exception):
        raise error


class _Session:
    """What a Pulsar producer, consumer and reader share: their tasks, how the broker
    ends one (its client is told -- CloseProducer, CloseConsumer -- and reconnects), and
    how one is closed, once (its tasks stopped, what it holds given back)."""

    kind = "producer"  # or "consumer": which of the connection's it is, and how it is closed
    read_compacted = False  # (a consumer or reader of the compacted view)

    def __init__(self, connection: Connection, session_id: int) -> None:
        self.connection = connection
        self.session_id = session_id
        self._tasks: list[asyncio.Task[Any]] = []
        self._ended = False
        self._closed = False

    def _run(self, coro: Any, what: str) -> None:
        """A task of this session's: one that fails (a read no bookie serves, ...) ends
        the session, and its client reconnects."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)

        def ended(done: asyncio.Task[Any]) -> None:
            if done.cancelled() or done.exception() is None:
                return
            log.warning("pulsar %s failed: %r", what, done.exception())
            self.end()

        task.add_done_callback(ended)

    def end(self, tell: bool = True) -> None:
        """The broker ends it (the stream moved, another fenced it, a seek): its client
        is told -- unless `tell` is False: it asked for the end (an unsubscribe) --
        and reconnects."""
        if self._ended:
            return
        self._ended = True
        connection = self.connection
        known: dict[int, Any] = (
            connection.producers if self.kind == "producer" else connection.consumers
        )
        if known.get(self.session_id) is self:  # (its client has not closed it)
            del known[self.session_id]
            if tell:
                connection._write(self._closing())
        asyncio.get_running_loop().create_task(self.close())

    def _closing(self) -> api.BaseCommand:
        if self.kind == "producer":
            return _command(Type.CLOSE_PRODUCER, "close_producer",
                            producer_id=self.session_id, request_id=0)  # fmt: skip
        return _command(Type.CLOSE_CONSUMER, "close_consumer",
                        consumer_id=self.session_id, request_id=0)  # fmt: skip

    async def close(self) -> None:
        """Stop: its tasks, then what it holds (_release), and its limits given back."""
        self._ended = True
        if self._closed:
            return
        self._closed = True
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        self._tasks = []

        async def run() -> None:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._release()
            self.connection._give_back_session()

        await asyncio.shield(to_its_end(run(), f"closing a Pulsar {self.kind}"))

    def ready(self, request_id: int) -> None:
        """Its client's request to make it is answered: made (a consumer's: Success)."""
        self.connection._success(request_id)

    def start(self) -> None:
        raise NotImplementedError

    async def _release(self) -> None:
        raise NotImplementedError


class _Producer(_Session):
    """A Pulsar producer: its sends appended in order, answered in order once durable."""

    def __init__(self, connection: Connection, producer_id: int, owned: Any,
                 session: ProducerSession, schema_version: bytes = b"") -> None:  # fmt: skip
        super().__init__(connection, producer_id)
        self.producer_id = producer_id
        self.owned = owned
        self.session = session
        self.schema_version = schema_version
        self.held = HeldBytes(connection.broker.publish_buffer)
        self._pending: asyncio.Queue[tuple[int, int, Any, int]] = asyncio.Queue(PENDING_SENDS)

    def ready(self, request_id: int) -> None:
        name = self.session.name
        self.connection._write(
            _command(
                Type.PRODUCER_SUCCESS,
                "producer_success",
                request_id=request_id,
                producer_name=name,
                last_sequence_id=self.owned.dedup.last(name),
                producer_ready=True,
                schema_version=self.schema_version,
            )
        )

    def start(self) -> None:
        self._run(self._settle(), f"producer {self.session.name}")
        self._run(self._fenced(), f"producer {self.session.name}")

    async def send(self, send: Any, frame: frames.Frame) -> None:
        """One SEND: checked, appended, and queued for _settle to answer in order (the
        connection's reading waits while PENDING_SENDS are unanswered, or for room in the
        stream's writer and the broker's publish buffer)."""
        if self._ended:
            return
        sequence_id = send.sequence_id
        messages = max(1, send.num_messages)
        # A batch's last sequence id: as the client states it, else the run's end.
        highest = (
            send.highest_sequence_id
            if send.highest_sequence_id > sequence_id
            else sequence_id + (0 if send.is_chunk else messages - 1)
        )
        block = frame.payload
        try:
            if block is None:
                raise frames.PayloadError("a SEND carries a message")
            checked = frame.checksum_ok()
            if checked is False:
                raise _ChecksumError()
            if checked is None:  # (an old client's frame: stored with its checksum added)
                block = frames.headers_and_payload(frame.metadata(), frame.payload_body())
            elif frame.broker_entry_metadata() is not None:
                raise frames.PayloadError("a SEND carries no broker entry metadata")
        except (frames.PayloadError, _ChecksumError) as refused:
            await self._put((sequence_id, highest, refused, 0))
            return
        size = len(block)
        await self.held.take(size)  # (ended meanwhile: given back, see HeldBytes)
        outcome: Any
        try:
            await self.owned.room()
            if self._ended:
                return
            entry = _EntrySend(block, sequence_id, highest, messages)
            outcome = self.owned.publish(self.session, entry)
        except (BadRequestError, TooLargeError, MessageDecodeError) as error:
            outcome = error
        except Exception as error:  # (gone, fenced: the producer is closed, it reconnects)
            outcome = StreamGone(str(error))
        await self._put((sequence_id, highest, outcome, size))

    async def _put(self, answer: tuple[int, int, Any, int]) -> None:
        """Queue an answer for _settle; none once the producer ended (close() empties
        the queue, so a put waiting on a full one goes on, and its bytes are given back
        with the rest)."""
        if not self._ended:
            await self._pending.put(answer)

    async def _settle(self) -> None:
        connection = self.connection
        while True:
            sequence_id, highest, outcome, size = await self._pending.get()
            if isinstance(outcome, asyncio.Future):
                try:
                    outcome = await asyncio.shield(outcome)  # (see server.py _settle)
                except Exception as failed:
                    outcome = StreamGone(f"the stream's writer failed: {failed}")
            self.held.give_back(size)
            if isinstance(outcome, StreamGone):
                self.end()
                return
            if isinstance(outcome, BaseException):
                # (ChecksumError whatever refused it: pulsar-client fails that message
                # alone on it, and drops the whole connection on any other code.)
                connection._write(_command(Type.SEND_ERROR, "send_error",
                                           producer_id=self.producer_id, sequence_id=sequence_id,
                                           error=api.ChecksumError,
                                           message=f"{type(outcome).__name__}: {outcome}"))  # fmt: skip
                continue
            receipt = _command(Type.SEND_RECEIPT, "send_receipt", producer_id=self.producer_id,
                               sequence_id=sequence_id, highest_sequence_id=highest)  # fmt: skip
            where = receipt.send_receipt.message_id
            if outcome == EARLIEST:  # (a duplicate too old to know where it went)
                where.ledgerId, where.entryId = NONE_ID, NONE_ID
            else:
                where.ledgerId, where.entryId = outcome.ledger_id, outcome.entry_id
            connection._write(receipt)

    async def _fenced(self) -> None:
        await self.session.fenced.wait()
        self.end()

    async def _release(self) -> None:
        while not self._pending.empty():  # (a send waiting to queue its answer goes on)
            self._pending.get_nowait()
        self.held.give_back_all()
        await self.owned.remove_producer(self.session)


class _ChecksumError(Exception):
    def __str__(self) -> str:
        return "the frame's checksum does not match its contents: nothing was stored"


@dataclass
class _EntrySend:
    """One SEND as the broker core takes an entry (streamlib/broker/owned.py)."""

    entry: bytes
    first_sequence_id: int
    last_sequence_id: int
    messages: int


class _Consumer(_Session):
    """A durable subscription's Pulsar consumer: a session of its dispatcher."""

    kind = "consumer"
    type_name = "consumer"

    def __init__(self, connection: Connection, consumer_id: int, owned: Any, subscription: str,
                 dispatcher: SubscriptionDispatcher, session: ConsumerSession,
                 epoch: int) -> None:  # fmt: skip
        super().__init__(connection, consumer_id)
        self.consumer_id = consumer_id
        self.owned = owned
        self.stream = owned.stream
        self.subscription = subscription
        self.dispatcher = dispatcher
        self.session = session
        self.name = session.name
        self.epoch = epoch
        self.asked: dict[str, int] = {}  # seek / unsubscribe: their request ids
        # What went to the client, by entry: (messages, the entry's indexes of them or
        # None: all) -- how its acks' batch indexes are read.
        self.delivered: dict[tuple[int, int], tuple[int, list[int] | None]] = {}
        # Parts of entries handed to it that wait for an earlier delivery's ack (_send).
        self._waiting: dict[tuple[int, int], list[Handed]] = {}

    def start(self) -> None:
        self._run(self._deliver(), f"consumer {self.name} of {self.subscription}")

    def flow(self, permits: int) -> None:
        self.dispatcher.flow(self.session.cid, min(max(permits, 0), 1_000_000))

    def ack(self, ack: Any) -> None:
        """The client's acks, read against what went to it (`delivered`): a whole
        delivery's ack is its messages; a batch-index ack is read only for a delivery of
        the whole entry (numbered as the entry is); anything else -- an ack of what is
        not out to this client now, a part's batch-index ack, which may be of an earlier
        delivery numbered otherwise -- is not read (the message comes again, or its
        whole ack follows)."""
        if ack.ack_type == api.CommandAck.Cumulative:
            for one in ack.message_id[-1:]:
                self._cumulative(one)
            return
        acks = []
        done = []
        for one in ack.message_id:
            where = (one.ledgerId, one.entryId)
            sent = self.delivered.get(where)
            if sent is None:
                continue
            count, originals = sent
            if _batch_indexed(one):
                if originals is not None:
                    continue
                if one.ack_set:  # (the bits still set are not acknowledged)
                    acks.append((*where, [i for i in range(count) if not _bit(one.ack_set, i)]))
                elif one.batch_index < count:
                    acks.append((*where, [one.batch_index]))
                continue
            del self.delivered[where]
            done.append(where)
            acks.append((*where, list(range(count)) if originals is None else originals))
        self.dispatcher.ack(self.session.cid, acks)
        for where in done:
            self._send_waiting(where)

    def _cumulative(self, one: Any) -> None:
        """Everything up to a message (of those this consumer holds, and not past a part
        of an entry that waits to go to it)."""
        where = (one.ledgerId, one.entryId)
        sent = self.delivered.get(where)
        upto = WHOLE_ENTRY
        if _batch_indexed(one):
            if sent is not None and sent[1] is None:  # (numbered as the entry is)
                if one.ack_set:  # (those before the first still set)
                    upto = next((i for i in range(sent[0]) if _bit(one.ack_set, i)), sent[0]) - 1
                else:
                    upto = one.batch_index
            else:
                upto = -1
        waiting = [w for w in self._waiting if w <= where]
        if waiting:
            where, upto = min(waiting), -1
        if upto < 0:  # (none of this entry: the ones before it)
            if where[1] == 0:
                return
            where, upto = (where[0], where[1] - 1), WHOLE_ENTRY
        for done in [w for w in self.delivered if w <= where]:
            del self.delivered[done]
        self.dispatcher.ack_cumulative(self.session.cid, MessageId(*where, upto))

    def redeliver(self, request: Any) -> None:
        """Pulsar's RedeliverUnacknowledgedMessages: those entries (none named: all this
        consumer holds, and what waits in its outbox unwritten) come again."""
        if request.HasField("consumer_epoch"):
            self.epoch = max(self.epoch, request.consumer_epoch)
        named = [(one.ledgerId, one.entryId) for one in request.message_ids]
        if not named:
            self._drop_unwritten()
            self.delivered.clear()
            self._waiting.clear()
            self.dispatcher.redeliver_now(self.session.cid, None)
            return
        for where in named:
            self.delivered.pop(where, None)
            self._waiting.pop(where, None)
        self.dispatcher.redeliver_now(self.session.cid, [(*w, None) for w in named])

    def _drop_unwritten(self) -> None:
        """Forget the deliveries in the outbox not written yet (the dispatcher takes them
        back with the rest: written too, they would go twice); keep what else waits."""
        outbox = self.session.outbox
        kept = []
        while not outbox.empty():
            item = outbox.get_nowait()
            if not isinstance(item, list):
                kept.append(item)
        for item in kept:
            outbox.put_nowait(item)

    def _send(self, handed: Handed) -> None:
        """One delivery to the client; a part of an entry that another delivery of it
        is still out for waits until that one is acknowledged (one delivery of an entry
        out at a time: the client acks an entry whole, by its id)."""
        entry = handed.entry
        where = (entry.ledger_id, entry.entry_id)
        if where in self.delivered:
            self._waiting.setdefault(where, []).append(handed)
            return
        self.connection._write(*message_frame(self.consumer_id, handed, self.epoch, self.delivered))

    def _send_waiting(self, where: tuple[int, int]) -> None:
        pieces = self._waiting.pop(where, None)
        if pieces:
            indexes = sorted({i for piece in pieces for i in piece.indexes})
            redeliveries = max(piece.redeliveries for piece in pieces)
            self._send(Handed(pieces[0].entry, indexes, redeliveries))

    async def _deliver(self) -> None:
        """Hand the client what the dispatcher hands this consumer; answer its seek and
        unsubscribe; close it when the broker ends the session."""
        connection = self.connection
        kind = self.session.kind
        active = None
        while True:
            item = await self.session.outbox.get()
            if isinstance(item, Done):
                request_id = self.asked.pop(item.what, None)
                if request_id is None:
                    continue
                if item.error is not None:
                    connection._error(request_id, item.error)
                    continue
                if item.what == "unsubscribe":  # (answered; it is gone: nothing to reconnect)
                    connection._success(request_id)
                    self.end(tell=False)
                    return
                # A seek: this consumer is closed first (its client reconnects, from the
                # position it sought), then answered -- in this order, as by Pulsar's
                # broker: the client takes a seek answered while it reconnects as its
                # new start.
                self.end()
                connection._success(request_id)
                return
            if isinstance(item, BaseException):
                self.end()
                return
            if kind is Kind.FAILOVER and self.session.active != active:
                active = self.session.active
                connection._write(_command(Type.ACTIVE_CONSUMER_CHANGE, "active_consumer_change",
                                           consumer_id=self.consumer_id, is_active=active))  # fmt: skip
            for handed in item:
                self._send(handed)
            await connection._drained()

    async def _release(self) -> None:
        await self.owned.remove_consumer(self.subscription, self.dispatcher, self.session)


class _Reader(_Session):
    """A non-durable subscription (pulsar-client's Reader): entries whole, as stored,
    while the client's permits last."""

    kind = "consumer"
    type_name = "reader"

    def __init__(
        self, connection: Connection, consumer_id: int, reader: Any, subscription: str
    ) -> None:
        super().__init__(connection, consumer_id)
        self.subscription = subscription
        self.consumer_id = consumer_id
        self.reader = reader
        self.stream = reader.stream
        self.name = f"reader-{consumer_id}"
        self.permits = 0
        self._given = asyncio.Event()

    def start(self) -> None:
        self._run(self._deliver(), f"reader of {self.stream}")

    def flow(self, permits: int) -> None:
        self.permits = min(self.permits + max(permits, 0), 1_000_000)
        self._given.set()

    async def _deliver(self) -> None:
        feed = self.reader._feed
        assert isinstance(feed, ScannerFeed)
        feed.keep_entries()
        connection = self.connection
        while True:
            if self.permits <= 0:
                self._given.clear()
                await self._given.wait()
                continue
            entry = await feed.take_entry(None)
            while True:
                # (Whole, from a seek by time too: Pulsar resets to an entry; a seek by id's
                # client drops what is before it. A compacted view's entry goes whole too,
                # its messages' indexes as the stream's, with an ack_set that has the
                # client skip the places kept before them.)
                indexes = list(range(len(entry.payloads)))
                skip = entry.start if entry.compacted else 0
                command, block = message_frame(self.consumer_id, Handed(entry, indexes), 0)
                if skip:
                    command.message.ack_set.extend(ack_set(skip, len(entry.payloads)))
                connection._write(command, block)
                self.permits -= len(indexes)
                if self.permits <= 0 or (entry := feed.take_entry_nowait()) is None:  # type: ignore[assignment]
                    break
            await connection._drained()

    async def _release(self) -> None:
        await self.reader.close()


def message_frame(
    consumer_id: int,
    handed: Handed,
    epoch: int,
    delivered: dict[tuple[int, int], Any] | None = None,
) -> tuple[api.BaseCommand, bytes]:
    """A MESSAGE of one entry as Pulsar's clients read it: the entry in Pulsar's format
    (made once per entry) or -- when only some of its messages are this consumer's (a
    key_shared split, what is left of a batch to deliver again) -- a batch of just those.
    (Not the whole entry with an ack_set: pulsar-client then skips the others, but, with
    its default configuration, never acknowledges the entry.) What went is kept in
    `delivered` (a consumer's; a reader's acks are not read), by entry: how many
    messages, and which of the entry's (None: all)."""
    entry = handed.entry
    where = (entry.ledger_id, entry.entry_id)
    sent: tuple[int, list[int] | None] = (len(handed.indexes), None)
    if handed.whole:
        block = pulsar_block(entry)
    else:
        try:
            block = partial_block(entry, handed.indexes)
            sent = (len(handed.indexes), list(handed.indexes))
        except MessageDecodeError as error:  # (encrypted: it goes whole, as it is)
            log.warning("entry %s:%s goes whole: %s", *where, error)
            block = pulsar_block(entry)
            sent = (len(entry.payloads), None)
    if delivered is not None:
        delivered[where] = sent
        if len(delivered) > MAX_DELIVERED_KEPT:  # (the oldest: long since acknowledged)
            del delivered[next(iter(delivered))]
    command = _command(Type.MESSAGE, "message", consumer_id=consumer_id,
                       redelivery_count=handed.redeliveries, consumer_epoch=epoch)  # fmt: skip
    message = command.message
    message.message_id.ledgerId = entry.ledger_id
    message.message_id.entryId = entry.entry_id
    message.message_id.partition = partition_index(entry.stream)
    return command, block


def partition_index(stream: str) -> int:
    """A partition's index in its partitioned topic (NAME-partition-I: I), -1 for a
    stream that is none: what Pulsar's broker puts in a MESSAGE's id, and its clients in
    the message's."""
    _, marker, index = stream.rpartition("-partition-")
    return int(index) if marker and index.isdigit() else -1


def partial_block(entry: EntryMessages, indexes: list[int]) -> bytes:
    """Some messages of an entry as a Pulsar batch of their own (numbered 0.. in it)."""
    where = f"entry {entry.ledger_id}:{entry.entry_id}"
    whole = decode_batch(entry.stored(), where)
    columns: dict[str, Any] = {
        name: value if value is None or name == "chunk" else [value[i] for i in indexes]
        for name, value in whole._asdict().items()
    }
    return encode_pulsar(DecodedBatch(**columns), where=where)


def last_index(entry: bytes, where: str) -> int:
    """The batch index of an entry's last message as Pulsar's clients number it: -1 for
    a Pulsar producer's lone message (not batched), else the batch's last."""
    if is_pulsar_entry(entry):
        metadata, _ = parse(entry, where, verify=False)
        if not metadata.HasField("num_messages_in_batch"):
            return -1
        return max(metadata.num_messages_in_batch - 1, 0)
    return max(len(decode_batch(entry, where, payloads=False).payloads) - 1, 0)


def pulsar_block(entry: EntryMessages) -> bytes:
    """The entry's headers and payload in Pulsar's format, made once and kept with it."""
    cached = entry.pulsar
    if cached is None:
        cached = entry.pulsar = to_pulsar(
            entry.stored(), f"entry {entry.ledger_id}:{entry.entry_id}"
        )
    return cached


def _entry_of(message_id: Any) -> MessageId:
    """Where a MessageIdData's entry starts, whole: EARLIEST or LATEST for
    pulsar-client's MessageId.earliest (-1, -1: uint64s on the wire) and .latest."""
    where = (signed(message_id.ledgerId), signed(message_id.entryId))
    if min(where) < 0:
        return EARLIEST
    if where == LATEST_ID:
        return LATEST
    return MessageId(*where, 0)


def _batch_indexed(one: Any) -> bool:
    """Whether an ack's MessageIdData names messages of its entry (a batch index, or an
    ack_set), not the entry whole."""
    return bool(one.ack_set) or (one.HasField("batch_index") and one.batch_index >= 0)


def ack_set(first: int, count: int) -> list[int]:
    """The words of a java.util.BitSet with bits first..count-1 set (a MESSAGE's ack_set:
    the messages of the batch the client delivers; the others it skips), as signed
    64-bit integers (the field is int64)."""
    words = []
    for base in range(0, count, 64):
        word = 0
        for bit in range(max(first, base), min(count, base + 64)):
            word |= 1 << (bit - base)
        words.append(word - (1 << 64) if word >= 1 << 63 else word)
    return words


def _bit(words: Any, index: int) -> bool:
    """Bit `index` of a java.util.BitSet's words (an ack's ack_set: set, not acknowledged)."""
    word = index // 64
    return word < len(words) and bool((words[word] >> (index % 64)) & 1)
