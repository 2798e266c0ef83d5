"""The blocking API, for scripts, notebooks and Spark workers: real classes over the
asyncio client, shaped like pulsar-client's.

    client = streamlib.connect("sqlite:///tmp/sandbox/meta.db")
    with client.create_producer("orders") as producer:
        producer.send(b"hello")
        producer.send_async(b"more", callback=lambda error, msg_id: print(error, msg_id))
    with client.subscribe("orders", "billing", initial_position="earliest") as consumer:
        for message in consumer:          # blocks for each next message
            consumer.acknowledge(message)
    client.close()

One event loop runs in a daemon thread per connected client; each blocking call hands
its coroutine to that loop once and waits for the answer. A wait can be interrupted
with Ctrl-C (KeyboardInterrupt; the call is cancelled on the loop). After close() every
call raises ClientClosedError. The ledger and stream-admin APIs (client.ledgers,
client.streams) are the asyncio objects behind a generic blocking proxy (SyncProxy).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import datetime as dt
import functools
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

from streamlib.protocol.errors import BadRequestError, ClientClosedError
from streamlib.schema import Schema
from streamlib.stream import consumer as aconsumer
from streamlib.stream import producer as aproducer
from streamlib.stream import reader as areader
from streamlib.stream.batch import Compression
from streamlib.stream.consumer import DeadLetterPolicy
from streamlib.stream.positions import EARLIEST, MessageId
from streamlib.stream.reader import Message
from streamlib.stream.subscription import ConsumerType

T = TypeVar("T")
log = logging.getLogger(__name__)

# How often a blocked caller's thread wakes to let Python run signal handlers (Ctrl-C);
# the answer itself is taken the moment it arrives.
_INTERRUPT_CHECK_S = 0.2

SendCallback = Callable[[BaseException | None, MessageId | None], None]
# A message handed over by send_async: what the loop queues, and whom it tells.
_Outgoing = tuple[
    aproducer.Checked, int | None, concurrent.futures.Future[MessageId], SendCallback | None
]


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="streamlib-loop", daemon=True
        )
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self.closed:
            coro.close()
            raise ClientClosedError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run coro on the loop and wait for it; Ctrl-C cancels it there."""
        return wait(self.submit(coro))

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a plain function on the loop thread (it may use the running loop)."""

        async def on_loop() -> T:
            return fn(*args, **kwargs)

        return self.run(on_loop())

    def stop(self) -> None:
        self.closed = True
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class _HandOver(Generic[T]):
    """Items handed from callers' threads to the client's loop, in order: one hop to the
    loop for however many gather meanwhile. The hop is scheduled under the lock, so a
    caller of any thread that finds it scheduled, then makes a call of its own (flush,
    seek, close), finds the hop on the loop ahead of that call."""

    def __init__(self, runner: _LoopThread, apply: Callable[[list[T]], None]) -> None:
        self._runner = runner
        self._apply = apply  # (on the loop: the items since the last hop)
        self._items: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def put(self, item: T) -> None:
        """Hand item over; ClientClosedError, the item not taken, once the client closed."""
        with self._lock:
            if self._runner.closed:
                raise ClientClosedError("the client is closed")
            self._items.append(item)
            if not self._scheduled:
                try:
                    self._runner.loop.call_soon_threadsafe(self._run)
                except RuntimeError:  # the loop closed under us (client.close elsewhere)
                    self._items.clear()
                    raise ClientClosedError("the client is closed") from None
                self._scheduled = True

    def _run(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
        self._apply(items)


def wait(future: concurrent.futures.Future[T]) -> T:
    """The future's result, waking now and then so Ctrl-C is handled; an interrupted
    wait cancels the future (and so the coroutine on the loop)."""
    try:
        while True:
            try:
                return future.result(timeout=_INTERRUPT_CHECK_S)
            except concurrent.futures.TimeoutError:
                if future.done():  # the coroutine itself raised a TimeoutError
                    return future.result()
    except KeyboardInterrupt:
        future.cancel()
        raise


class Producer:
    """Sends messages to one stream; the stream's only writer while it lives (creating
    it fenced the previous one). Messages are batched adaptively: one goes at once when
    nothing is in flight, the rest gather while entries are in flight."""

    def __init__(self, target: aproducer.Producer, runner: _LoopThread) -> None:
        self._target = target
        self._runner = runner
        self.stream: str = target.stream
        # The caller-side bound on messages waiting for acknowledgement, so a loop of
        # send_async never hops to the loop to learn there is room.
        self._room = threading.BoundedSemaphore(target.max_pending_messages)
        self._block = target.block_if_queue_full
        self._chunking = target.chunking_enabled
        self._schema = target.schema
        # Messages handed over by send_async and not yet queued on the loop.
        self._outbox: _HandOver[_Outgoing] = _HandOver(runner, self._drain)

    def send(
        self,
        data: Any,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_time: int | float | dt.datetime | None = None,
        deliver_after: int | float | dt.timedelta | None = None,
        deliver_at: int | float | dt.datetime | None = None,
        sequence_id: int | None = None,
        ordering_key: bytes | str | None = None,
    ) -> MessageId:
        """Send one message and wait until it is durable; its MessageId. deliver_after
        (ms or a timedelta) / deliver_at (epoch ms or a datetime): consumers hold it
        until then."""
        return wait(
            self.send_async(
                data,
                key=key,
                properties=properties,
                event_time=event_time,
                deliver_after=deliver_after,
                deliver_at=deliver_at,
                sequence_id=sequence_id,
                ordering_key=ordering_key,
            )
        )

    def send_async(
        self,
        data: Any,
        callback: SendCallback | None = None,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_time: int | float | dt.datetime | None = None,
        deliver_after: int | float | dt.timedelta | None = None,
        deliver_at: int | float | dt.datetime | None = None,
        sequence_id: int | None = None,
        ordering_key: bytes | str | None = None,
    ) -> concurrent.futures.Future[MessageId]:
        """Queue a message without waiting for it to be durable. The returned future
        resolves to its MessageId once it is (no flush() needed); callback, if given,
        is called then as callback(None, message_id), or callback(error, None) -- on the
        client's loop thread, so it must not block. Bad input raises here, at once.
        Blocks while max_pending_messages are pending (ProducerQueueIsFullError instead
        when block_if_queue_full is off)."""
        if self._schema is not None:
            data = self._schema.encode(data)
        checked = aproducer.Producer._checked(
            data, key, properties, event_time, deliver_after, deliver_at, self._chunking,
            ordering_key,
        )  # fmt: skip
        self._take_room()
        outcome: concurrent.futures.Future[MessageId] = concurrent.futures.Future()
        try:
            self._outbox.put((checked, sequence_id, outcome, callback))
        except ClientClosedError:
            self._room.release()
            raise
        return outcome

    def _drain(self, items: list[_Outgoing]) -> None:
        """On the loop: queue every message sent since the last drain, in order."""
        for checked, sequence_id, outcome, callback in items:
            try:
                durable = self._target.queue_checked(checked, sequence_id)
            except BaseException as error:  # e.g. the producer was closed meanwhile
                self._finish(outcome, callback, error, None)
                continue
            durable.add_done_callback(functools.partial(self._durable, outcome, callback))

    def _take_room(self) -> None:
        if self._room.acquire(blocking=False):
            return
        if not self._block:
            raise aproducer.ProducerQueueIsFullError(
                f"max_pending_messages are pending on {self.stream!r}"
            )
        while not self._room.acquire(timeout=_INTERRUPT_CHECK_S):
            if self._runner.closed:
                raise ClientClosedError("the client is closed")

    def _durable(
        self,
        outcome: concurrent.futures.Future[MessageId],
        callback: SendCallback | None,
        done: asyncio.Future[MessageId],
    ) -> None:
        if done.cancelled():
            self._finish(outcome, callback, ClientClosedError("the send was cancelled"), None)
        elif done.exception() is not None:
            self._finish(outcome, callback, done.exception(), None)
        else:
            self._finish(outcome, callback, None, done.result())

    def _finish(
        self,
        outcome: concurrent.futures.Future[MessageId],
        callback: SendCallback | None,
        error: BaseException | None,
        message_id: MessageId | None,
    ) -> None:
        self._room.release()
        if error is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(message_id)  # type: ignore[arg-type]
        if callback is not None:
            try:
                callback(error, message_id)
            except Exception:  # the caller's bug must not stop the loop's other work
                log.exception("send_async callback of %r failed", self.stream)

    @property
    def last_sequence_id(self) -> int:
        """The sequence id of the last message sent (-1: none yet on the stream)."""
        return self._target.last_sequence_id

    # (send_async's drain was scheduled on the loop before these calls: it runs first.)

    def flush(self) -> None:
        """Send the open batch now and wait until everything sent so far is durable."""
        self._runner.run(self._target.flush())

    def close(self) -> None:
        """Flush and stop; the stream stays (another producer may take it over)."""
        if not self._runner.closed:
            self._runner.run(self._target.close())

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<streamlib.Producer {self.stream!r}>"


class Consumer:
    """A durable subscription's consumer (see Client.subscribe). Iterating it receives
    messages one by one, forever (break out, or close it from another thread)."""

    def __init__(self, target: aconsumer.Consumer, runner: _LoopThread) -> None:
        self._target = target
        self._runner = runner
        self.stream: str = target.stream
        self.subscription: str = target.subscription
        self._listener: threading.Thread | None = None
        # The streams whose messages it takes (several: a consumer of several streams).
        self._streams = frozenset(getattr(target, "streams", [target.stream]))
        # Acknowledgements handed over and not yet applied on the loop, in order.
        self._acks: _HandOver[tuple[Callable[[Any], None], Message]] = _HandOver(
            runner, self._apply_acks
        )

    @property
    def consumer_type(self) -> str:
        return self._target.consumer_type

    @property
    def is_active(self) -> bool:
        """Whether this consumer receives now (a failover standby does not)."""
        return self._target.is_active

    def consumer(self, stream: str) -> Consumer:
        """The consumer of one of its streams (to seek it): of a consumer of several
        streams or of a partitioned one, that stream's; of a one-stream consumer, itself."""
        if stream not in self._streams:
            raise BadRequestError(f"this consumer takes {sorted(self._streams)}, not {stream!r}")
        if len(self._streams) == 1:
            return self
        return Consumer(self._target.consumer(stream), self._runner)

    def receive(self, timeout: float | None = None) -> Message:
        """The next message (redeliveries first); streamlib.errors.TimeoutError (a
        builtin TimeoutError too) when none comes within timeout seconds."""
        return self._runner.run(self._target.receive(timeout))

    def batch_receive(self, max_num_messages: int = 100, timeout_ms: int = 100) -> list[Message]:
        """Up to max_num_messages, waiting at most timeout_ms for them (fewer, or none,
        when the time is up)."""
        return self._runner.run(self._target.batch_receive(max_num_messages, timeout_ms))

    def _listen(self, listener: Callable[[Consumer, Message], object]) -> None:
        """Call listener(self, message) for each message in a thread of its own (so it
        may block), until this consumer is closed; an exception it raises is logged and
        the message delivered again."""

        def run() -> None:
            while True:
                try:
                    message = self.receive()
                except ClientClosedError:
                    return
                try:
                    listener(self, message)
                except Exception:
                    log.exception("message listener of %r failed", self.subscription)
                    try:
                        self.negative_acknowledge(message)
                    except ClientClosedError:
                        return

        self._listener = threading.Thread(
            target=run, name=f"streamlib-listener-{self.subscription}", daemon=True
        )
        self._listener.start()

    # Acknowledging: a message as received is handed to the loop and the call returns
    # (pulsar-client's acknowledge does not wait either; _HandOver: a later call of any
    # thread sees it). A MessageId is checked on the loop (it must be one this consumer
    # received): that call waits.

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (as received, or its id)."""
        self._ack(self._target.acknowledge, message)

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge this message and every one before it."""
        self._ack(self._target.acknowledge_cumulative, message)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Have the message delivered again after negative_ack_redelivery_delay_ms."""
        self._ack(self._target.negative_acknowledge, message)

    def _ack(self, apply: Callable[[Any], None], message: Message | MessageId) -> None:
        if isinstance(message, MessageId):
            self._runner.call(apply, message)
            return
        if not isinstance(message, Message):
            raise BadRequestError(f"acknowledge a Message or a MessageId, got {message!r}")
        if message.stream not in self._streams:
            raise BadRequestError(
                f"message {message.message_id} is of stream {message.stream!r}, which this "
                f"consumer does not consume"
            )
        self._acks.put((apply, message))

    def _apply_acks(self, items: list[tuple[Callable[[Any], None], Message]]) -> None:
        """On the loop: every acknowledgement handed over since the last hop, in order."""
        for apply, message in items:
            try:
                apply(message)
            except Exception:  # (checked when handed over: nothing expected here)
                log.exception("acknowledging %s on %r failed", message, self.subscription)

    def seek(self, target: MessageId | int) -> None:
        """Deliver again from a message id (that message first) or from the first
        message published at or after epoch milliseconds `target`."""
        self._runner.run(self._target.seek(target))

    def persist(self) -> None:
        """Write the cursor now (it is written every cursor_persist_interval_ms anyway)."""
        self._runner.run(self._target.persist())

    @property
    def mark_delete_position(self) -> MessageId:
        return self._target.mark_delete_position

    def unsubscribe(self) -> None:
        """Delete the subscription (its cursor) and close."""
        self._runner.run(self._target.unsubscribe())

    def close(self) -> None:
        """Persist the cursor and leave the subscription (to the next failover standby);
        a message listener's thread ends (after the message it is handling)."""
        if not self._runner.closed:
            self._runner.run(self._target.close())
        listener = self._listener
        if listener is not None and listener is not threading.current_thread():
            listener.join(timeout=30)

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield self.receive()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<streamlib.Consumer {self.stream!r} subscription {self.subscription!r}>"


