"""The entry format of a stream: a producer packs a batch of messages into one ledger
entry (`BatchBuilder`); readers unpack it (`decode_batch`).

Format 2, written now, stores the batch by columns (envelope.proto): the payloads one
after the other with their sizes, the publish times, and event times, keys and
properties only when some message of the batch has them. Unpacking it makes one bytes
object per payload and nothing else per message, which is what lets a catch-up read
keep up with more than five times the publish rate in one Python process. Format 1
(one protobuf Message per message, written before) is still read.

Upgrading: readers from before format 2 ignore the format field and see a format 2 entry
as a batch of no messages. Upgrade readers (consumers, readers, Spark jobs) first, or
have producers write format 1 meanwhile (`create_producer(..., batch_format=1)`).

Format 3 is a format 2 batch compressed (a producer's ``compression_type``: lz4, zlib,
zstd or snappy), chosen per entry: a batch that does not shrink is written as format 2.
Readers that know only formats 1 and 2 refuse a format 3 entry with MessageDecodeError
("newer than this client reads"), so upgrade readers before turning compression on;
readers from before snappy refuse a snappy entry the same way ("compression 4 is unknown").

A message's ordering key (Pulsar's) is a Metadata field: readers from before it read the
message as they did, without it.

An entry a Pulsar client wrote (through the broker's Pulsar front end) is stored as Pulsar
stores it: it starts with Pulsar's magic number 0x0e01, which no Batch can start with (0x0e
is field 1 with wire type 6, which protobuf does not have). decode_batch reads those too
(streamlib.pulsar.entries), so every reader reads a stream both kinds of client write.
"""

from __future__ import annotations

import enum
import itertools
import zlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

import cramjam
import lz4.block
import zstandard
from google.protobuf.message import DecodeError

from streamlib.protocol.errors import BadRequestError, StreamlibError
from streamlib.stream import envelope_pb2 as envelope

FORMAT = 2
COMPRESSED_FORMAT = 3
CHUNK_FORMAT = 4
# The largest message chunking carries (what a reader assembles in memory).
MAX_CHUNKED_MESSAGE_BYTES = 256 * 1024 * 1024
# The most a compressed entry may claim to hold: what a reader allocates for one entry,
# whatever a hostile or damaged entry says (entries themselves are at most 5 MiB).
MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024

# The first byte of a Pulsar entry (magic 0x0e01, or 0x0e02 ahead of a Pulsar broker's
# entry metadata): never the first of a Batch (field 1, wire type 6: no such type).
PULSAR_MAGIC_BYTE = b"\x0e"

# An upper bound of what a message adds to an entry besides its payload and metadata, in
# either format: its size (or its Message's tag, length and payload tag) and its publish
# and event times (a tag and a varint of at most 10 bytes each).
MESSAGE_OVERHEAD = 40
# ... and of what a batch adds: the tags and lengths of its columns.
BATCH_OVERHEAD = 64
# ... and a delivery time, when a message has one (a varint of at most 10 bytes, and the
# column's tag and length share).
DELIVER_AT_OVERHEAD = 12


class MessageDecodeError(StreamlibError):
    """An entry of a stream is not a message batch (written outside the stream API?)."""


class KeyAndProperties(Protocol):
    """What both formats give per message besides payload and times."""

    @property
    def key(self) -> str: ...

    @property
    def properties(self) -> Mapping[str, str]: ...

    @property
    def ordering_key(self) -> bytes: ...

    def HasField(self, field_name: str) -> bool: ...


class DecodedBatch(NamedTuple):
    payloads: list[bytes]
    publish_times: Sequence[int]
    event_times: Sequence[int] | None  # None: no message has one
    metadata: Sequence[KeyAndProperties] | None  # None: no message has a key or properties
    deliver_at: Sequence[int] | None = None  # None: no message is delayed
    chunk: envelope.Chunk | None = None  # a piece of a chunked message (format 4)
    sequence_ids: Sequence[int] | None = None  # None: no message has one (-1: this one)
    producers: Sequence[str] | None = None  # None: no message names its producer
    # Pulsar's null value (a tombstone: its payload is empty); None: no message is one.
    # Only a Pulsar producer's entries have them (streamlib's format has no column for it).
    null_values: Sequence[bool] | None = None


