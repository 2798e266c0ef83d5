"""A message as consumers and readers see it: an index into its entry's decoded
columns (EntryMessages), the entry's messages sharing them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from streamlib.stream.batch import BatchBuilder, DecodedBatch, decode_batch
from streamlib.stream.batch import MessageDecodeError as MessageDecodeError  # (its old home)
from streamlib.stream.positions import EARLIEST, MessageId


class Message:
    """One message as consumers see it: an index into its entry's decoded columns (the
    entry's messages share them). Reading many messages costs little until they are
    looked at; its position is computed when asked for.

    Its fields are properties (``message.data``, ``message.key``); the methods with
    pulsar-client's names (``partition_key()``, ``ordering_key()``,
    ``publish_timestamp()``, ``event_timestamp()``, ``topic_name()``) are there for code
    written against pulsar-client. Where pulsar-client has a method of a field's own name
    (``data()``, ``properties()``, ``message_id()``, ``redelivery_count()``,
    ``producer_name()``) streamlib keeps the property: drop the parentheses."""

    # Made by new_message. _prev is None when the entry implies it; _id until asked for.
    __slots__ = ("_entry", "_id", "_index", "_prev", "_redeliveries")

    _entry: EntryMessages
    _id: MessageId | None
    _index: int
    _prev: MessageId | None
    _redeliveries: int

    @property
    def stream(self) -> str:
        return self._entry.stream

    @property
    def message_id(self) -> MessageId:
        found = self._id
        if found is None:
            entry = self._entry
            found = self._id = _new_id(MessageId, (entry.ledger_id, entry.entry_id, self._index))
        return found

    @property
    def previous(self) -> MessageId:
        """The message delivered before this one (cursor ranges)."""
        if self._prev is not None:
            return self._prev
        entry = self._entry
        if self._index == entry.start:
            return entry.previous
        return _new_id(MessageId, (entry.ledger_id, entry.entry_id, self._index - 1))

    @previous.setter
    def previous(self, value: MessageId) -> None:
        self._prev = value

    @property
    def redelivery_count(self) -> int:
        return self._redeliveries

    @property
    def data(self) -> bytes:
        return self._entry.payloads[self._index]

    @property
    def key(self) -> str | None:
        metadata = self._entry.metadata
        if metadata is None:
            return None
        mine = metadata[self._index]
        return mine.key if mine.HasField("key") else None

    @property
    def properties(self) -> dict[str, str]:
        metadata = self._entry.metadata
        return {} if metadata is None else dict(metadata[self._index].properties)

    @property
    def publish_time_ms(self) -> int:
        return self._entry.publish_times[self._index]

    @property
    def event_time_ms(self) -> int:
        """0 when the producer set none."""
        events = self._entry.event_times
        return 0 if events is None else events[self._index]

    def value(self) -> Any:
        """The message decoded with the consumer's or reader's schema (its bytes when it
        has none); SchemaDecodeError if they do not decode."""
        schema = self._entry.schema
        return self.data if schema is None else schema.decode(self.data)

    def ordering_key(self) -> bytes | None:
        """Pulsar's ordering key (None when the producer set none): what key_shared's
        slot is hashed from when set, over the key (dispatch.key_slot). pulsar-client
        returns it as str, '' for none; here it is the bytes stored, as on Pulsar's wire."""
        metadata = self._entry.metadata
        if metadata is None:
            return None
        mine = metadata[self._index]
        return mine.ordering_key if mine.HasField("ordering_key") else None

    # pulsar-client's names for the properties above (methods there).

    def partition_key(self) -> str | None:
        """The key (pulsar-client's name; it returns '' where this returns None)."""
        return self.key

    def publish_timestamp(self) -> int:
        """publish_time_ms (pulsar-client's name)."""
        return self.publish_time_ms

    def event_timestamp(self) -> int:
        """event_time_ms, 0 when the producer set none (pulsar-client's name)."""
        return self.event_time_ms

    def topic_name(self) -> str:
        """The stream (pulsar-client's name)."""
        return self.stream

    @property
    def sequence_id(self) -> int:
        """The producer's sequence id of this message (-1: it has none)."""
        ids = self._entry.sequence_ids
        return -1 if ids is None else ids[self._index]

    @property
    def producer_name(self) -> str:
        """The name of the producer that sent it through a broker ("": not named)."""
        producers = self._entry.producers
        return "" if producers is None else producers[self._index]

    def has_null_value(self) -> bool:
        """Whether it is a null value (a tombstone, its data empty): only a Pulsar
        producer sends them (pulsar-client's name)."""
        nulls = self._entry.null_values
        return False if nulls is None else nulls[self._index]

    @property
    def deliver_at_ms(self) -> int:
        """When a subscription may deliver it (epoch ms); 0: at once."""
        deliver_at = self._entry.deliver_at
        return 0 if deliver_at is None else deliver_at[self._index]

    def redelivered(self) -> Message:
        """The same message, delivered once more."""
        again = new_message(self._entry, self._index)
        again._prev = self.previous
        again._redeliveries = self._redeliveries + 1
        return again

    def __repr__(self) -> str:
        return f"Message({self.stream!r}, {self.message_id}, {self.data[:40]!r})"