class Reader:
    """A non-durable reader from a position (see Client.create_reader). Iterating it
    reads on, forever, waiting for new messages at the end."""

    def __init__(self, target: areader.Reader, runner: _LoopThread) -> None:
        self._target = target
        self._runner = runner
        self.stream: str = target.stream

    def read_next(self, timeout: float | None = None) -> Message:
        """The next message; streamlib.errors.TimeoutError when none comes in time."""
        return self._runner.run(self._target.read_next(timeout))

    def has_message_available(self) -> bool:
        """Whether a message after the last one read is confirmed now."""
        return self._runner.run(self._target.has_message_available())

    def seek(self, position: MessageId | str | int) -> None:
        """Read from `position` next as from the reader's start: after that message, or
        with it for a start_message_id_inclusive reader (EARLIEST / LATEST allowed); an
        int is epoch milliseconds (the first message published then or later)."""
        self._runner.run(self._target.seek(position))

    def close(self) -> None:
        if not self._runner.closed:
            self._runner.run(self._target.close())

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield self.read_next()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<streamlib.Reader {self.stream!r}>"


class Client:
    """A blocking client: one metadata session, connections to bookies, and one event
    loop thread. Make one with streamlib.connect(uri, ...)."""

    def __init__(self, target: Any, runner: _LoopThread) -> None:
        self._target = target
        self._runner = runner
        # (A client of the stream service, streamlib://, has no ledgers nor registry: it
        # reaches bookies only through brokers.)
        direct = hasattr(target, "ledgers")
        #: The ledger API (streamlib.ledger.manager.LedgerManager, blocking).
        self.ledgers: Any = SyncProxy(target.ledgers, runner) if direct else None
        #: Stream administration (streamlib.stream.admin.StreamManager, blocking; through
        #: the stream service, the same calls asked of a broker).
        self.streams: Any = SyncProxy(target.streams, runner)
        #: The bookies registered now (metadata.services.bookies.BookieRegistry, blocking).
        self.registry: Any = SyncProxy(target.registry, runner) if direct else None

    def create_producer(
        self,
        stream: str,
        *,
        batching_max_messages: int = 1000,
        batching_max_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: float = 1.0,
        max_pending_messages: int = 20_000,
        block_if_queue_full: bool = True,
        batch_format: int = aproducer.FORMAT,
        compression_type: Compression | str = Compression.NONE,
        chunking_enabled: bool = False,
        schema: Schema[Any] | None = None,
        initial_sequence_id: int | None = None,
        producer_name: str | None = None,
        access_mode: str | None = None,
    ) -> Producer:
        """A producer on `stream` (created with the cluster's defaults if missing). It
        takes the stream over before returning, fencing any previous producer.
        compression_type: "none" (default), "lz4", "zlib" or "zstd" (Pulsar's
        CompressionType names too), per entry; readers must know batch format 3.
        chunking_enabled: a message over the entry limit (5 MiB) goes in pieces that
        consumers and readers put together (up to 256 MiB; readers must know format 4).
        schema (streamlib.schema): send() takes its objects; the stream keeps it and a
        producer with an incompatible one gets IncompatibleSchemaError.
        producer_name and access_mode: see the stream service (streamlib://) in the
        README; a direct-mode producer is "exclusive_with_fencing"."""
        named: dict[str, Any] = {}
        if producer_name is not None:
            named["producer_name"] = producer_name
        if access_mode is not None:
            named["access_mode"] = access_mode
        target = self._runner.run(
            self._target.create_producer(
                stream,
                batching_max_messages=batching_max_messages,
                batching_max_bytes=batching_max_bytes,
                batching_max_publish_delay_ms=batching_max_publish_delay_ms,
                max_pending_messages=max_pending_messages,
                block_if_queue_full=block_if_queue_full,
                batch_format=batch_format,
                compression_type=compression_type,
                chunking_enabled=chunking_enabled,
                schema=schema,
                initial_sequence_id=initial_sequence_id,
                **named,
            )
        )
        return Producer(target, self._runner)

    def subscribe(
        self,
        stream: str | list[str],
        subscription: str,
        initial_position: str = "latest",
        *,
        consumer_type: ConsumerType | str = ConsumerType.Exclusive,
        consumer_name: str | None = None,
        dead_letter_policy: DeadLetterPolicy | None = None,
        message_listener: Callable[[Consumer, Message], object] | None = None,
        schema: Schema[Any] | None = None,
        receiver_queue_size: int = 1000,
        ack_timeout_ms: int = 0,
        negative_ack_redelivery_delay_ms: int = 1000,
        cursor_persist_interval_ms: int = 100,
    ) -> Consumer:
        """A consumer of a durable subscription; see streamlib.Client.subscribe (the
        asyncio one) for the consumer types and the dead-letter policy.
        message_listener(consumer, message) runs in a thread of the consumer's own."""
        target = self._runner.run(
            self._target.subscribe(
                stream,
                subscription,
                initial_position,
                consumer_type=consumer_type,
                consumer_name=consumer_name,
                dead_letter_policy=dead_letter_policy,
                schema=schema,
                receiver_queue_size=receiver_queue_size,
                ack_timeout_ms=ack_timeout_ms,
                negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                cursor_persist_interval_ms=cursor_persist_interval_ms,
            )
        )
        consumer = Consumer(target, self._runner)
        if message_listener is not None:
            consumer._listen(message_listener)
        return consumer

    def create_reader(
        self,
        stream: str,
        start: MessageId | str = EARLIEST,
        *,
        receiver_queue_size: int = 1000,
        start_message_id_inclusive: bool = False,
        schema: Schema[Any] | None = None,
    ) -> Reader:
        """A non-durable reader from `start` (EARLIEST, LATEST or a MessageId: reading
        begins with the message after it)."""
        target = self._runner.run(
            self._target.create_reader(
                stream,
                start,
                receiver_queue_size=receiver_queue_size,
                start_message_id_inclusive=start_message_id_inclusive,
                schema=schema,
            )
        )
        return Reader(target, self._runner)

    def stats(self) -> dict[str, Any]:
        """What this client's producers and consumers did (see streamlib.Client.stats)."""
        return self._runner.call(self._target.stats)

    @property
    def metrics_registry(self) -> Any:
        """The client's Prometheus registry (prometheus_client.generate_latest(it))."""
        return self._target.metrics_registry

    def serve_metrics(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve the client's metrics for Prometheus on http://addr:port/; the port."""
        return self._runner.call(self._target.serve_metrics, port, addr)

    @property
    def store(self) -> Any:
        """The metadata store session (asyncio; for the metadata services)."""
        return self._target.store

    def close(self) -> None:
        """Close every producer, consumer and reader of this client, then the client.
        Calls after this raise ClientClosedError. Idempotent."""
        if self._runner.closed:
            return
        try:
            self._runner.run(self._target.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        uri = getattr(self._target, "uri", None) or self._target.store.uri
        return f"<streamlib.sync.Client {uri!r}>"


# -- the generic proxy, for the ledger and admin APIs -----------------------------------


def _wants_wrapping(value: object) -> bool:
    cls = type(value)
    if not cls.__module__.startswith(("streamlib.", "metadata.")):
        return False
    return any(
        inspect.iscoroutinefunction(v) or inspect.isasyncgenfunction(v) for v in vars(cls).values()
    )


class SyncProxy:
    """The blocking view of one asyncio streamlib object: its coroutine methods become
    blocking calls, async iterators plain iterators, returned objects are wrapped."""

    def __init__(self, target: object, runner: _LoopThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_runner", runner)

    def _wrap(self, value: Any) -> Any:
        return SyncProxy(value, self._runner) if _wants_wrapping(value) else value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if inspect.iscoroutinefunction(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(self._runner.run(attr(*args, **kwargs)))

            return call
        if inspect.isasyncgenfunction(attr):

            def iterate(*args: Any, **kwargs: Any) -> Iterator[Any]:
                return self._iterate(attr(*args, **kwargs))

            return iterate
        if callable(attr) and not isinstance(attr, type):

            def plain(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(self._runner.call(attr, *args, **kwargs))

            return plain
        return self._wrap(attr)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._target)) | set(object.__dir__(self)))

    def _iterate(self, agen: AsyncIterator[Any]) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._wrap(self._runner.run(agen.__anext__()))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and not self._runner.closed:
                self._runner.run(aclose())

    def __repr__(self) -> str:
        return f"<sync {self._target!r}>"

    def __enter__(self) -> SyncProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(uri: str, **options: Any) -> Client:
    """Connect a blocking client to the metadata store at uri (zk://, sqlite://,
    memory://); options as streamlib.Client.connect (session_timeout_s, tls_ca, token,
    bookie_config, ...)."""
    from streamlib.client import Client as AsyncClient

    runner = _LoopThread()
    try:
        client = runner.run(AsyncClient.connect(uri, **options))
    except BaseException:
        runner.stop()
        raise
    return Client(client, runner)