def metadata_of(
    key: str | None,
    properties: Mapping[str, str] | None,
    ordering_key: bytes | str | None = None,
) -> envelope.Metadata | None:
    """A message's key, properties and ordering key as stored (None when it has none of
    them). The ordering key is bytes, as on Pulsar's wire; a str (what pulsar-client's
    Python ``send(ordering_key=...)`` takes) is stored as its UTF-8."""
    if ordering_key is None:
        if key is None and not properties:
            return None
        return envelope.Metadata(key=key, properties=properties)
    if isinstance(ordering_key, str):
        ordering_key = ordering_key.encode()
    elif isinstance(ordering_key, bytearray | memoryview):
        ordering_key = bytes(ordering_key)
    elif not isinstance(ordering_key, bytes):
        raise BadRequestError(f"ordering_key is bytes or str, got {ordering_key!r:.60}")
    return envelope.Metadata(key=key, properties=properties, ordering_key=ordering_key)


def message_size(data: bytes, metadata: envelope.Metadata | None) -> int:
    """At most what one message adds to an entry."""
    if metadata is None:
        return len(data) + MESSAGE_OVERHEAD
    return len(data) + MESSAGE_OVERHEAD + metadata.ByteSize() + 6


class BatchBuilder:
    """A batch being filled (columns of plain Python values until it is encoded)."""

    __slots__ = (
        "deliver_at",
        "event_times",
        "has_deliver_at",
        "has_event_times",
        "metadata",
        "payloads",
        "producer_index",
        "producers",
        "publish_times",
        "sequence_ids",
        "size",
    )

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.publish_times: list[int] = []
        self.event_times: list[int] = []
        self.metadata: list[envelope.Metadata | None] = []
        self.has_event_times = False
        self.deliver_at: list[int] = []
        self.has_deliver_at = False
        self.sequence_ids: list[int] = []
        # A broker's batch names each message's producer (deduplication, by name and
        # sequence id): the distinct names, and each message's index among them.
        self.producers: dict[str, int] = {}
        self.producer_index: list[int] = []
        self.size = BATCH_OVERHEAD  # at least the encoded size

    def __len__(self) -> int:
        return len(self.payloads)

    def add(
        self,
        data: bytes,
        publish_time_ms: int,
        event_time_ms: int = 0,
        metadata: envelope.Metadata | None = None,
        deliver_at_ms: int = 0,
        sequence_id: int = -1,
        producer: str = "",
    ) -> None:
        if producer or self.producer_index:
            if not self.producer_index and self.payloads:  # the earlier ones had none
                self.producers[""] = 0
                self.producer_index.extend([0] * len(self.payloads))
            known = len(self.producers)
            index = self.producers.setdefault(producer, known)
            self.producer_index.append(index)
            # (an index is a varint of at most 2 bytes below 2**14; a new name adds its
            # bytes, a tag and a length)
            self.size += 2 + (len(producer.encode()) + 4 if index == known else 0)
        self.sequence_ids.append(sequence_id)
        self.payloads.append(data)
        self.publish_times.append(publish_time_ms)
        self.event_times.append(event_time_ms)
        if event_time_ms:
            self.has_event_times = True
        self.deliver_at.append(deliver_at_ms)
        if deliver_at_ms:
            self.has_deliver_at = True
        self.metadata.append(metadata)
        self.size += message_size(data, metadata) + (DELIVER_AT_OVERHEAD if deliver_at_ms else 0)

    def encode(self, version: int = FORMAT) -> bytes:
        if version == 1:
            return self._encode_format_1()
        return self._columns().SerializeToString()

    def _columns(self) -> envelope.Batch:
        """The batch as format 2 columns."""
        batch = envelope.Batch(
            format_version=FORMAT,
            payload_sizes=[len(p) for p in self.payloads],
            payloads=b"".join(self.payloads),
            publish_time_ms=self.publish_times,
        )
        if self.has_event_times:
            batch.event_time_ms.extend(self.event_times)
        if self.has_deliver_at:
            batch.deliver_at_ms.extend(self.deliver_at)
        ids = self.sequence_ids
        if ids and ids[0] >= 0 and all(b == a + 1 for a, b in itertools.pairwise(ids)):
            batch.first_sequence_id = ids[0] + 1
        elif any(i >= 0 for i in ids):
            batch.sequence_ids.extend(ids)
        if any(m is not None for m in self.metadata):
            empty = envelope.Metadata()
            batch.metadata.extend(empty if m is None else m for m in self.metadata)
        if self.producer_index:
            batch.producers.extend(self.producers)  # (a dict keeps insertion order)
            batch.producer_index.extend(self.producer_index)
        return batch

    def encode_chunk(self, uuid: str, index: int, count: int, total_size: int) -> bytes:
        """This batch -- one message's piece -- as a format 4 entry."""
        assert len(self.payloads) == 1
        batch = self._columns()
        batch.format_version = CHUNK_FORMAT
        batch.chunk.CopyFrom(
            envelope.Chunk(uuid=uuid, index=index, count=count, total_size=total_size)
        )
        return batch.SerializeToString()

    def encode_piece(self, chunk: envelope.Chunk) -> bytes:
        """This batch -- one message's piece -- as a format 4 entry with `chunk` as it
        was read (a compacted view keeps a piece as stored: streamlib.stream.compaction)."""
        assert len(self.payloads) == 1
        batch = self._columns()
        batch.format_version = CHUNK_FORMAT
        batch.chunk.CopyFrom(chunk)
        return batch.SerializeToString()

    def _encode_format_1(self) -> bytes:
        """One protobuf Message per message (what readers before format 2 know)."""
        if self.has_deliver_at:
            raise BadRequestError("delayed delivery needs batch_format 2")
        batch = envelope.Batch(format_version=1)
        for payload, publish, event, metadata in zip(
            self.payloads, self.publish_times, self.event_times, self.metadata, strict=True
        ):
            message = batch.messages.add(payload=payload, publish_time_ms=publish)
            message.event_time_ms = event
            if metadata is not None:
                if metadata.HasField("key"):
                    message.key = metadata.key
                if metadata.HasField("ordering_key"):
                    message.ordering_key = metadata.ordering_key
                message.properties.update(metadata.properties)
        return batch.SerializeToString()


