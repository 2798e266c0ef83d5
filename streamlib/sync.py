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
import contextlib
import datetime as dt
import functools
import inspect
import itertools
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

from streamlib import errors
from streamlib.protocol.errors import BadRequestError, ClientClosedError
from streamlib.schema import Schema
from streamlib.stream import consumer as aconsumer
from streamlib.stream import producer as aproducer
from streamlib.stream import reader as areader
from streamlib.stream import table_view as atable
from streamlib.stream.batch import Compression
from streamlib.stream.consumer import DeadLetterPolicy
from streamlib.stream.positions import EARLIEST, MessageId
from streamlib.stream.reader import Message
from streamlib.stream.subscription import ConsumerType

T = TypeVar("T")
T2 = TypeVar("T2")
log = logging.getLogger(__name__)

# The most messages one hop to the loop takes for receive() (see Consumer.receive).
RECEIVE_BURST = 256
# How often the loop looks for more acknowledgements while they come (Consumer._acks).
ACKS_GATHER_S = 0.005

# How often a blocked caller's thread wakes to let Python run signal handlers (Ctrl-C);
# the answer itself is taken the moment it arrives.
_INTERRUPT_CHECK_S = 0.2

SendCallback = Callable[[BaseException | None, MessageId | None], None]
_PENDING, _FINISHED = concurrent.futures._base.PENDING, concurrent.futures._base.FINISHED


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.closed = False
        # Every hand-over of this client's producers and consumers: closing the client
        # drains them first (what was handed over comes before the close).
        self.handovers: weakref.WeakSet[_HandOver[Any]] = weakref.WeakSet()
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

    async def after_handovers(self, awaitable: Awaitable[T]) -> T:
        """(On the loop) drain every hand-over, then await."""
        for handover in list(self.handovers):
            handover.drain()
        return await awaitable

    def stop(self) -> None:
        self.closed = True
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class _HandOver(Generic[T]):
    """Items handed from callers' threads to the client's loop, in order: one hop to the
    loop for however many gather meanwhile, and no lock (a deque's append and popleft
    are atomic; taking a lock per item made the caller's thread and the loop wait for
    each other). A call that must come after what was handed over (flush, seek, close)
    drains it first on the loop (`after`): another thread may have found the hop
    scheduled before it was."""

    def __init__(
        self, runner: _LoopThread, apply: Callable[[list[T]], None], gather_s: float = 0.0
    ) -> None:
        self._runner = runner
        self._apply = apply  # (on the loop: the items since the last hop)
        self._gather_s = gather_s  # (how soon the loop looks again while items come)
        runner.handovers.add(self)
        self._items: collections.deque[T] = collections.deque()
        self._scheduled = False

    def put(self, item: T) -> None:
        """Hand item over; ClientClosedError, the item not taken, once the client closed."""
        if self._runner.closed:
            raise ClientClosedError("the client is closed")
        self._items.append(item)
        # (Appended, then the flag read; the loop clears the flag when it finds
        # nothing, then looks again: when this finds it set, a drain takes the item.)
        if not self._scheduled:
            self._scheduled = True
            try:
                self._runner.loop.call_soon_threadsafe(self.drain)
            except RuntimeError:  # the loop closed under us (client.close elsewhere)
                self._items.clear()
                raise ClientClosedError("the client is closed") from None

    def drain(self) -> None:
        """(On the loop) apply what was handed over. While items keep coming, the hop
        stays scheduled (the loop looks again on its next turn) and callers write
        nothing to wake it: a caller's thread that woke the loop for each item gave it
        the GIL at each wake-up, and both threads took turns item by item."""
        items = self._items
        taken = [items.popleft() for _ in range(len(items))]
        if taken:
            # (The first items after a quiet spell are applied at once; while more
            # come, the loop looks again every gather_s.)
            if self._gather_s:
                self._runner.loop.call_later(self._gather_s, self.drain)
            else:
                self._runner.loop.call_soon(self.drain)
            self._apply(taken)
            return
        self._scheduled = False
        if items:  # (put after the look, and found the hop scheduled: take it now)
            self._scheduled = True
            self._runner.loop.call_soon(self.drain)

    async def after(self, awaitable: Awaitable[T2]) -> T2:
        """(On the loop) drain, then await."""
        self.drain()
        return await awaitable


