"""Pulsar's entry format beside streamlib's: a Pulsar producer's entries read as streamlib
reads its own (decode, through streamlib.stream.batch.decode_batch), and streamlib's
entries written as Pulsar's for Pulsar consumers (to_pulsar).

A Pulsar broker stores what a producer's SEND carries from its magic number on -- its
"headers and payload" -- and so does streamlib's broker:

    [0x0e01][CRC32C of the rest: u32 BE][metadata size: u32 BE][MessageMetadata][payload]

The payload is one message; or, when the metadata has num_messages_in_batch = n, a batch:
once decompressed (metadata.compression, to uncompressed_size bytes), n times
[u32 BE size][SingleMessageMetadata][its payload_size bytes of the message]. Its first
byte, 0x0e, starts no streamlib Batch (field 1, wire type 6: there is no such type), so
decode_batch tells the formats apart by it. (A Pulsar broker configured to may put
[0x0e02][u32 BE size][BrokerEntryMetadata] ahead of it; read, not written, here.)

What each message becomes (DecodedBatch's columns):

    payload            the message's bytes (a null value: empty, and null_values says so)
    key                SingleMessageMetadata.partition_key (a lone message's: the
                       MessageMetadata's); none when null_partition_key. A key Pulsar
                       marks partition_key_b64_encoded stays the base64 text it is.
    properties         the KeyValue list as a dict (a repeated key: the last one)
    ordering key       ordering_key
    event time         event_time (0: none)
    publish time       the MessageMetadata's publish_time, every message's (Pulsar has one)
    sequence id        the message's own sequence_id, else the MessageMetadata's + its index
    producer           producer_name
    deliver at         deliver_at_time (the whole entry's)
    null value         null_value
    chunk              a lone message with num_chunks_from_msg > 1 (as the C++ client
                       decides): uuid, chunk_id, num_chunks_from_msg, total_chunk_msg_size,
                       and the compression of the whole, which Pulsar compresses before it
                       cuts it in pieces (the reader decompresses the pieces put together)

Refused (MessageDecodeError) or left out: an encrypted entry (encryption_keys) cannot be
read -- EncryptedMessageError -- but payloads=False reads it as opaque messages (a broker
stores and forwards it: see decode). A marker entry (marker_type: a Pulsar broker's own)
has no messages. Transactions (txnid_*), schema_version, replication fields and
compacted_out are not looked at.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, NamedTuple, TypeVar, overload

import crc32c
from google.protobuf.message import DecodeError

from streamlib.pulsar import PulsarApi_pb2 as pulsar_api
from streamlib.pulsar import checked_pb2 as checked
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import (
    COMPRESSED_FORMAT,
    MAX_CHUNKED_MESSAGE_BYTES,
    MAX_UNCOMPRESSED_BYTES,
    Compression,
    DecodedBatch,
    MessageDecodeError,
    compress_raw,
    decode_envelope,
    decompress,
)
from streamlib.stream.partitioned import partition_of

MAGIC = b"\x0e\x01"
BROKER_ENTRY_MAGIC = b"\x0e\x02"  # a Pulsar broker's BrokerEntryMetadata ahead of MAGIC
# The least a message of a batch takes: its metadata's size and a payload_size (a tag and a
# varint): what bounds the messages an entry of some size can claim.
MIN_BATCHED_MESSAGE_BYTES = 6

T = TypeVar("T")
_AnyMetadata = pulsar_api.MessageMetadata | pulsar_api.SingleMessageMetadata


class EncryptedMessageError(MessageDecodeError):
    """An entry a Pulsar producer encrypted: streamlib reads no encrypted messages (read it
    with a Pulsar consumer that holds the key)."""


class ChecksumError(MessageDecodeError):
    """A Pulsar entry whose CRC32C is not the one it states: damaged on its way."""


def is_pulsar_entry(entry: bytes) -> bool:
    """Whether an entry is in Pulsar's format (streamlib's never starts with 0x0e)."""
    return entry[:2] in (MAGIC, BROKER_ENTRY_MAGIC)


def headers_and_payload(metadata: pulsar_api.MessageMetadata, payload: bytes) -> bytes:
    """A Pulsar entry of this metadata and payload: magic, checksum, metadata, payload."""
    encoded = metadata.SerializeToString()
    head = len(encoded).to_bytes(4, "big") + encoded
    checksum = crc32c.crc32c(payload, crc32c.crc32c(head))  # (the payload copied once)
    return b"".join((MAGIC, checksum.to_bytes(4, "big"), head, payload))


def parse(
    entry: bytes, where: str, verify: bool = True
) -> tuple[pulsar_api.MessageMetadata, memoryview]:
    """A Pulsar entry's MessageMetadata and its payload (as stored: compressed, a batch);
    MessageDecodeError if it is not one, ChecksumError if verify and its CRC32C is wrong."""
    view = memoryview(entry)
    if view[:2] == BROKER_ENTRY_MAGIC and len(view) >= 6:
        view = view[6 + int.from_bytes(view[2:6], "big") :]
    if len(view) < 10 or view[:2] != MAGIC:
        raise MessageDecodeError(f"{where} is not a Pulsar entry (no magic number 0x0e01)")
    if verify:
        stated = int.from_bytes(view[2:6], "big")
        if crc32c.crc32c(view[6:]) != stated:
            raise ChecksumError(f"{where}: its checksum is wrong (the entry is damaged)")
    size = int.from_bytes(view[6:10], "big")
    if 10 + size > len(view):
        raise MessageDecodeError(
            f"{where}: its metadata of {size} bytes runs past its end ({len(view)} bytes)"
        )
    try:
        metadata = pulsar_api.MessageMetadata.FromString(bytes(view[10 : 10 + size]))
    except DecodeError as error:
        raise MessageDecodeError(f"{where}: its metadata is not a MessageMetadata") from error
    return metadata, view[10 + size :]


def decode(
    entry: bytes,
    where: str,
    max_uncompressed: int = MAX_UNCOMPRESSED_BYTES,
    payloads: bool = True,
) -> DecodedBatch:
    """The messages of a Pulsar entry (decode_batch's answer for one; see the module's
    docstring); MessageDecodeError naming `where` for one that is damaged or claims more
    than max_uncompressed bytes uncompressed, EncryptedMessageError for an encrypted one.

    payloads=False (a broker handing entries on as stored) costs parsing the
    MessageMetadata and no more: the checksum is not verified, a batch's messages are
    read -- decompressed and their SingleMessageMetadata parsed, once -- only when a
    column of theirs (keys, properties, event times, sequence ids, null values) is first
    looked at; then a damaged batch raises MessageDecodeError there. An encrypted entry
    is num_messages_in_batch opaque messages, without keys (a lone message keeps its
    MessageMetadata's key and properties, which are not encrypted), its sequence ids
    the MessageMetadata's onwards; an encrypted chunk's piece is one opaque message too.
    check() is what a broker runs before it stores a producer's entry."""
    metadata, body = parse(entry, where, verify=payloads)
    with _text_checked(where):
        return _decode(metadata, body, where, max_uncompressed, payloads, payloads)


def check(
    entry: bytes,
    where: str,
    max_uncompressed: int = MAX_UNCOMPRESSED_BYTES,
    verify: bool = True,
) -> DecodedBatch:
    """decode(payloads=False) of an entry a producer sent, every part of it checked now --
    its checksum (unless verify=False: the caller did), its metadata, every message of a
    batch (decompressed) -- so that what a broker stores every reader reads (an encrypted
    entry: what can be checked without its key). The columns are decode's, none of them
    lazy; the payloads are empty. About 2 us a message of a batch (decode's full read) --
    but for a batch, whose messages' metadata is only checked (checked.proto: every string
    UTF-8, every size within the batch), not made into columns: its DecodedBatch has the
    columns a broker checks a producer's entry by -- the messages' number, sequence ids,
    producer, publish and delivery times -- and no others; about 0.7 us a message."""
    metadata, body = parse(entry, where, verify)
    with _text_checked(where):
        return _decode(metadata, body, where, max_uncompressed, False, True, checking=True)


@contextlib.contextmanager
def _text_checked(where: str) -> Iterator[None]:
    """MessageDecodeError for a text field that is not UTF-8 (proto2's strings are checked
    only when read, here as they are made into streamlib's)."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise MessageDecodeError(f"{where}: a text field of its metadata is not UTF-8") from error


def _decode(
    metadata: pulsar_api.MessageMetadata,
    body: memoryview,
    where: str,
    max_bytes: int,
    payloads: bool,
    eager: bool,
    checking: bool = False,
) -> DecodedBatch:
    if metadata.HasField("marker_type"):
        return DecodedBatch([], [], None, None)  # (a Pulsar broker's own: no message)
    encrypted = len(metadata.encryption_keys) > 0
    if encrypted and payloads:
        raise EncryptedMessageError(
            f"{where} is encrypted by a Pulsar producer; streamlib reads no encrypted messages"
        )
    if not metadata.HasField("num_messages_in_batch"):
        return _lone(metadata, body, where, max_bytes, payloads, eager, encrypted)
    count = metadata.num_messages_in_batch
    compressed = metadata.compression != pulsar_api.NONE
    room = metadata.uncompressed_size if compressed else len(body)
    if count < 1 or count * MIN_BATCHED_MESSAGE_BYTES > min(room, max_bytes):
        raise MessageDecodeError(
            f"{where}: a batch of {count} messages in {room} bytes (at most {max_bytes})"
        )
    publish = [signed(metadata.publish_time)] * count
    deliver_at = [metadata.deliver_at_time] * count if metadata.deliver_at_time > 0 else None
    producers = [metadata.producer_name] * count if metadata.producer_name else None
    if encrypted or (eager and checking):
        # (Encrypted: opaque messages. The broker's check: the messages' metadata checked,
        # not made into columns.)
        ids: Sequence[int]
        if encrypted:
            first = signed(metadata.sequence_id)
            ids = range(first, first + count)
        else:
            data = _uncompressed(metadata, body, where, max_bytes)
            _, singles = _walk(data, count, where, False, checked.SingleMessageMetadata.FromString)
            ids = _sequence_ids(metadata, singles)
        return DecodedBatch([b""] * count, publish, None, None, deliver_at, None, ids, producers)
    if eager:
        data = _uncompressed(metadata, body, where, max_bytes)
        found, singles = _walk(data, count, where, payloads)
        columns = _columns(metadata, singles)
    else:
        found = []
        columns = _lazy_columns(_Singles(metadata, body, where, max_bytes, count))
    return DecodedBatch(
        found if payloads else [b""] * count,
        publish,
        columns.event_times,
        columns.metadata,
        deliver_at,
        None,
        columns.sequence_ids,
        producers,
        columns.null_values,
    )


def _lone(
    metadata: pulsar_api.MessageMetadata,
    body: memoryview,
    where: str,
    max_bytes: int,
    payloads: bool,
    eager: bool,
    encrypted: bool,
) -> DecodedBatch:
    """A Pulsar entry of one message (num_messages_in_batch not set), or a chunk's piece."""
    chunk = None if encrypted else _chunk(metadata, body, where)
    data = b""
    if chunk is not None:
        data = bytes(body)  # (a piece keeps its own: the reader puts them together)
    elif payloads:
        data = bytes(_uncompressed(metadata, body, where, max_bytes))
    elif eager and not encrypted:  # (check: that it decompresses)
        _uncompressed(metadata, body, where, max_bytes)
    one = _metadata(metadata)
    return DecodedBatch(
        [data],
        [signed(metadata.publish_time)],
        [signed(metadata.event_time)] if metadata.event_time else None,
        None if one is None else [one],
        [metadata.deliver_at_time] if metadata.deliver_at_time > 0 else None,
        chunk,
        [signed(metadata.sequence_id)],
        [metadata.producer_name] if metadata.producer_name else None,
        [True] if metadata.null_value else None,
    )


def _chunk(
    metadata: pulsar_api.MessageMetadata, body: memoryview, where: str
) -> envelope.Chunk | None:
    """A chunked message's piece (None: the entry is no piece)."""
    count = metadata.num_chunks_from_msg
    if count <= 1:  # (one piece: the whole message, as the C++ client reads it)
        return None
    index, total = metadata.chunk_id, metadata.total_chunk_msg_size
    compressed = metadata.compression != pulsar_api.NONE
    if (
        not metadata.uuid
        or not 0 <= index < count
        or not 0 < total <= MAX_CHUNKED_MESSAGE_BYTES
        or len(body) > total
        or (compressed and metadata.uncompressed_size > MAX_CHUNKED_MESSAGE_BYTES)
    ):
        raise MessageDecodeError(f"{where}: not a well-formed piece of a chunked message")
    return envelope.Chunk(
        uuid=metadata.uuid,
        index=index,
        count=count,
        total_size=total,
        compression=metadata.compression,
        uncompressed_size=metadata.uncompressed_size if compressed else 0,
    )


def _uncompressed(
    metadata: pulsar_api.MessageMetadata, body: memoryview, where: str, max_bytes: int
) -> bytes | memoryview:
    if metadata.compression == pulsar_api.NONE:
        return body
    return decompress(metadata.compression, body, metadata.uncompressed_size, where, max_bytes)


_SIZE = struct.Struct(">I")


def _walk(
    data: bytes | memoryview,
    count: int,
    where: str,
    keep: bool,
    parse_single: Callable[[bytes], Any] = pulsar_api.SingleMessageMetadata.FromString,
) -> tuple[list[bytes], list[Any]]:
    """A batch's messages: their payloads (if keep) and SingleMessageMetadata (parsed by
    parse_single: Pulsar's proto2, or checked.proto's proto3, which checks its text)."""
    data = bytes(data)  # (one copy; slicing it is then cheaper than a memoryview's)
    payloads: list[bytes] = []
    singles: list[pulsar_api.SingleMessageMetadata] = []
    size_at = _SIZE.unpack_from
    end = len(data)
    at = 0
    for index in range(count):
        if at + 4 > end:
            raise MessageDecodeError(f"{where}: its batch ends before message {index}")
        (size,) = size_at(data, at)
        at += 4
        if at + size > end:
            raise MessageDecodeError(f"{where}: its batch ends inside message {index}")
        try:
            single = parse_single(data[at : at + size])
        except DecodeError as error:
            raise MessageDecodeError(
                f"{where}: message {index} of its batch has no SingleMessageMetadata (or "
                "a text field of it is not UTF-8)"
            ) from error
        at += size
        length = single.payload_size
        if length < 0 or at + length > end:
            raise MessageDecodeError(f"{where}: its batch ends inside message {index}")
        if keep:
            payloads.append(data[at : at + length])
        at += length
        singles.append(single)
    if at != end:
        raise MessageDecodeError(f"{where}: {end - at} bytes follow the {count} messages it holds")
    return payloads, singles


class _Columns(NamedTuple):
    """What a batch's SingleMessageMetadata give, by column (None: no message has one)."""

    metadata: Sequence[envelope.Metadata] | None
    event_times: Sequence[int] | None
    sequence_ids: Sequence[int]
    null_values: Sequence[bool] | None


_NO_METADATA = envelope.Metadata()  # (a message without key, properties or ordering key)


def _columns(
    metadata: pulsar_api.MessageMetadata, singles: Sequence[pulsar_api.SingleMessageMetadata]
) -> _Columns:
    keyed = [_metadata(single) for single in singles]
    events = [signed(single.event_time) for single in singles]
    nulls = [single.null_value for single in singles]
    return _Columns(
        [_NO_METADATA if m is None else m for m in keyed]
        if any(m is not None for m in keyed)
        else None,
        events if any(events) else None,
        _sequence_ids(metadata, singles),
        nulls if any(nulls) else None,
    )


def _sequence_ids(metadata: pulsar_api.MessageMetadata, singles: Sequence[Any]) -> Sequence[int]:
    """Each message's sequence id: its own, else the batch's first plus its index (a
    range when they are consecutive)."""
    first = signed(metadata.sequence_id)
    ids = [
        signed(single.sequence_id) if single.HasField("sequence_id") else first + index
        for index, single in enumerate(singles)
    ]
    return range(ids[0], ids[0] + len(ids)) if _consecutive(ids) else ids


def _consecutive(ids: list[int]) -> bool:
    return ids[-1] - ids[0] == len(ids) - 1 and all(b == a + 1 for a, b in itertools.pairwise(ids))


def _metadata(message: _AnyMetadata) -> envelope.Metadata | None:
    """A message's key, properties and ordering key as streamlib's (None: it has none)."""
    has_key = message.HasField("partition_key") and not message.null_partition_key
    has_ordering = message.HasField("ordering_key")
    properties = message.properties
    if not (has_key or has_ordering or properties):
        return None
    # (Set one by one: the constructor's properties= costs a microsecond even when empty.)
    found = envelope.Metadata(key=message.partition_key) if has_key else envelope.Metadata()
    if has_ordering:
        found.ordering_key = message.ordering_key
    if properties:
        into = found.properties
        for pair in properties:
            into[pair.key] = pair.value
    return found


def signed(value: int) -> int:
    """A uint64 as the int64 it is to Java clients (streamlib's columns are int64)."""
    return value - (1 << 64) if value >= 1 << 63 else value


class _Singles:
    """A batch's SingleMessageMetadata, read when a column of them is first looked at:
    a broker dispatching an entry whole never does."""

    __slots__ = ("_body", "_columns", "_max_bytes", "_metadata", "_where", "count")

    def __init__(
        self,
        metadata: pulsar_api.MessageMetadata,
        body: memoryview,
        where: str,
        max_bytes: int,
        count: int,
    ) -> None:
        self._metadata = metadata
        self._body: memoryview | None = body
        self._where = where
        self._max_bytes = max_bytes
        self.count = count
        self._columns: _Columns | None = None

    def columns(self) -> _Columns:
        found = self._columns
        if found is None:
            assert self._body is not None
            data = _uncompressed(self._metadata, self._body, self._where, self._max_bytes)
            _, singles = _walk(data, self.count, self._where, keep=False)
            with _text_checked(self._where):
                found = self._columns = _columns(self._metadata, singles)
            self._body = None  # (the entry is the broker's to keep or drop)
        return found


class _Lazy(Sequence[T], Generic[T]):
    """One column of a batch's messages, read from their SingleMessageMetadata when first
    looked at; `default` for each when no message has one."""

    __slots__ = ("_default", "_pick", "_singles")

    def __init__(
        self, singles: _Singles, pick: Callable[[_Columns], Sequence[T] | None], default: T
    ) -> None:
        self._singles = singles
        self._pick = pick
        self._default = default

    def __len__(self) -> int:
        return self._singles.count

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        column = self._pick(self._singles.columns())
        if column is not None:
            return column[index]
        count = self._singles.count
        if isinstance(index, slice):
            return [self._default] * len(range(*index.indices(count)))
        if not -count <= index < count:
            raise IndexError(index)
        return self._default


def _lazy_columns(singles: _Singles) -> _Columns:
    return _Columns(
        _Lazy(singles, operator.attrgetter("metadata"), _NO_METADATA),
        _Lazy(singles, operator.attrgetter("event_times"), 0),
        _Lazy(singles, operator.attrgetter("sequence_ids"), -1),
        _Lazy(singles, operator.attrgetter("null_values"), False),
    )


# -- streamlib's entries as Pulsar's ----------------------------------------------------


def to_pulsar(entry: bytes, where: str, compression: Compression | None = None) -> bytes:
    """An entry as a Pulsar consumer reads it: a Pulsar entry as it is (from its magic
    number on), a streamlib one made one by encode(). compression: what its payload is
    compressed with; None: the entry's own (a format 3 entry's codec, else none), so a
    Pulsar entry is about the size of the stored one -- Pulsar clients refuse a
    compressed payload over their max message size, and the Java client any frame over
    it, which a 5 MiB entry decompressed could be."""
    if entry[:1] == MAGIC[:1]:
        parse(entry, where, verify=False)  # (MessageDecodeError if it is not one)
        return bytes(entry) if entry[:2] == MAGIC else _from_magic(entry)
    try:
        batch = envelope.Batch.FromString(entry)
    except DecodeError as error:
        raise MessageDecodeError(f"{where} is not a message batch") from error
    decoded = decode_envelope(batch, where)
    if compression is None:
        own = batch.format_version == COMPRESSED_FORMAT
        compression = Compression(batch.compression) if own else Compression.NONE
    return encode(decoded, compression, where)


def _from_magic(entry: bytes) -> bytes:
    """The part of an entry from its Pulsar magic number on (past a BrokerEntryMetadata)."""
    return entry[6 + int.from_bytes(entry[2:6], "big") :]


def encode(
    batch: DecodedBatch, compression: Compression = Compression.NONE, where: str = "the entry"
) -> bytes:
    """A decoded batch as a Pulsar entry. Always a batch (num_messages_in_batch = n, even
    for one message), so a Pulsar consumer's message ids carry batch indexes 0..n-1, as
    streamlib's do; a chunk's piece is Pulsar's piece of a chunked message (never a batch,
    as Pulsar's). The payload is compressed with `compression` when that makes it smaller.

    What Pulsar cannot hold is lost: its one publish time and producer name per entry are
    the first message's, its one deliver_at_time the latest (each message is still
    delivered at its own time by the broker); a message's sequence id of -1 (none) is
    sent as none in the batch, and as 0 in the MessageMetadata, which requires one."""
    count = len(batch.payloads)
    if not count:
        raise MessageDecodeError(f"{where} holds no messages: a Pulsar entry holds at least one")
    ids = batch.sequence_ids
    outer = pulsar_api.MessageMetadata(
        producer_name=batch.producers[0] if batch.producers else "",
        sequence_id=max(ids[0], 0) if ids else 0,
        publish_time=max(batch.publish_times[0], 0),
    )
    if batch.deliver_at and (latest := max(batch.deliver_at)) > 0:
        outer.deliver_at_time = latest
    chunk = batch.chunk
    if chunk is not None:
        outer.uuid = chunk.uuid
        outer.chunk_id = chunk.index
        outer.num_chunks_from_msg = chunk.count
        outer.total_chunk_msg_size = chunk.total_size
        if chunk.compression:
            outer.compression = chunk.compression  # type: ignore[assignment]
            outer.uncompressed_size = chunk.uncompressed_size
        _describe(outer, batch, 0)
        return headers_and_payload(outer, batch.payloads[0])
    if count > 1 and ids and ids[-1] >= 0:
        outer.highest_sequence_id = ids[-1]
    outer.num_messages_in_batch = count
    parts: list[bytes] = []
    for index, payload in enumerate(batch.payloads):
        single = pulsar_api.SingleMessageMetadata(payload_size=len(payload))
        _describe(single, batch, index)
        if ids and ids[index] >= 0:
            single.sequence_id = ids[index]
        encoded = single.SerializeToString()
        parts += (len(encoded).to_bytes(4, "big"), encoded, payload)
    data = b"".join(parts)
    if compression is not Compression.NONE:
        packed = compress_raw(data, compression)
        if len(packed) < len(data):
            outer.compression = compression  # type: ignore[assignment]
            outer.uncompressed_size = len(data)
            data = packed
    return headers_and_payload(outer, data)


def _describe(message: _AnyMetadata, batch: DecodedBatch, index: int) -> None:
    """Set a message's key, ordering key, properties, event time and null value."""
    if batch.metadata is not None:
        mine = batch.metadata[index]
        if mine.HasField("key"):
            message.partition_key = mine.key
            message.partition_key_b64_encoded = False
        if mine.HasField("ordering_key"):
            message.ordering_key = mine.ordering_key
        if mine.properties:
            add = message.properties.add
            for key, value in mine.properties.items():
                add(key=key, value=value)
    if batch.event_times is not None and batch.event_times[index] > 0:
        message.event_time = batch.event_times[index]
    if batch.null_values is not None and batch.null_values[index]:
        message.null_value = True


# -- routing ----------------------------------------------------------------------------

_keyless = itertools.count()


def murmur3_router(message: Any, num_partitions: int) -> int:
    """A pulsar-client producer's ``message_router=``: a keyed message to the partition a
    streamlib producer sends its key to (partition_of: Pulsar's Murmur3_32Hash), one
    without a key (pulsar-client gives '' for none) round robin. Without it pulsar-client
    hashes a key with boost::hash (its C++ core's default hashing scheme, BoostHash: which
    partition depends on the Boost version it was built with), Pulsar's Java client with
    JavaStringHash: neither is streamlib's."""
    key = message.partition_key()
    if key:
        return partition_of(key, num_partitions)
    return next(_keyless) % num_partitions