class Compression(enum.IntEnum):
    """Pulsar's CompressionType numbering (stored in format 3 entries). SNAPPY is snappy's
    raw (block) format, as Pulsar's, not its framed one."""

    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4


def parse_compression(value: object) -> Compression:
    """A Compression from ours, a name ("zstd", "LZ4", "none") or anything with such a
    ``name`` (pulsar-client's CompressionType)."""
    if isinstance(value, Compression):
        return value
    text = value if isinstance(value, str) else getattr(value, "name", None)
    if isinstance(text, str) and text.upper() in Compression.__members__:
        return Compression[text.upper()]
    raise BadRequestError(
        f"compression_type is one of none, lz4, zlib, zstd, snappy; got {value!r}"
    )


def compress_raw(data: bytes, codec: Compression) -> bytes:
    """data compressed with codec as Pulsar compresses a payload (LZ4: a block, no size
    prefix; ZLIB: zlib's format, with its header; SNAPPY: raw; ZSTD: a frame)."""
    if codec is Compression.LZ4:
        return bytes(lz4.block.compress(data, store_size=False))
    if codec is Compression.ZLIB:
        return zlib.compress(data, 6)
    if codec is Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec is Compression.ZSTD:
        return bytes(zstandard.ZstdCompressor(level=3).compress(data))
    return data


