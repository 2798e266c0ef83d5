"""The client of the stream service: ``streamlib.connect("streamlib://HOST:PORT,...")``.

The same Producer / Consumer / Reader as direct mode -- the same classes
(streamlib/stream/producer.py, consumer.py, reader.py) -- over a broker connection
instead of the ledgers: a producer's entries go to the stream's owner
(appender.py), a consumer's messages come from it (subscription.py), a reader's from
any broker. Each looks its stream up, holds one gRPC call to its broker and, when that
breaks, looks the stream up again and reconnects on its own (connection.py).
``client.streams`` asks a broker for the streams' administration (admin.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from streamlib.client_metrics import ClientParts
from streamlib.protocol.errors import BadRequestError
from streamlib.service.admin import ServiceStreams
from streamlib.service.appender import ServiceAppender
from streamlib.service.connection import Brokers
from streamlib.service.subscription import ServiceFeed, ServiceSubscription
from streamlib.stream.admin import partition_name
from streamlib.stream.compacted import check_read_compacted
from streamlib.stream.consumer import Consumer, DeadLetterPolicy
from streamlib.stream.multi import subscribe_each
from streamlib.stream.partitioned import produce_each
from streamlib.stream.positions import EARLIEST, MessageId, parse_initial_position, parse_start
from streamlib.stream.producer import Producer, parse_access_mode
from streamlib.stream.reader import Message, Reader
from streamlib.stream.subscription import parse_consumer_type
from streamlib.wire import broker_pb2 as pb


class ServiceClient(ClientParts):
    """Producers, consumers and readers through the brokers (see the module doc)."""

    def __init__(self, brokers: Brokers) -> None:
        super().__init__()
        self.brokers = brokers
        self.uri = brokers.uri
        self.streams = ServiceStreams(brokers)
        self.closed = False

    @classmethod
    async def connect(
        cls,
        uri: str,
        *,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token: str | None = None,
        **_ignored: Any,
    ) -> ServiceClient:
        """A client of the brokers at uri (streamlib://HOST:PORT[,HOST:PORT...]): TLS to
        them with tls_ca (and tls_cert + tls_key for mutual TLS), token naming this
        client's principal; not given, $STREAMLIB_TLS_* and $STREAMLIB_TOKEN as in
        direct mode (streamlib/security.py). Other options (session_timeout_s,
        bookie_config, ...) are direct mode's and are not used."""
        from streamlib.security import client_config

        config = client_config(None, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, token=token)
        brokers = Brokers(
            uri,
            config.channel_credentials(),
            config.token,
            tls_files=(config.tls_ca, config.tls_cert),
        )
        try:
            await brokers.lookup_any()  # fail now when no broker answers
        except BaseException:
            await brokers.close()
            raise
        return cls(brokers)

    async def lookup(self, stream: str, create: bool = False) -> str:
        """The address of the broker serving `stream` (assigned one if none does);
        NoSuchStreamError if it does not exist, unless `create` (as a producer's lookup)
        and the cluster and this client's roles allow."""
        return await self.brokers.lookup(stream, create)

    async def partitions(self, stream: str, create: bool = False) -> int:
        """How many partitions `stream` has (0: not partitioned); NoSuchStreamError if it
        does not exist, unless `create` (a producer's) and the cluster allows."""
        return int((await self.brokers.lookup_answer(stream, create)).partitions)

    async def _located(self, stream: str, create: bool = False) -> tuple[int, str]:
        """`stream`'s partitions, and (not partitioned) the broker serving it: one lookup
        for both, as the first connection of its producer or consumer dials that broker
        (Session.first_address) instead of asking again."""
        answer = await self.brokers.lookup_answer(stream, create)
        return int(answer.partitions), str(answer.address)

    # -- the API ------------------------------------------------------------------------

    async def create_producer(
        self,
        stream: str,
        *,
        producer_name: str | None = None,
        access_mode: Any = "shared",
        schema: Any = None,
        initial_sequence_id: int | None = None,
        **options: Any,
    ) -> Producer:
        """A producer through the owning broker, with direct mode's options (batching,
        compression, chunking, schema, ...: see Client.create_producer). access_mode:
        "shared" (default: many producers), "exclusive" (ProducerBusyError while others
        publish), "exclusive_with_fencing" (the others get ProducerFencedError),
        "wait_for_exclusive" (waits for the others to go)."""
        Producer.check_options(schema=schema, initial_sequence_id=initial_sequence_id, **options)
        access_mode = parse_access_mode(access_mode)
        if options.get("chunking_enabled") and access_mode == "shared":
            # (Readers put a message's pieces together only when nothing comes between
            # them: a shared stream interleaves producers' entries.)
            raise BadRequestError(
                "chunking_enabled needs a producer that is the stream's only one through "
                "the stream service: access_mode 'exclusive', 'exclusive_with_fencing' or "
                "'wait_for_exclusive' (a direct-mode producer always is)"
            )
        if options.get("batch_format") == 1:
            raise BadRequestError(
                "batch_format 1 is for readers older than format 2 in direct mode: entries "
                "through the stream service carry their producer's name (format 2 on)"
            )
        count, owner = await self._located(stream, create=True)
        if count:  # one per partition, by key
            routed = await produce_each(
                stream,
                count,
                lambda name: self.create_producer(
                    name,
                    producer_name=producer_name,
                    access_mode=access_mode,
                    schema=schema,
                    initial_sequence_id=initial_sequence_id,
                    **options,
                ),
            )
            self._open.append(routed)
            return routed  # type: ignore[return-value]
        appender = ServiceAppender(self.brokers, stream, producer_name or "", access_mode, schema)
        appender.first_address = owner
        await appender.start()
        last = appender.last_sequence_id
        producer = Producer(
            appender,
            producer_name=appender.producer_name,
            recent=appender.recent,
            schema=schema,
            initial_sequence_id=last
            if initial_sequence_id is None
            else max(initial_sequence_id, last),
            **options,
        )
        self._open.append(producer)
        return producer

    async def subscribe(
        self,
        stream: str | list[str],
        subscription: str,
        initial_position: Any = "latest",
        *,
        consumer_type: Any = "exclusive",
        consumer_name: str | None = None,
        receiver_queue_size: int = 1000,
        negative_ack_redelivery_delay_ms: int = 1000,
        schema: Any = None,
        message_listener: Callable[..., object] | None = None,
        dead_letter_policy: DeadLetterPolicy | None = None,
        ack_timeout_ms: int = 0,
        cursor_persist_interval_ms: int = 100,
        read_compacted: bool = False,
    ) -> Consumer:
        """A consumer of a durable subscription through its stream's owner:
        consumer_type "exclusive", "failover", "shared" or "key_shared". The broker
        keeps the cursor, written every cursor_persist_interval_ms (the first consumer
        of the subscription on its broker says how often, and whether it reads
        compacted: read_compacted, as direct mode's)."""
        position = parse_initial_position(initial_position)
        kind = parse_consumer_type(consumer_type, service=True)
        check_read_compacted(read_compacted, kind)
        owner = ""
        if isinstance(stream, str):
            count, owner = await self._located(stream)
            if count:
                stream = [partition_name(stream, i) for i in range(count)]
        if not isinstance(stream, str):  # several streams, one subscription
            if message_listener is not None:
                raise BadRequestError("a message listener takes one stream per consumer")
            multi = await subscribe_each(
                stream,
                lambda name: self.subscribe(
                    name,
                    subscription,
                    position,
                    consumer_type=consumer_type,
                    consumer_name=consumer_name,
                    receiver_queue_size=receiver_queue_size,
                    negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                    schema=schema,
                    dead_letter_policy=dead_letter_policy,
                    ack_timeout_ms=ack_timeout_ms,
                    cursor_persist_interval_ms=cursor_persist_interval_ms,
                    read_compacted=read_compacted,
                ),
            )
            self._open.append(multi)
            return multi  # type: ignore[return-value]
        opened = pb.ConsumerOpen(
            stream=stream,
            subscription=subscription,
            consumer_type=kind.value,
            # (named, so a reconnect can take its own old session's place)
            consumer_name=consumer_name or f"consumer-{uuid.uuid4().hex[:10]}",
            initial_position=position,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            cursor_persist_interval_ms=cursor_persist_interval_ms,
            read_compacted=read_compacted,
        )
        source = ServiceSubscription(self.brokers, opened, receiver_queue_size, schema)
        source.first_address = owner
        consumer = Consumer(
            source,
            ack_timeout_ms=ack_timeout_ms,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            dead_letter_policy=dead_letter_policy,
            producer_factory=self.create_producer,
        )
        await source.start()
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
        """A non-durable reader through any broker (readers fence nothing);
        read_compacted as direct mode's."""
        begin = parse_start(start)
        check_read_compacted(read_compacted)
        partitions = await self.partitions(stream)
        feed = ServiceFeed(self.brokers, stream, receiver_queue_size, schema, read_compacted)
        return await self._reader(stream, partitions, feed, begin, start_message_id_inclusive)

    async def close(self) -> None:
        self.closed = True
        await self._close_parts()
        await self.brokers.close()

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def unload(address: str, stream: str, **options: Any) -> bool:
    """Ask the broker at address to give up `stream` (admin; options: tls_ca, token, ...
    as ServiceClient.connect)."""
    client = await ServiceClient.connect(f"streamlib://{address}", **options)
    try:
        brokers = client.brokers
        answer = await brokers.ask(
            lambda stub: stub.Unload(
                pb.UnloadRequest(stream=stream), timeout=30, metadata=brokers.metadata
            )
        )
    finally:
        await client.close()
    return bool(answer.unloaded)


__all__ = ["Message", "ServiceClient", "unload"]