def wait(
    future: concurrent.futures.Future[T],
    timeout: float | None = None,
    keep: bool = False,
    runner: _LoopThread | None = None,
) -> T:
    """The future's result, waking now and then so Ctrl-C is handled; an interrupted
    wait cancels the future (and so the coroutine on the loop), unless keep. Given a
    timeout, concurrent.futures.TimeoutError when the future is not done by then (it
    goes on). Given the runner, ClientClosedError once its loop stopped without settling
    the future (a send handed over while another thread closed the client)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            step = _INTERRUPT_CHECK_S
            if deadline is not None:
                step = min(step, max(0.0, deadline - time.monotonic()))
            try:
                return future.result(timeout=step)
            except concurrent.futures.TimeoutError:
                if future.done():  # the coroutine itself raised a TimeoutError
                    return future.result()
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if runner is not None and runner.closed and not runner.loop.is_running():
                    raise ClientClosedError("the client is closed") from None
    except KeyboardInterrupt:
        if not keep:
            future.cancel()
        raise


class SendFuture(concurrent.futures.Future[MessageId]):
    """What the blocking API's send_async returns: a concurrent.futures.Future
    (result(), add_done_callback(), concurrent.futures.wait() and as_completed() work),
    made once per message cheaply. It shares its producer's lock instead of making a
    Condition and an RLock of its own (a fifth of a send_async loop's cost), the loop
    settles it directly, and settling it gives its place in the producer's queue back
    and calls the send's callback. A send handed over cannot be cancelled."""

    def __init__(
        self,
        producer: Producer,
        callback: SendCallback | None,
        checked: aproducer.Checked,
        sequence_id: int | None,
    ) -> None:
        # (concurrent.futures.Future.__init__, but for the Condition)
        self._condition = producer._settling
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._producer = producer
        self._callback = callback
        self._checked: aproducer.Checked | None = checked  # (what it sends: until queued)
        self._sequence_id = sequence_id

    # (concurrent.futures' lists of waiters and done-callbacks, made when first used:
    # two lists per message made the garbage collector's passes a third of the cost.)

    _waiters_made: list[Any] | None = None
    _done_callbacks_made: list[Any] | None = None

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        if self._waiters_made is None:
            self._waiters_made = []
        return self._waiters_made

    @property
    def _done_callbacks(self) -> list[Any]:  # type: ignore[override]
        if self._done_callbacks_made is None:
            self._done_callbacks_made = []
        return self._done_callbacks_made

    def cancel(self) -> bool:
        return False

    def done(self) -> bool:
        return self._state == _FINISHED

    def result(self, timeout: float | None = None) -> MessageId:
        self._wait(timeout)
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return super().exception(0)

    def _wait(self, timeout: float | None) -> None:
        """Until this one is done (a settle wakes the waiters of every future of the
        producer: each looks again at its own), or the time is up."""
        deadline = None if timeout is None else time.monotonic() + timeout
        producer = self._producer
        with producer._lock:
            producer._sleepers += 1
            try:
                while self._state != _FINISHED:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return
                    self._condition.wait(left)
            finally:
                producer._sleepers -= 1

    def set_result(self, result: MessageId) -> None:
        self.settle_all([self], [result], None)

    def set_exception(self, exception: BaseException | None) -> None:
        self.settle_all([self], [], exception)

    @staticmethod
    def settle_all(
        futures: list[SendFuture], results: list[MessageId], error: BaseException | None
    ) -> None:
        """(On the loop) concurrent.futures.Future's set_result (or set_exception, given
        an error) of futures of one producer, and their places in its queue given back,
        under one taking of its lock: taking it per message let the caller's thread wait
        for it time and again while the loop settled a batch."""
        producer = futures[0]._producer
        settled = []
        with producer._lock:
            for index, future in enumerate(futures):
                if future._state == _FINISHED:
                    continue
                future._state = _FINISHED
                waiters = future._waiters_made or ()
                if error is None:
                    future._result = results[index]
                    for waiter in waiters:
                        waiter.add_result(future)
                else:
                    future._exception = error
                    for waiter in waiters:
                        waiter.add_exception(future)
                settled.append(future)
            producer._free.extend(itertools.repeat(None, len(settled)))
            if producer._sleepers:
                producer._settling.notify_all()
        for future in settled:
            if future._done_callbacks_made:
                future._invoke_callbacks()  # type: ignore[attr-defined]
            callback = future._callback
            if callback is not None:
                try:
                    callback(error, future._result)
                except Exception:  # the caller's bug must not stop the loop's other work
                    log.exception("send_async callback of %r failed", producer.stream)


def _settle_from(outcome: SendFuture, done: Any) -> None:
    """A resend's future settles as its original did."""
    if done.cancelled():
        outcome.set_exception(ClientClosedError("the send was cancelled"))
    elif done.exception() is not None:
        outcome.set_exception(done.exception())
    else:
        outcome.set_result(done.result())


class Producer:
    """Sends messages to one stream; the stream's only writer while it lives (creating
    it fenced the previous one). Messages are batched adaptively: one goes at once when
    nothing is in flight, the rest gather while entries are in flight."""

    def __init__(self, target: aproducer.Producer, runner: _LoopThread) -> None:
        self._target = target
        self._runner = runner
        self.stream: str = target.stream
        # The caller-side bound on messages waiting for acknowledgement, so a loop of
        # send_async never hops to the loop to learn there is room: a place each (a
        # deque's pop and extend are atomic: no lock per message); `_sleepers`: threads
        # waiting, for room or for a future, on the lock the producer's futures share.
        self._free: collections.deque[None] = collections.deque(
            itertools.repeat(None, target.max_pending_messages)
        )
        self._lock = threading.RLock()
        self._settling = threading.Condition(self._lock)
        self._sleepers = 0
        self._block = target.block_if_queue_full
        self._chunking = target.chunking_enabled
        self._schema = target.schema
        # Messages handed over by send_async and not yet queued on the loop.
        self._outbox: _HandOver[SendFuture] = _HandOver(runner, self._drain)

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
    ) -> SendFuture:
        """Queue a message without waiting for it to be durable. The returned future
        (a concurrent.futures.Future) resolves to its MessageId once it is (no flush()
        needed); callback, if given, is called then as callback(None, message_id), or
        callback(error, None) -- on the client's loop thread, so it must not block. Bad
        input raises here, at once. Blocks while max_pending_messages are pending
        (ProducerQueueIsFullError instead when block_if_queue_full is off)."""
        if self._schema is not None:
            data = self._schema.encode(data)
        checked = aproducer.Producer._checked(
            data, key, properties, event_time, deliver_after, deliver_at, self._chunking,
            ordering_key,
        )  # fmt: skip
        self._take_room()
        outcome = SendFuture(self, callback, checked, sequence_id)
        try:
            self._outbox.put(outcome)
        except ClientClosedError:
            self._give_room()
            raise
        return outcome

    def _drain(self, items: list[SendFuture]) -> None:
        """On the loop: queue every message sent since the last drain, in order."""
        queue = self._target.queue_checked
        for outcome in items:
            checked, outcome._checked = outcome._checked, None
            assert checked is not None
            try:
                settles = queue(checked, outcome._sequence_id, "", outcome)
            except BaseException as error:  # e.g. the producer was closed meanwhile
                outcome.set_exception(error)
                continue
            if settles is not outcome:  # (a resend of a message in flight; a chunked one)
                settles.add_done_callback(functools.partial(_settle_from, outcome))  # type: ignore[attr-defined]

    def _take_room(self) -> None:
        try:
            return self._free.pop()
        except IndexError:
            pass
        if not self._block:
            raise aproducer.ProducerQueueIsFullError(
                f"max_pending_messages are pending on {self.stream!r}"
            )
        with self._lock:
            # (Counted, then looked at again: a settle that gives room back after the
            # count was made wakes this one.)
            self._sleepers += 1
            try:
                while True:
                    try:
                        return self._free.pop()
                    except IndexError:
                        pass
                    if self._runner.closed:
                        raise ClientClosedError("the client is closed")
                    self._settling.wait(_INTERRUPT_CHECK_S)
            finally:
                self._sleepers -= 1

    def _give_room(self, places: int = 1) -> None:
        self._free.extend(itertools.repeat(None, places))
        if self._sleepers:
            with self._lock:
                self._settling.notify_all()

    @property
    def last_sequence_id(self) -> int:
        """The sequence id of the last message sent (-1: none yet on the stream)."""
        return self._target.last_sequence_id

    # (send_async's drain was scheduled on the loop before these calls: it runs first.)

    def flush(self) -> None:
        """Send the open batch now and wait until everything sent so far is durable."""
        self._runner.run(self._outbox.after(self._target.flush()))

    def close(self) -> None:
        """Flush and stop; the stream stays (another producer may take it over)."""
        if not self._runner.closed:
            self._runner.run(self._outbox.after(self._target.close()))

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<streamlib.Producer {self.stream!r}>"