def compress(encoded: bytes, codec: Compression) -> bytes:
    """The entry for a format 2 batch: compressed as format 3 when that is smaller."""
    if codec is Compression.NONE:
        return encoded
    entry = envelope.Batch(
        format_version=COMPRESSED_FORMAT,
        compression=codec,
        uncompressed_size=len(encoded),
        compressed=compress_raw(encoded, codec),
    ).SerializeToString()
    return entry if len(entry) < len(encoded) else encoded


def decompress(
    codec: int,
    data: bytes | memoryview,
    size: int,
    where: str,
    max_bytes: int = MAX_UNCOMPRESSED_BYTES,
) -> bytes:
    """data decompressed with codec (Compression's numbering: a format 3 batch's, or a
    Pulsar payload's); MessageDecodeError for anything that is not exactly the size it
    claims, or claims more than max_bytes (checked before a byte is decompressed)."""
    if size > max_bytes:
        raise MessageDecodeError(
            f"{where}: claims {size} bytes uncompressed, over the {max_bytes}-byte limit"
        )
    try:
        if codec == Compression.LZ4:
            out = lz4.block.decompress(data, uncompressed_size=size)
        elif codec == Compression.ZLIB:
            inflate = zlib.decompressobj()
            out = inflate.decompress(data, size)
            if not inflate.eof or inflate.unconsumed_tail:
                raise MessageDecodeError(f"{where}: zlib data longer than its stated size")
        elif codec == Compression.ZSTD:
            # Read at most one byte past the stated size, whatever the frame claims.
            chunks: list[bytes] = []
            want = size + 1
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                while want > 0 and (chunk := reader.read(want)):
                    chunks.append(chunk)
                    want -= len(chunk)
            out = b"".join(chunks)
        elif codec == Compression.SNAPPY:
            # A snappy block states its own length first: compare before allocating it.
            claimed = cramjam.snappy.decompress_raw_len(data)
            if claimed != size:
                raise MessageDecodeError(
                    f"{where}: its snappy data holds {claimed} bytes, not the {size} it states"
                )
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:
            raise MessageDecodeError(f"{where}: compression {codec} is unknown to this client")
    except MessageDecodeError:
        raise
    except Exception as error:  # each codec's own error for damaged data
        raise MessageDecodeError(f"{where}: its compressed data does not decompress") from error
    if len(out) != size:
        raise MessageDecodeError(
            f"{where}: decompressed to {len(out)} bytes, not the {size} it states"
        )
    return out


def uncompressed(
    payload: bytes, batch: envelope.Batch, where: str, max_bytes: int = MAX_UNCOMPRESSED_BYTES
) -> envelope.Batch:
    """The batch to read: a format 3 one decompressed (it must hold format 2, of at most
    max_bytes), else the batch itself."""
    if batch.format_version != COMPRESSED_FORMAT:
        return batch
    inner = decompress(
        batch.compression, batch.compressed, batch.uncompressed_size, where, max_bytes
    )
    try:
        found = envelope.Batch.FromString(inner)
    except DecodeError as error:
        raise MessageDecodeError(f"{where}: its compressed batch is not a batch") from error
    if found.format_version != FORMAT:
        raise MessageDecodeError(
            f"{where}: a compressed batch must hold format {FORMAT}, not {found.format_version}"
        )
    return found


def decode_batch(
    payload: bytes,
    where: str,
    max_uncompressed: int = MAX_UNCOMPRESSED_BYTES,
    payloads: bool = True,
) -> DecodedBatch:
    """The messages of one entry, by column; MessageDecodeError naming `where` (the
    entry) if it is not a message batch (or, compressed, claims over max_uncompressed).
    payloads=False: every column but the payloads, which are empty (a broker that hands
    the entry on as stored keeps no second copy of them; a chunk's piece keeps its own).
    A Pulsar producer's entry (it starts with Pulsar's magic number) is read by
    streamlib.pulsar.entries.decode, whose docstring says what it makes of it."""
    if payload[:1] == PULSAR_MAGIC_BYTE:
        from streamlib.pulsar import entries  # (it imports this module)

        return entries.decode(payload, where, max_uncompressed, payloads)
    try:
        batch = envelope.Batch.FromString(payload)
    except DecodeError as error:
        raise MessageDecodeError(f"{where} is not a message batch") from error
    return decode_envelope(batch, where, max_uncompressed, payloads)


