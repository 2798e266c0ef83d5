"""Producer: batches messages into entries of a stream (the entry format is
streamlib.stream.batch's: key, properties, publish time, event time, payload per message).

One implementation for both ways to reach a stream: the producer builds every entry
(batching, compression, chunking, schemas, sequence ids, deduplication of resends) and
hands it to its Appender -- in direct mode the stream's writer (it takes the stream over
and appends to the ledgers), through the stream service a broker connection
(streamlib/service/appender.py) that sends the entry to the stream's owner, which
stores it as it is.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import functools
import inspect
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, overload

from streamlib.protocol.errors import (
    BadRequestError,
    ClientClosedError,
    StreamlibError,
    TooLargeError,
)
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import (
    BATCH_OVERHEAD,
    FORMAT,
    MAX_CHUNKED_MESSAGE_BYTES,
    BatchBuilder,
    Compression,
    compress,
    message_size,
    metadata_of,
    parse_compression,
)
from streamlib.stream.positions import EARLIEST, MessageId
from streamlib.stream.writer import StreamWriter, now_ms

MAX_ENTRY_BYTES = 5 * 1024 * 1024
MAX_MESSAGE_BYTES = MAX_ENTRY_BYTES - BATCH_OVERHEAD  # payload, key and properties
# A chunked message's pieces: each fits an entry with the key and properties it repeats.
CHUNK_BYTES = 4 * 1024 * 1024
MAX_CHUNKS = -(-MAX_CHUNKED_MESSAGE_BYTES // CHUNK_BYTES)
MAX_BATCH_MESSAGES = 100_000  # messages in one entry (batching_max_messages at most)
MAX_CHUNKED_METADATA_BYTES = 64 * 1024


# Sends a producer remembers the position of, to answer a resend of one (dedup).
RECENT_IDS = 4096


class ProducerQueueIsFullError(StreamlibError):
    """max_pending_messages are waiting for acknowledgement and block_if_queue_full is off."""

    retriable = True  # (the queue drains)


ACCESS_MODES = ("shared", "exclusive", "exclusive_with_fencing", "wait_for_exclusive")


def parse_access_mode(value: object) -> str:
    """One of ACCESS_MODES, from its name (any case, with or without underscores) or
    anything with such a ``name`` (pulsar-client's ProducerAccessMode)."""
    text = value if isinstance(value, str) else getattr(value, "name", None)
    if isinstance(text, str):
        wanted = text.lower().replace("_", "")
        for mode in ACCESS_MODES:
            if mode.replace("_", "") == wanted:
                return mode
    raise BadRequestError(f"access_mode is one of {', '.join(ACCESS_MODES)}, got {value!r}")


class Appender(Protocol):
    """Where a producer's entries go: each is appended whole, in the order given; its
    future gives (ledger id, entry id) once it is durable (or, for an entry whose last
    sequence id was stored before, where that one went)."""

    name: str

    def append_entry(
        self, entry: bytes, first_sequence_id: int, last_sequence_id: int, messages: int
    ) -> asyncio.Future[tuple[int, int]]: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class WriterAppender:
    """Direct mode's appender: the stream's writer (streamlib/stream/writer.py)."""

    def __init__(self, writer: StreamWriter) -> None:
        self.writer = writer
        self.name = writer.name

    def append_entry(
        self, entry: bytes, first_sequence_id: int, last_sequence_id: int, messages: int
    ) -> asyncio.Future[tuple[int, int]]:
        return self.writer.append_nowait(entry)

    async def flush(self) -> None:
        await self.writer.flush()

    async def close(self) -> None:
        await self.writer.close()


class Outcome(Protocol):
    """What a send settles: its asyncio future, or the blocking API's future (which the
    loop settles directly: no asyncio future and callback per message in between)."""

    def done(self) -> bool: ...

    def set_result(self, result: MessageId, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


@dataclass
class _Batch:
    messages: BatchBuilder
    futures: list[Outcome]
    started: float = 0.0  # when its first message was sent (time.monotonic())
    chunked: bool = False  # a piece of a chunked message


Checked = tuple[bytes, int, "envelope.Metadata | None", int]


def _millis(value: int | float | dt.datetime | None, name: str) -> int:
    """Epoch milliseconds of a time (0 = none), 0 <= ms < 2**63."""
    if value is None:
        return 0
    ms = value.timestamp() * 1000 if isinstance(value, dt.datetime) else value
    if isinstance(ms, int | float) and not isinstance(ms, bool) and 0 <= ms < 2**63:
        return int(ms)
    raise BadRequestError(
        f"{name} must be a datetime or epoch milliseconds from 1970 on, got {value!r}"
    )


def _deliver_ms(
    after: int | float | dt.timedelta | None, at: int | float | dt.datetime | None
) -> int:
    """The delivery time asked for, in epoch ms (0: at once)."""
    if after is not None and at is not None:
        raise BadRequestError("give deliver_after or deliver_at, not both")
    if after is None:
        return _millis(at, "deliver_at")
    ms = after.total_seconds() * 1000 if isinstance(after, dt.timedelta) else after
    if not isinstance(ms, int | float) or isinstance(ms, bool) or not 0 <= ms < 2**62:
        raise BadRequestError(
            f"deliver_after must be a timedelta or milliseconds >= 0, got {after!r}"
        )
    return now_ms() + int(ms) if ms else 0


def _check(
    max_messages: int,
    max_bytes: int,
    delay_ms: float,
    max_pending: int,
    batch_format: int,
    compression_type: object = Compression.NONE,
) -> Compression:
    """The options' checks; the compression they ask for."""
    if max_messages < 1 or max_bytes < 1 or max_pending < 1:
        raise BadRequestError("batching limits and max_pending_messages must be >= 1")
    if max_messages > MAX_BATCH_MESSAGES:
        raise BadRequestError(f"batching_max_messages is at most {MAX_BATCH_MESSAGES}")
    if delay_ms < 0:
        raise BadRequestError("batching_max_publish_delay_ms must be >= 0")
    if batch_format not in (1, FORMAT):
        # 1 writes the entry format older readers know (see streamlib.stream.batch).
        raise BadRequestError(f"batch_format is 1 or {FORMAT}, got {batch_format!r}")
    compression = parse_compression(compression_type)
    if compression is not Compression.NONE and batch_format == 1:
        raise BadRequestError(
            "compression needs batch_format 2 (readers that know only format 1 cannot read "
            "compressed entries either)"
        )
    return compression


class Producer:
    def __init__(
        self,
        appender: Appender | StreamWriter,
        *,
        batching_max_messages: int = 1000,
        batching_max_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: float = 1.0,
        max_pending_messages: int = 20_000,
        block_if_queue_full: bool = True,
        batch_format: int = FORMAT,
        compression_type: Compression | str = Compression.NONE,
        chunking_enabled: bool = False,
        schema: Any = None,
        initial_sequence_id: int | None = None,
        producer_name: str = "",
        recent: Mapping[int, MessageId] | None = None,
    ) -> None:
        if not isinstance(producer_name, str):
            raise BadRequestError(f"producer_name must be a str, got {producer_name!r}")
        self.producer_name = producer_name  # stored with each message when given
        self._compression = _check(
            batching_max_messages,
            batching_max_bytes,
            batching_max_publish_delay_ms,
            max_pending_messages,
            batch_format,
            compression_type,
        )
        self._format = batch_format
        if chunking_enabled and batch_format == 1:
            raise BadRequestError("chunking needs batch_format 2")
        self._chunking = bool(chunking_enabled)
        self.schema = schema  # a streamlib.schema.Schema: send() takes its objects
        if initial_sequence_id is not None and (
            not isinstance(initial_sequence_id, int) or initial_sequence_id < -1
        ):
            raise BadRequestError(
                f"initial_sequence_id must be an int >= -1: {initial_sequence_id!r}"
            )
        # The last sequence id given (Pulsar's: the next message gets one more). The
        # client sets it from the stream's last message when the option is not given.
        self.last_sequence_id = -1 if initial_sequence_id is None else initial_sequence_id
        # Where sends went, by sequence id (the last RECENT_IDS, and `recent`: the
        # stream's last entry when the producer was made): a resend of one of them is
        # answered with the original's id, and stored nothing. Sends in flight, too.
        self._recent: collections.OrderedDict[int, MessageId] = collections.OrderedDict(
            sorted((recent or {}).items())
        )
        self._unsettled: dict[int, Outcome] = {}
        self._appender: Appender = (
            WriterAppender(appender) if isinstance(appender, StreamWriter) else appender
        )
        self.stream = self._appender.name
        self._max_messages = batching_max_messages
        self._max_bytes = min(batching_max_bytes, MAX_ENTRY_BYTES)
        self._delay_s = batching_max_publish_delay_ms / 1000.0
        self._max_pending = max_pending_messages
        self._block = block_if_queue_full
        self._batch = _Batch(BatchBuilder(), [])
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight = 0  # entries appended and not yet settled
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False
        # Counted for client.stats() and the client's Prometheus collector.
        self.sent = 0
        self.send_errors = 0
        self.duplicates = 0  # resends answered with the original's id
        self.latency_sum_s = 0.0  # send to durable, summed over the messages sent

    @property
    def max_pending_messages(self) -> int:
        return self._max_pending

    @property
    def block_if_queue_full(self) -> bool:
        return self._block

    @property
    def chunking_enabled(self) -> bool:
        return self._chunking

    @property
    def pending_messages(self) -> int:
        """Messages sent and not yet durable (or failed)."""
        return self._pending

    def next_partitions_turn(self) -> bool:
        """(A partitioned stream's round robin) whether the next message without a key
        goes to the next partition: when this one's open batch is about full, or it is
        idle -- a batch at a time keeps batching; an idle partition gets work at once."""
        return self._batch.messages.size >= self._max_bytes // 2 or not self._in_flight

    @staticmethod
    def check_options(**options: Any) -> None:
        """The checks of the constructor, before anything starts (a producer takes the
        stream over: a typo must not fence the current writer). BadRequestError, or
        TypeError for an option that does not exist."""
        bound = inspect.signature(Producer).bind(None, **options)
        bound.apply_defaults()
        given = bound.arguments
        _check(
            given["batching_max_messages"],
            given["batching_max_bytes"],
            given["batching_max_publish_delay_ms"],
            given["max_pending_messages"],
            given["batch_format"],
            given["compression_type"],
        )

    async def send_async(
        self,
        data: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_time: int | float | dt.datetime | None = None,
        deliver_after: int | float | dt.timedelta | None = None,
        deliver_at: int | float | dt.datetime | None = None,
        sequence_id: int | None = None,
        ordering_key: bytes | str | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue a message (waiting for room if the queue is full and blocking is on);
        the returned future gives its MessageId once the entry holding it is durable.
        deliver_after (ms or a timedelta) or deliver_at (epoch ms or a datetime): the
        subscriptions' consumers hold the message until then (readers do not).
        sequence_id: given, a resend of one already sent is acknowledged with the
        original's id and stored nothing (Pulsar's deduplication). ordering_key: what
        key_shared dispatch orders by, over the key (Pulsar's)."""
        if self.schema is not None:
            data = self.schema.encode(data)
        return await self.send_checked(
            self._checked(
                data, key, properties, event_time, deliver_after, deliver_at, self._chunking,
                ordering_key,
            ),
            sequence_id,
        )  # fmt: skip

    async def send_checked(
        self, checked: Checked, sequence_id: int | None = None
    ) -> asyncio.Future[MessageId]:
        """send_async of a message _checked() already."""
        await self.wait_for_room()
        return self.queue_checked(checked, sequence_id)

    async def wait_for_room(self) -> None:
        """Return once fewer than max_pending_messages are pending (at once when the
        producer is closed); ProducerQueueIsFullError instead of waiting when
        block_if_queue_full is off."""
        while self._pending >= self._max_pending and not self._closed:
            if not self._block:
                raise ProducerQueueIsFullError(
                    f"{self._pending} messages pending on {self.stream!r} (max_pending_messages)"
                )
            self._room.clear()
            await self._room.wait()

    @overload
    def queue_checked(
        self, checked: Checked, sequence_id: int | None = None, producer: str = ""
    ) -> asyncio.Future[MessageId]: ...

    @overload
    def queue_checked(
        self, checked: Checked, sequence_id: int | None, producer: str, outcome: Outcome | None
    ) -> Outcome: ...

    def queue_checked(
        self,
        checked: Checked,
        sequence_id: int | None = None,
        producer: str = "",
        outcome: Outcome | None = None,
    ) -> Outcome:
        """Add a _checked() message to the open batch now, room or not (the blocking API
        checks in the caller's thread and bounds what is pending there). producer: the
        name of the producer it came from, stored with it (a broker's, for dedup).
        outcome: what to settle (else a new asyncio future); the answer is what settles:
        outcome, or a resend's original."""
        if self._closed:
            raise ClientClosedError(f"producer of {self.stream!r} is closed")
        data, event_ms, metadata, deliver_ms = checked
        if deliver_ms and self._format == 1:
            raise BadRequestError("delayed delivery needs batch_format 2")
        if sequence_id is None:
            sequence = self.last_sequence_id + 1
        elif (
            isinstance(sequence_id, int) and not isinstance(sequence_id, bool) and sequence_id >= 0
        ):
            sequence = sequence_id
            if sequence <= self.last_sequence_id:
                return self._resent(sequence, outcome)
        else:
            raise BadRequestError(f"sequence_id must be an int >= 0, got {sequence_id!r}")
        self.last_sequence_id = sequence
        size = message_size(data, metadata)
        if size > MAX_MESSAGE_BYTES:  # (_checked let it through: this producer chunks)
            return self._send_chunked(
                data, event_ms, metadata, deliver_ms, sequence, producer or self.producer_name
            )
        if self._batch.messages and self._batch.messages.size + size > self._max_bytes:
            self._seal()
        future = outcome if outcome is not None else asyncio.get_running_loop().create_future()
        messages = self._batch.messages
        if not messages:
            self._batch.started = time.monotonic()
        messages.add(
            data, now_ms(), event_ms, metadata, deliver_ms, sequence, producer or self.producer_name
        )
        self._batch.futures.append(future)
        self._unsettled[sequence] = future
        self._pending += 1
        # Adaptive batching (Nagle / Kafka's linger, as the journal's group commit): with
        # nothing in flight a message goes at once -- waiting would only add latency;
        # while entries are in flight, messages gather until the batch is full, the
        # delay passes, or the entries in flight are all acknowledged (_settle).
        if (
            len(messages) >= self._max_messages
            or messages.size >= self._max_bytes
            or self._in_flight == 0
        ):
            self._seal()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay_s, self._seal)
        return future

    def _resent(self, sequence: int, outcome: Outcome | None) -> Outcome:
        """A send of a sequence id already sent (Pulsar's deduplication): acknowledged
        with the original's id -- when it is still in flight, once it is durable (its
        original's outcome is the answer) -- and stored nothing. EARLIEST when the
        original is too old to remember."""
        self.duplicates += 1
        original = self._unsettled.get(sequence)
        if original is not None:
            if outcome is None and not isinstance(original, asyncio.Future):
                return asyncio.wrap_future(original)  # type: ignore[arg-type]
            return original
        future = outcome if outcome is not None else asyncio.get_running_loop().create_future()
        future.set_result(self._recent.get(sequence, EARLIEST))
        return future

    async def send(
        self,
        data: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_time: int | float | dt.datetime | None = None,
        deliver_after: int | float | dt.timedelta | None = None,
        deliver_at: int | float | dt.datetime | None = None,
        sequence_id: int | None = None,
        ordering_key: bytes | str | None = None,
    ) -> MessageId:
        """Send one message and wait until it is durable; its MessageId."""
        return await (
            await self.send_async(
                data, key, properties, event_time, deliver_after, deliver_at, sequence_id,
                ordering_key,
            )
        )  # fmt: skip

    @staticmethod
    def _checked(
        data: bytes,
        key: str | None,
        properties: Mapping[str, str] | None,
        event_time: int | float | dt.datetime | None,
        deliver_after: int | float | dt.timedelta | None = None,
        deliver_at: int | float | dt.datetime | None = None,
        chunking: bool = False,
        ordering_key: bytes | str | None = None,
    ) -> Checked:
        """(payload, event time in ms or 0, key and properties as stored, delivery time
        in epoch ms or 0)."""
        if not isinstance(data, bytes):
            if not isinstance(data, bytearray | memoryview):
                raise BadRequestError(f"message data must be bytes, got {type(data).__name__}")
            data = bytes(data)
        if key is not None and not isinstance(key, str):
            raise BadRequestError(f"key must be a str, got {type(key).__name__}")
        if properties and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
        ):
            raise BadRequestError("properties map str to str")
        metadata = metadata_of(key, properties, ordering_key)
        size = message_size(data, metadata)
        if size > MAX_MESSAGE_BYTES and not chunking:
            raise TooLargeError(
                f"message of {size} bytes with its key and properties is over the "
                f"{MAX_MESSAGE_BYTES}-byte entry limit: create the producer with "
                f"chunking_enabled=True to send it in pieces"
            )
        if size > MAX_MESSAGE_BYTES and (
            (metadata is not None and metadata.ByteSize() > MAX_CHUNKED_METADATA_BYTES)
            or len(data) > MAX_CHUNKED_MESSAGE_BYTES
        ):
            raise TooLargeError(
                f"message of {size} bytes with its key and properties is over the limits "
                f"({MAX_MESSAGE_BYTES} bytes in one entry; chunked: "
                f"{MAX_CHUNKED_MESSAGE_BYTES} bytes with at most {MAX_CHUNKED_METADATA_BYTES} "
                f"of key and properties)"
            )
        return (
            data,
            _millis(event_time, "event_time"),
            metadata,
            _deliver_ms(deliver_after, deliver_at),
        )

    def _seal(self) -> None:
        """Turn the open batch into one entry."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch = self._batch, _Batch(BatchBuilder(), [])
        if not batch.messages:
            return
        self._append(
            batch, lambda: compress(batch.messages.encode(self._format), self._compression)
        )

    def _append(self, batch: _Batch, encode: Callable[[], bytes]) -> None:
        """Append one entry; its batch's sends settle with it."""
        self._in_flight += 1
        sequence_ids = batch.messages.sequence_ids
        try:
            entry = self._appender.append_entry(
                encode(), sequence_ids[0], sequence_ids[-1], len(sequence_ids)
            )
        except Exception as error:  # every send of the batch gets this outcome
            self._settle(batch, error=error)
            return
        entry.add_done_callback(lambda done: self._settle(batch, done=done))

    def _send_chunked(
        self,
        data: bytes,
        event_ms: int,
        metadata: envelope.Metadata | None,
        deliver_ms: int,
        sequence: int,
        producer: str = "",
    ) -> asyncio.Future[MessageId]:
        """A message too large for one entry, as consecutive format 4 entries of at most
        CHUNK_BYTES of it each (what gathered before goes first). Its MessageId is the
        last piece's, once every piece is durable: a piece that fails fails the writer,
        and with it every later append."""
        self._seal()
        future: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        self._pending += 1
        self._unsettled[sequence] = future
        message_uuid = uuid.uuid4().hex
        count = -(-len(data) // CHUNK_BYTES)
        published = now_ms()
        for index in range(count):
            piece = BatchBuilder()
            piece.add(data[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES], published,
                      event_ms, metadata, deliver_ms, sequence, producer)  # fmt: skip
            batch = _Batch(
                piece, [future] if index == count - 1 else [], time.monotonic(), chunked=True
            )
            self._append(
                batch, functools.partial(piece.encode_chunk, message_uuid, index, count, len(data))
            )
        return future

    def _settle(
        self,
        batch: _Batch,
        done: asyncio.Future[tuple[int, int]] | None = None,
        error: BaseException | None = None,
    ) -> None:
        if done is not None:
            error = (
                StreamlibError(f"stream {self.stream!r}: the send was cancelled")
                if done.cancelled()
                else done.exception()
            )
        futures = batch.futures
        sequence_ids = (
            batch.messages.sequence_ids[-1:] if batch.chunked else batch.messages.sequence_ids
        )
        unsettled = self._unsettled
        if futures:  # (a chunked message's earlier pieces settle no send)
            for sequence in sequence_ids:
                unsettled.pop(sequence, None)
        positions: list[MessageId] = []
        recent = self._recent
        if error is None and futures:
            assert done is not None
            ledger_id, entry_id = done.result()
            if ledger_id < 0:  # (stored before, where nobody remembers: no place)
                positions = [EARLIEST] * len(futures)
            else:
                positions = [MessageId(ledger_id, entry_id, i) for i in range(len(futures))]
            recent.update(zip(sequence_ids, positions, strict=True))
        # (The blocking API's futures settle together: one taking of their lock.)
        settle_all = getattr(futures[0], "settle_all", None) if futures else None
        if settle_all is not None:
            settle_all(futures, positions, error)
        else:
            for index, future in enumerate(futures):
                if future.done():
                    continue
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(positions[index])
        if len(recent) > RECENT_IDS:
            for _ in range(len(recent) - RECENT_IDS):
                recent.popitem(last=False)
        settled = len(batch.futures)
        if error is not None:
            self.send_errors += settled
        elif settled:
            self.sent += settled
            self.latency_sum_s += settled * (time.monotonic() - batch.started)
        self._pending -= settled
        self._room.set()
        self._in_flight -= 1
        if self._in_flight == 0 and self._batch.messages and not self._closed:
            self._seal()  # what gathered while the others were in flight goes now

    async def flush(self) -> None:
        """Send the open batch now and wait until everything sent is durable."""
        self._seal()
        await self._appender.flush()
        # The sends settled on the way here; their futures' done-callbacks are queued
        # on the loop ahead of this task: one turn lets them run before flush returns.
        await asyncio.sleep(0)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._seal()
        await self._appender.close()
