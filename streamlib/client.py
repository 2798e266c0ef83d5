"""The client: one metadata session, connections to bookies, and the APIs on top.

client = await streamlib.Client.connect("sqlite:///tmp/sandbox/meta.db")
writer = await client.ledgers.create(ensemble=3, write_quorum=2, ack_quorum=2)
await writer.append(b"hello")
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import metadata
from metadata.services.bookies import BookieRegistry
from metadata.services.ledger_ids import LedgerIdGenerator
from metadata.services.ledgers import LedgerMetadataManager
from metadata.services.streams import StreamRegistry
from streamlib.client_metrics import ClientParts
from streamlib.ledger.bookie_client import BookieClientConfig
from streamlib.ledger.driver import Context
from streamlib.ledger.manager import LedgerManager
from streamlib.ledger.placement import PlacementPolicy
from streamlib.ledger.pool import BookiePool
from streamlib.protocol.errors import BadRequestError
from streamlib.security import client_config
from streamlib.stream.ack_ranges import AckRanges
from streamlib.stream.admin import StreamManager, partition_name, partitions_of
from streamlib.stream.compacted import CompactedScanner, check_read_compacted
from streamlib.stream.consumer import Consumer, DeadLetterPolicy
from streamlib.stream.durable import DirectSubscription, ranges_from_state, ranges_to_state
from streamlib.stream.multi import subscribe_each
from streamlib.stream.partitioned import produce_each
from streamlib.stream.positions import EARLIEST, MessageId, parse_initial_position, parse_start
from streamlib.stream.producer import Producer, parse_access_mode
from streamlib.stream.reader import Message, Reader, ScannerFeed, StreamScanner
from streamlib.stream.subscription import (
    ConsumerType,
    SubscriptionGate,
    parse_consumer_type,
)
from streamlib.stream.writer import StreamWriter
from streamlib.tasks import HeldTasks


class Client(ClientParts):
    def __init__(
        self,
        store: metadata.MetadataStore,
        *,
        rack_aware: bool = False,
        bookie_config: BookieClientConfig | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token: str | None = None,
    ) -> None:
        bookie_config = client_config(
            bookie_config, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, token=token
        )
        super().__init__()
        self.store = store
        self.registry = BookieRegistry(store)
        self.pool = BookiePool(self.registry, bookie_config)
        self.context = Context(
            LedgerMetadataManager(store), self.pool, PlacementPolicy(rack_aware=rack_aware)
        )
        # Ids one at a time (one CAS each, and ledgers are created rarely) so they grow
        # in creation order across processes, as ZooKeeper sequential ids do. Stream
        # positions order by ledger id: a ledger enters a stream's list only if its id
        # was reserved after that list was read, so list order is id order.
        self.ledgers = LedgerManager(self.context, LedgerIdGenerator(store, batch_size=1))
        self.streams = StreamManager(StreamRegistry(store), self.ledgers)
        self._tasks = HeldTasks("client")  # retention after rolls (_spawn_trim)

    @classmethod
    async def connect(cls, uri: str, **options: Any) -> Client:
        """Connect to the metadata store at uri (zk://, sqlite://, memory://), or to the
        stream service's brokers (streamlib://HOST:PORT[,HOST:PORT...]: a
        streamlib.service.client.ServiceClient with the same producers, consumers and
        readers).

        Options: session_timeout_s, rack_aware, bookie_config (a BookieClientConfig),
        tls_ca / tls_cert / tls_key: PEM file paths to dial bookies over TLS (tls_ca) with
        a client certificate (tls_cert + tls_key, for bookies requiring mutual TLS), and
        token: a JWT naming this client's principal to bookies that authenticate. Not
        given, they default to $STREAMLIB_TLS_CA / $STREAMLIB_TLS_CERT / $STREAMLIB_TLS_KEY
        and $STREAMLIB_TOKEN (or the file $STREAMLIB_TOKEN_FILE names); see
        streamlib/security.py.
        """
        if uri.startswith("streamlib://"):  # the stream service (streamlib/service/)
            from streamlib.service.client import ServiceClient

            return await ServiceClient.connect(uri, **options)  # type: ignore[return-value]
        store_options = {k: options.pop(k) for k in ("session_timeout_s",) if k in options}
        store = await metadata.connect(uri, **store_options)
        try:
            return cls(store, **options)
        except BaseException:  # e.g. an unreadable TLS file: do not leave the session open
            await store.close()
            raise

    # -- pub/sub ------------------------------------------------------------------------

    async def create_producer(self, stream: str, **options: Any) -> Producer:
        """A producer on `stream` (created with defaults if missing). It is the stream's
        writer: it takes over (fencing the previous writer) before its first send.
        Options: batching_max_messages, batching_max_bytes, batching_max_publish_delay_ms,
        max_pending_messages, block_if_queue_full, batch_format (1 while readers older than
        format 2 remain; see streamlib.stream.batch), compression_type ("none", "lz4",
        "zlib", "zstd": per entry, format 3; upgrade readers first), chunking_enabled
        (messages over the 5 MiB entry limit go in pieces, format 4, up to 256 MiB),
        initial_sequence_id (default: the stream's last message's; each send gets the
        next, or the sequence_id it gives),
        schema (streamlib.schema: send() then takes its objects; checked against the
        stream's, IncompatibleSchemaError), producer_name (stored with each message),
        access_mode: a direct-mode producer is always "exclusive_with_fencing" (the other
        modes need the stream service: BadRequestError)."""
        access_mode = parse_access_mode(options.pop("access_mode", "exclusive_with_fencing"))
        if access_mode != "exclusive_with_fencing":
            raise BadRequestError(
                f"access_mode {access_mode!r} needs the stream service (streamlib://...); "
                "a direct-mode producer takes the stream over: 'exclusive_with_fencing'"
            )
        Producer.check_options(**options)
        partitions = partitions_of(await self.streams.ensure(stream))
        if partitions:  # one producer per partition, routed by key
            routed = await produce_each(
                stream, partitions, lambda name: self.create_producer(name, **options)
            )
            self._open.append(routed)
            return routed  # type: ignore[return-value]
        if options.get("schema") is not None:  # before taking the stream over
            await self.streams.use_schema(stream, options["schema"])
        writer = await self.take_over(stream)
        # Pulsar's: a new producer goes on after the stream's last sequence id, and a
        # resend of what it already holds is acknowledged, not stored again (read after
        # the takeover, so nothing can follow it any more).
        scanner = StreamScanner(self.ledgers, self.streams.registry, stream, EARLIEST)
        last, recent = await scanner.last_sent(options.get("producer_name") or "")
        if options.get("initial_sequence_id") is None:
            options["initial_sequence_id"] = last
        producer = Producer(writer, recent=recent, **options)
        self._open.append(producer)
        return producer

    async def take_over(self, stream: str, *, fail_stop: bool = False) -> StreamWriter:
        """The stream's writer, started: it fenced the previous one (a producer's, or a
        broker's for the stream service). fail_stop: it gives up at its first failed
        append, and nothing appended after that one is stored (a broker's: its producers
        resend by sequence id; see streamlib.protocol.stream_writer)."""
        writer = StreamWriter(
            self.ledgers,
            self.streams.registry,
            stream,
            on_roll=lambda: self._spawn_trim(stream),
            fail_stop=fail_stop,
        )
        await writer.start()
        return writer

    def _spawn_trim(self, stream: str) -> None:
        # A failed trim is logged (HeldTasks); the next roll tries again.
        self._tasks.spawn(self.streams.trim(stream), name=f"trim {stream!r}")

    async def subscribe(
        self,
        stream: str | Sequence[str],
        subscription: str,
        initial_position: Any = "latest",
        *,
        receiver_queue_size: int = 1000,
        ack_timeout_ms: int = 0,
        negative_ack_redelivery_delay_ms: int = 1000,
        cursor_persist_interval_ms: int = 100,
        consumer_type: ConsumerType | str = ConsumerType.Exclusive,
        consumer_name: str | None = None,
        dead_letter_policy: DeadLetterPolicy | None = None,
        message_listener: Callable[[Consumer, Message], object] | None = None,
        schema: Any = None,
        read_compacted: bool = False,
    ) -> Consumer:
        """A durable subscription. A new one starts at the `initial_position`
        ("latest" or "earliest"); an existing one resumes from its cursor. Given a list
        of streams: one consumer of the subscription on each, received from as one
        (streamlib.stream.multi.MultiStreamConsumer).

        consumer_type (streamlib.ConsumerType or its name, Pulsar's spellings too):
        "exclusive" (the default: a second consumer gets ConsumerBusyError) or
        "failover" (the first receives, the others wait in line and take over from the
        durable cursor when it closes or its metadata session ends); "shared" and
        "key_shared" need the stream service (UnsupportedConsumerTypeError). See
        streamlib/stream/subscription.py.

        dead_letter_policy: DeadLetterPolicy(max_redeliver_count, dead_letter_topic=None)
        sends a message delivered again too often to a dead-letter stream instead.
        message_listener(consumer, message) is called for each message on the loop (a
        coroutine function is awaited) instead of calling receive(). schema (see
        streamlib.schema): what message.value() decodes with. read_compacted: read the
        stream's compacted view up to its horizon, then the stream (exclusive and
        failover subscriptions, as Pulsar's; streamlib/stream/compacted.py)."""
        initial_position = parse_initial_position(initial_position)
        check_read_compacted(read_compacted, consumer_type)
        # (a missing stream, a bad name: NoSuchStreamError / InvalidNameError first)
        if isinstance(stream, str) and (
            count := partitions_of((await self.streams.read(stream))[0])
        ):
            stream = [partition_name(stream, i) for i in range(count)]
        if not isinstance(stream, str):  # several streams, one subscription
            if message_listener is not None:
                raise BadRequestError("a message listener takes one stream per consumer")
            multi = await subscribe_each(
                stream,
                lambda name: self.subscribe(
                    name,
                    subscription,
                    initial_position,
                    receiver_queue_size=receiver_queue_size,
                    ack_timeout_ms=ack_timeout_ms,
                    negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                    cursor_persist_interval_ms=cursor_persist_interval_ms,
                    consumer_type=consumer_type,
                    consumer_name=consumer_name,
                    dead_letter_policy=dead_letter_policy,
                    schema=schema,
                    read_compacted=read_compacted,
                ),
            )
            self._open.append(multi)  # closed first: its receives in flight end cleanly
            return multi  # type: ignore[return-value]
        kind = parse_consumer_type(consumer_type)
        registry = self.streams.registry
        gate = SubscriptionGate(
            self.store,
            registry.subscribers_path(stream, subscription),
            kind,
            consumer_name or f"consumer-{uuid.uuid4().hex[:8]}",
        )
        await gate.enter()
        try:
            scanner = self.scanner(stream, read_compacted)
            stored = await registry.read_cursor(stream, subscription)
            if stored is None:
                start = EARLIEST if initial_position == "earliest" else await scanner.end_position()
                acks = AckRanges(start)
                state = ranges_to_state(acks, read_compacted=read_compacted)
                version = await registry.write_cursor(stream, subscription, state)
                await registry.cursor_moved_back(stream)  # retention must now see this cursor
            else:
                acks, version = ranges_from_state(stored[0]), stored[1]
                if stored[0].read_compacted != read_compacted:
                    # Read otherwise from now: retention must see it so (a consumer that
                    # reads uncompacted needs the ledgers below the horizon again).
                    state = ranges_to_state(acks, read_compacted=read_compacted)
                    version = await registry.write_cursor(stream, subscription, state, version)
                    await registry.cursor_moved_back(stream)
            consumer = Consumer(
                DirectSubscription(
                    scanner,
                    registry,
                    subscription,
                    acks,
                    version,
                    receiver_queue_size=receiver_queue_size,
                    cursor_persist_interval_ms=cursor_persist_interval_ms,
                    gate=gate,
                    schema=schema,
                ),
                ack_timeout_ms=ack_timeout_ms,
                negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                dead_letter_policy=dead_letter_policy,
                producer_factory=self.create_producer,
            )
        except BaseException:
            await asyncio.shield(gate.leave())
            raise
        return self._keep(consumer, message_listener)  # type: ignore[no-any-return]

    async def create_reader(
        self,
        stream: str,
        start: MessageId | str = EARLIEST,
        *,
        receiver_queue_size: int = 1000,
        start_message_id_inclusive: bool = False,
        schema: Any = None,
        read_compacted: bool = False,
    ) -> Reader:
        """A non-durable reader from `start` (EARLIEST, LATEST or a MessageId: reading
        begins with the message after it, or with it when start_message_id_inclusive --
        LATEST inclusive reads the last message first -- as Pulsar's readers).
        read_compacted: the stream's compacted view up to its horizon, then the stream
        (each key once, at its latest, then every update; streamlib/stream/compacted.py)."""
        begin = parse_start(start)  # bad input first, before any lookup
        check_read_compacted(read_compacted)
        partitions = await self.streams.partitions(stream)
        scanner = self.scanner(stream, read_compacted)
        feed = ScannerFeed(scanner, receiver_queue_size, schema)
        return await self._reader(stream, partitions, feed, begin, start_message_id_inclusive)

    def scanner(self, stream: str, read_compacted: bool = False) -> StreamScanner:
        """A scanner of the stream (compacted: a CompactedScanner) from its start."""
        kind = CompactedScanner if read_compacted else StreamScanner
        return kind(self.ledgers, self.streams.registry, stream, EARLIEST)

    async def close(self) -> None:
        await self._close_parts()
        await self._tasks.close()
        await self.pool.close()
        await self.store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