class Consumer:
    """A durable subscription's consumer (see Client.subscribe). Iterating it receives
    messages one by one, forever (break out, or close it from another thread)."""

    def __init__(
        self, target: aconsumer.Consumer, runner: _LoopThread, parent: Consumer | None = None
    ) -> None:
        self._target = target
        self._runner = runner
        self.stream: str = target.stream
        self.subscription: str = target.subscription
        self._listener: threading.Thread | None = None
        self._children: dict[str, Consumer] = {}  # (consumer(stream)'s, made once)
        # The streams whose messages it takes (several: a consumer of several streams).
        self._streams = frozenset(getattr(target, "streams", [target.stream]))
        # Messages received in the last burst and not yet taken (receive(): one hop to
        # the loop for whatever is there). Dropped when the consumer forgets what it
        # received (a seek, a failover turn that ended): as its own queue is.
        self._received: collections.deque[Message] = collections.deque()
        self._burst_size = (
            min(RECEIVE_BURST, target.burst_size)
            if isinstance(target, aconsumer.Consumer) and parent is None
            else 1  # (a consumer of several streams' part: to seek it, not to receive)
        )
        self._bursts = self._burst_size > 1
        # The next burst, asked for as soon as the last one came (the loop gathers it
        # while the caller takes the last), and the generation of what the consumer
        # received: a burst gathered before it forgot (a seek...) is dropped.
        self._next_burst: concurrent.futures.Future[tuple[int, list[Message]]] | None = None
        self._generation = 0
        self._receiving = threading.Lock()  # (one thread at a time waits for a burst)
        # Taken by the caller to check a burst's generation and keep its messages, and
        # by the loop to forget: a seek or a turn that ends between the two drops them.
        self._keeping = threading.Lock()
        if self._bursts:
            target.on_forget.append(self._forget)
        self._closed = False
        # Acknowledgements handed over and not yet applied on the loop, in order: the
        # loop looks for more every ACKS_GATHER_S while they come (and at each burst),
        # rather than being woken for each (pulsar-client groups them for 100 ms).
        # A part of a consumer of several streams hands its acks over with the whole's:
        # one order for them and its seeks.
        self._acks: _HandOver[Message | tuple[Callable[[Any], None], Message]] = (
            parent._acks
            if parent is not None
            else _HandOver(runner, self._apply_acks, ACKS_GATHER_S)
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
        child = self._children.get(stream)
        if child is None:
            child = self._children[stream] = Consumer(
                self._target.consumer(stream), self._runner, parent=self
            )
        return child

    def receive(self, timeout: float | None = None) -> Message:
        """The next message (redeliveries first); streamlib.errors.TimeoutError (a
        builtin TimeoutError too) when none comes within timeout seconds. One hop to
        the client's loop takes every message that is there (up to RECEIVE_BURST, and half
        the receiver queue), and
        asks for the next burst at once: the next receives take them here."""
        if self._received and not self._closed:
            try:
                return self._received.popleft()
            except IndexError:  # (another thread's receive took it)
                pass
        if not self._bursts:
            return self._runner.run(self._target.receive(timeout))
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._receiving.acquire(timeout=-1 if timeout is None else timeout):
            raise errors.TimeoutError(f"no message on {self.stream!r} within {timeout} s")
        try:
            return self._from_bursts(deadline, timeout)
        finally:
            self._receiving.release()

    def _from_bursts(self, deadline: float | None, timeout: float | None) -> Message:
        while True:
            if self._received and not self._closed:  # (taken while this one waited)
                with contextlib.suppress(IndexError):
                    return self._received.popleft()
            burst = self._next_burst
            if burst is None:
                burst = self._next_burst = self._runner.submit(self._burst())
            try:
                # (An interrupted wait leaves the burst for the next receive: cancelled,
                # a burst already gathered would be lost with its messages.)
                generation, messages = wait(
                    burst, None if deadline is None else deadline - time.monotonic(), keep=True
                )
            except concurrent.futures.TimeoutError:
                raise errors.TimeoutError(
                    f"no message on {self.stream!r} within {timeout} s"
                ) from None
            except BaseException:
                self._next_burst = None
                raise
            self._next_burst = None if self._closed else self._runner.submit(self._burst())
            with self._keeping:
                if generation == self._generation:  # (else: from before a seek...)
                    self._received.extend(messages[1:])
                    return messages[0]

    async def _burst(self) -> tuple[int, list[Message]]:
        """(On the loop) the next message, waiting for it, and whatever is there after it."""
        self._acks.drain()
        target = self._target
        burst = [await target.receive()]
        while len(burst) < self._burst_size and (more := target.receive_nowait()) is not None:
            burst.append(more)
        return self._generation, burst

    def _forget(self) -> None:
        """(On the loop) the consumer forgot what it received: so does this."""
        with self._keeping:
            self._generation += 1
            self._received.clear()

    def batch_receive(self, max_num_messages: int = 100, timeout_ms: int = 100) -> list[Message]:
        """Up to max_num_messages, waiting at most timeout_ms for them (fewer, or none,
        when the time is up)."""
        if not self._bursts:
            return self._runner.run(self._target.batch_receive(max_num_messages, timeout_ms))
        if max_num_messages < 1 or timeout_ms < 0:
            raise BadRequestError("batch_receive takes max_num_messages >= 1, timeout_ms >= 0")
        taken: list[Message] = []
        deadline = time.monotonic() + timeout_ms / 1000.0
        with contextlib.suppress(errors.TimeoutError):
            while len(taken) < max_num_messages:
                if not self._received:
                    taken.append(self.receive(max(0.0, deadline - time.monotonic())))
                with contextlib.suppress(IndexError):  # (another thread may take them too)
                    while len(taken) < max_num_messages:
                        taken.append(self._received.popleft())
        return taken

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
        if isinstance(message, Message) and message.stream in self._streams:  # (most acks)
            self._acks.put(message)  # type: ignore[arg-type]
            return
        self._ack(self._target.acknowledge, message)

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge this message and every one before it."""
        self._ack(self._target.acknowledge_cumulative, message)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Have the message delivered again after negative_ack_redelivery_delay_ms."""
        self._ack(self._target.negative_acknowledge, message)

    def _ack(self, apply: Callable[[Any], None], message: Message | MessageId) -> None:
        if isinstance(message, MessageId):
            self._runner.call(self._ack_now, apply, message)
            return
        if not isinstance(message, Message):
            raise BadRequestError(f"acknowledge a Message or a MessageId, got {message!r}")
        if message.stream not in self._streams:
            raise BadRequestError(
                f"message {message.message_id} is of stream {message.stream!r}, which this "
                f"consumer does not consume"
            )
        self._acks.put((apply, message))

    def _ack_now(self, apply: Callable[[Any], None], message: MessageId) -> None:
        """(On the loop) after what was handed over before."""
        self._acks.drain()
        apply(message)

    def _apply_acks(self, items: list[Message | tuple[Callable[[Any], None], Message]]) -> None:
        """On the loop: every acknowledgement handed over since the last hop, in order
        (a message alone: acknowledged)."""
        acknowledge = self._target.acknowledge
        for item in items:
            apply, message = (acknowledge, item) if not isinstance(item, tuple) else item
            try:
                apply(message)
            except Exception:  # (checked when handed over: nothing expected here)
                log.exception("acknowledging %s on %r failed", message, self.subscription)

    def seek(self, target: MessageId | int) -> None:
        """Deliver again from a message id (that message first) or from the first
        message published at or after epoch milliseconds `target`."""
        self._runner.run(self._acks.after(self._target.seek(target)))

    def persist(self) -> None:
        """Write the cursor now (it is written every cursor_persist_interval_ms anyway)."""
        self._runner.run(self._acks.after(self._target.persist()))

    @property
    def mark_delete_position(self) -> MessageId:
        return self._target.mark_delete_position

    def unsubscribe(self) -> None:
        """Delete the subscription (its cursor) and close."""
        self._runner.run(self._acks.after(self._target.unsubscribe()))
        self._closed = True
        self._received.clear()

    def close(self) -> None:
        """Persist the cursor and leave the subscription (to the next failover standby);
        a message listener's thread ends (after the message it is handling). Messages
        received in a burst and not taken are delivered again (as unacknowledged)."""
        if not self._runner.closed:
            self._runner.run(self._acks.after(self._target.close()))
        self._closed = True
        self._received.clear()
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


class TableView:
    """A live read-only mapping of the latest value of every key of a stream (see
    Client.create_table_view): get, len, in, iteration, items(). Listeners
    (for_each_and_listen, listen) run on the client's event loop thread: they must not
    block."""

    def __init__(self, target: atable.TableView, runner: _LoopThread) -> None:
        self._target = target
        self._runner = runner
        self.stream = target.stream

    def get(self, key: str, default: Any = None) -> Any:
        return self._target.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self._target[key]

    def __contains__(self, key: object) -> bool:
        return key in self._target

    def __len__(self) -> int:
        return len(self._target)

    def __iter__(self) -> Iterator[str]:
        return iter(self._target)

    def items(self) -> list[tuple[str, Any]]:
        """A snapshot (taken at once: the loop thread may update the view meanwhile)."""
        return self._target.snapshot()

    def keys(self) -> list[str]:
        return [key for key, _ in self._target.snapshot()]

    def values(self) -> list[Any]:
        return [value for _, value in self._target.snapshot()]

    def for_each(self, callback: Callable[[str, Any], object]) -> None:
        """callback(key, value) for every key now (in this thread)."""
        self._target.for_each(callback)

    def for_each_and_listen(self, callback: Callable[[str, Any], object]) -> None:
        """for_each, then callback(key, value) for every update (on the loop thread)."""
        self._runner.call(self._target.for_each_and_listen, callback)

    def listen(self, callback: Callable[[str, Any], object]) -> None:
        self._runner.call(self._target.listen, callback)

    def close(self) -> None:
        if not self._runner.closed:
            self._runner.run(self._target.close())

    def __enter__(self) -> TableView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<streamlib.TableView {self.stream!r}: {len(self)} keys>"


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
        read_compacted: bool = False,
    ) -> Consumer:
        """A consumer of a durable subscription; see streamlib.Client.subscribe (the
        asyncio one) for the consumer types, the dead-letter policy and read_compacted.
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
                read_compacted=read_compacted,
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
        read_compacted: bool = False,
    ) -> Reader:
        """A non-durable reader from `start` (EARLIEST, LATEST or a MessageId: reading
        begins with the message after it); read_compacted: the stream's compacted view
        up to its horizon, then the stream."""
        target = self._runner.run(
            self._target.create_reader(
                stream,
                start,
                receiver_queue_size=receiver_queue_size,
                start_message_id_inclusive=start_message_id_inclusive,
                schema=schema,
                read_compacted=read_compacted,
            )
        )
        return Reader(target, self._runner)

    def create_table_view(self, stream: str, schema: Schema[Any] | None = None) -> TableView:
        """pulsar-client's TableView: the latest value of every key of `stream`, kept
        live (see streamlib.stream.table_view). It returns once it holds every key up to
        the end of the stream now."""
        target = self._runner.run(self._target.create_table_view(stream, schema))
        return TableView(target, self._runner)

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
            self._runner.run(self._runner.after_handovers(self._target.close()))
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