def decode_envelope(
    batch: envelope.Batch,
    where: str,
    max_uncompressed: int = MAX_UNCOMPRESSED_BYTES,
    payloads: bool = True,
) -> DecodedBatch:
    """decode_batch of an entry already parsed as a Batch."""
    return _decode(uncompressed(b"", batch, where, max_uncompressed), where, payloads)


def _decode(batch: envelope.Batch, where: str, payloads: bool = True) -> DecodedBatch:
    version = batch.format_version
    if version == CHUNK_FORMAT:
        chunk = batch.chunk
        if (
            len(batch.payload_sizes) != 1
            or not batch.HasField("chunk")
            or not 0 <= chunk.index < chunk.count
            or chunk.total_size > MAX_CHUNKED_MESSAGE_BYTES
        ):
            raise MessageDecodeError(f"{where}: not a well-formed piece of a chunked message")
        batch.format_version = FORMAT  # (its columns are format 2's)
        return _decode(batch, where)._replace(chunk=chunk)  # (pieces are put together)
    if version == 2:
        sizes = batch.payload_sizes
        count = len(sizes)
        blob = batch.payloads
        if not count:  # no messages (as format 1 allows)
            if (
                blob
                or batch.publish_time_ms
                or batch.event_time_ms
                or batch.metadata
                or (batch.messages)
            ):
                raise MessageDecodeError(f"{where}: the columns of its batch disagree")
            return DecodedBatch([], [], None, None)
        ends = list(itertools.accumulate(sizes))
        publish = batch.publish_time_ms[:]
        events = batch.event_time_ms[:] if batch.event_time_ms else None
        metadata = batch.metadata if batch.metadata else None
        deliver_at = batch.deliver_at_ms[:] if batch.deliver_at_ms else None
        sequence_ids: Sequence[int] | None = None
        if batch.first_sequence_id > 0:
            sequence_ids = range(batch.first_sequence_id - 1, batch.first_sequence_id - 1 + count)
        elif batch.sequence_ids:
            sequence_ids = batch.sequence_ids[:]
        producers: list[str] | None = None
        if batch.producer_index:
            names = batch.producers
            try:
                producers = [names[i] for i in batch.producer_index]
            except IndexError:
                raise MessageDecodeError(f"{where}: a producer index is out of range") from None
        if (
            (sequence_ids is not None and len(sequence_ids) != count)
            or (producers is not None and len(producers) != count)
            or ends[-1] != len(blob)
            or len(publish) != count
            or (events is not None and len(events) != count)
            or (metadata is not None and len(metadata) != count)
            or (deliver_at is not None and len(deliver_at) != count)
            or batch.messages
        ):
            raise MessageDecodeError(f"{where}: the columns of its batch disagree")
        starts = [0, *ends[:-1]]
        return DecodedBatch(
            [blob[s:e] for s, e in zip(starts, ends, strict=True)] if payloads else [b""] * count,
            publish,
            events,
            metadata,
            deliver_at,
            None,
            sequence_ids,
            producers,
        )
    if version in (0, 1):
        messages = batch.messages
        if (
            batch.payload_sizes
            or batch.payloads
            or batch.publish_time_ms
            or batch.event_time_ms
            or batch.metadata
        ):
            raise MessageDecodeError(f"{where}: format 1 batch with format 2 columns")
        return DecodedBatch(
            [m.payload for m in messages],
            [m.publish_time_ms for m in messages],
            [m.event_time_ms for m in messages],
            messages,
        )
    raise MessageDecodeError(
        f"{where}: batch format {version} is newer than this client reads (up to {CHUNK_FORMAT})"
    )