_new_id = tuple.__new__
_new = object.__new__


def new_message(entry: EntryMessages, index: int) -> Message:
    message: Message = _new(Message)
    message._entry = entry
    message._index = index
    message._id = None
    message._prev = None
    message._redeliveries = 0
    return message


class EntryMessages:
    """The messages of one entry from index `start` on (those after the reader's start),
    made into Message objects only as they are taken: a read-ahead buffer holds one of
    these per entry, not one object per message."""

    __slots__ = (
        "chunk",
        "compacted",
        "deliver_at",
        "entry_id",
        "event_times",
        "ledger_id",
        "metadata",
        "null_values",
        "payloads",
        "previous",
        "producers",
        "publish_times",
        "pulsar",
        "raw",
        "schema",
        "sequence_ids",
        "start",
        "stream",
    )

    def __init__(
        self,
        stream: str,
        ledger_id: int,
        entry_id: int,
        batch: DecodedBatch,
        previous: MessageId,
        start: int = 0,
    ) -> None:
        self.stream = stream
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        (
            self.payloads,
            self.publish_times,
            self.event_times,
            self.metadata,
            self.deliver_at,
            self.chunk,
            self.sequence_ids,
            self.producers,
            self.null_values,
        ) = batch
        self.previous = previous  # the position before message `start`
        self.start = start
        self.schema: Any = None  # what Message.value() decodes with (the reader's)
        # The entry as stored, when the reader keeps it (a broker sends it on as it is):
        # then its payloads are empty (but a chunk's piece's).
        self.raw: bytes | None = None
        # ... and in Pulsar's format, once a broker's Pulsar consumer needed it.
        self.pulsar: bytes | None = None
        # From a compacted view (streamlib/stream/compacted.py): the messages before
        # `start` are places kept for the ids, never messages to hand on.
        self.compacted = False

    def __len__(self) -> int:
        return len(self.payloads) - self.start

    def __iter__(self) -> Iterator[Message]:
        return map(new_message, itertools.repeat(self), range(self.start, len(self.payloads)))

    @property
    def last_id(self) -> MessageId:
        return MessageId(self.ledger_id, self.entry_id, len(self.payloads) - 1)

    def stored(self) -> bytes:
        """The entry as the stream stores it: its bytes as read (kept: .raw), or, for a
        chunked message put together from its pieces, the message as one entry."""
        if self.raw is None:
            builder = BatchBuilder()
            for i in range(len(self.payloads)):
                self.add_to(builder, i)
            self.raw = builder.encode()
        return self.raw

    def add_to(self, builder: BatchBuilder, index: int) -> None:
        """Message `index` of the entry, added to a batch as it was stored."""
        builder.add(
            self.payloads[index],
            self.publish_times[index],
            self.event_times[index] if self.event_times else 0,
            self.metadata[index] if self.metadata else None,  # type: ignore[arg-type]
            self.deliver_at[index] if self.deliver_at else 0,
            self.sequence_ids[index] if self.sequence_ids else -1,
            self.producers[index] if self.producers else "",
        )


def entry_messages(
    stream: str,
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    previous: MessageId,
    after: MessageId = EARLIEST,
    keep_raw: bool = False,
) -> EntryMessages | None:
    """The messages of an entry that come after `after` (None if none do); `previous`
    is the position before the entry's first message. keep_raw: keep the entry's bytes
    (.raw) instead of its payloads (empty then: a broker hands the entry on as stored)."""
    if (ledger_id, entry_id) < (after.ledger_id, after.entry_id):
        return None
    where = f"stream {stream!r} ledger {ledger_id} entry {entry_id}"
    batch = decode_batch(payload, where, payloads=not keep_raw)
    start = 0
    if (ledger_id, entry_id) == (after.ledger_id, after.entry_id) and after.batch_index >= 0:
        start = after.batch_index + 1
        previous = after
    if start >= len(batch.payloads):
        return None
    entry = EntryMessages(stream, ledger_id, entry_id, batch, previous, start)
    if keep_raw:
        entry.raw = payload
    return entry


def decode_entry(
    stream: str, ledger_id: int, entry_id: int, payload: bytes, previous: MessageId
) -> list[Message]:
    """All the messages of an entry."""
    entry = entry_messages(stream, ledger_id, entry_id, payload, previous)
    return [] if entry is None else list(entry)
