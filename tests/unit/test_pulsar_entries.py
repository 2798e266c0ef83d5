"""Pulsar's entry format beside streamlib's (streamlib.pulsar.entries): a Pulsar producer's
entries read by every streamlib reader, streamlib's entries written for Pulsar consumers,
and keys routed to partitions as Pulsar's Murmur3_32Hash routes them."""

from __future__ import annotations

import zlib
from typing import Any

import _pulsar  # pulsar-client's C++ core: its own batch parser checks what we write
import cramjam
import crc32c
import lz4.block
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlib.pulsar import PulsarApi_pb2 as api
from streamlib.pulsar import entries
from streamlib.pulsar.entries import (
    ChecksumError,
    EncryptedMessageError,
    check,
    encode,
    headers_and_payload,
    murmur3_router,
    parse,
    to_pulsar,
)
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import (
    BatchBuilder,
    Compression,
    DecodedBatch,
    MessageDecodeError,
    compress,
    decode_batch,
    metadata_of,
)
from streamlib.stream.partitioned import murmur3_32, partition_of
from streamlib.stream.positions import MessageId
from streamlib.stream.reader import EntryQueue, entry_messages

CODECS = {
    api.NONE: lambda data: data,
    api.LZ4: lambda data: lz4.block.compress(data, store_size=False),  # a block, no size
    api.ZLIB: zlib.compress,  # with zlib's header
    api.ZSTD: lambda data: zstandard.ZstdCompressor().compress(data),
    api.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
}


def single(payload: bytes, **fields: Any) -> bytes:
    """One message of a batch: [size][SingleMessageMetadata][payload]."""
    properties = fields.pop("properties", {})
    metadata = api.SingleMessageMetadata(payload_size=len(payload), **fields)
    for key, value in properties.items():
        metadata.properties.add(key=key, value=value)
    encoded = metadata.SerializeToString()
    return len(encoded).to_bytes(4, "big") + encoded + payload


def metadata(**fields: Any) -> api.MessageMetadata:
    properties = fields.pop("properties", {})
    found = api.MessageMetadata(producer_name="prod-1", sequence_id=10, publish_time=5000)
    for name, value in fields.items():
        setattr(found, name, value)
    for key, value in properties.items():
        found.properties.add(key=key, value=value)
    return found


def batch_entry(messages: list[bytes], compression: int = api.NONE, **fields: Any) -> bytes:
    """A Pulsar producer's batch, as its SEND carries it (and the broker stores it)."""
    data = b"".join(messages)
    outer = metadata(num_messages_in_batch=len(messages), **fields)
    if compression != api.NONE:
        outer.compression = compression
        outer.uncompressed_size = len(data)
    return headers_and_payload(outer, CODECS[compression](data))


MIXED = [
    single(b"one", partition_key="k1", properties={"a": "1"}, event_time=77, sequence_id=10),
    single(b"", partition_key="k2", null_value=True, sequence_id=11),
    single(b"three", ordering_key=b"\x00ok", sequence_id=12),
    single(b"four", sequence_id=13),
]


def keys(batch: DecodedBatch) -> list[str | None]:
    assert batch.metadata is not None
    return [m.key if m.HasField("key") else None for m in batch.metadata]


# -- a Pulsar producer's entries, read ----------------------------------------------------


@pytest.mark.parametrize("codec", list(CODECS), ids=lambda c: api.CompressionType.Name(c))
def test_a_pulsar_batch_reads_as_streamlib_messages_whatever_its_compression(codec):
    entry = batch_entry(MIXED, codec, deliver_at_time=9000)
    batch = decode_batch(entry, "entry")
    assert batch.payloads == [b"one", b"", b"three", b"four"]
    assert keys(batch) == ["k1", "k2", None, None]
    assert batch.metadata is not None
    assert [dict(m.properties) for m in batch.metadata] == [{"a": "1"}, {}, {}, {}]
    assert [m.ordering_key if m.HasField("ordering_key") else None for m in batch.metadata] == [
        None,
        None,
        b"\x00ok",
        None,
    ]
    assert list(batch.event_times or []) == [77, 0, 0, 0]
    assert list(batch.publish_times) == [5000] * 4  # (Pulsar's one publish time per entry)
    assert list(batch.sequence_ids or []) == [10, 11, 12, 13]
    assert list(batch.producers or []) == ["prod-1"] * 4
    assert list(batch.deliver_at or []) == [9000] * 4
    assert list(batch.null_values or []) == [False, True, False, False]
    assert batch.chunk is None


def test_sequence_ids_count_on_from_the_entry_s_when_its_messages_have_none():
    entry = batch_entry([single(b"a"), single(b"b"), single(b"c", sequence_id=40)])
    assert list(decode_batch(entry, "e").sequence_ids or []) == [10, 11, 40]


def test_a_message_without_a_batch_takes_its_key_and_properties_from_the_metadata():
    outer = metadata(partition_key="k", properties={"p": "v"}, ordering_key=b"o", event_time=3)
    batch = decode_batch(headers_and_payload(outer, b"payload"), "e")
    assert batch.payloads == [b"payload"]
    assert keys(batch) == ["k"] and batch.metadata is not None
    assert dict(batch.metadata[0].properties) == {"p": "v"}
    assert batch.metadata[0].ordering_key == b"o"
    assert batch.event_times == [3] and batch.sequence_ids == [10]
    zipped = metadata(compression=api.ZSTD, uncompressed_size=7, null_partition_key=True)
    zipped.partition_key = ""  # (null_partition_key: no key at all)
    batch = decode_batch(headers_and_payload(zipped, CODECS[api.ZSTD](b"payload")), "e")
    assert batch.payloads == [b"payload"] and batch.metadata is None


def test_messages_read_from_a_pulsar_entry_answer_as_pulsar_client_s_do():
    entry = entry_messages("s", 3, 4, batch_entry(MIXED), MessageId(3, 3, -1))
    assert entry is not None
    first, null, third, _ = list(entry)
    assert first.key == "k1" and first.properties == {"a": "1"} and first.event_time_ms == 77
    assert first.message_id == MessageId(3, 4, 0) and first.producer_name == "prod-1"
    assert null.has_null_value() and null.data == b"" and not first.has_null_value()
    assert third.ordering_key() == b"\x00ok" and third.sequence_id == 12


def test_the_broker_s_cheap_read_parses_the_messages_only_when_a_column_is_looked_at():
    damaged = batch_entry([single(b"one", partition_key="k"), b"\x00\x00\x00\x05junk!"])
    batch = decode_batch(damaged, "e", payloads=False)  # (only the MessageMetadata read)
    assert batch.payloads == [b"", b""] and len(batch.publish_times) == 2
    assert batch.producers == ["prod-1", "prod-1"]
    assert batch.metadata is not None and len(batch.metadata) == 2
    with pytest.raises(MessageDecodeError):
        batch.metadata[0]  # (reading it is the test)
    with pytest.raises(MessageDecodeError):
        check(damaged, "e")  # (what a broker runs before storing a producer's entry)
    whole = decode_batch(batch_entry(MIXED, api.LZ4), "e")
    cheap = decode_batch(batch_entry(MIXED, api.LZ4), "e", payloads=False)
    assert cheap.payloads == [b""] * 4
    for column in ("metadata", "event_times", "sequence_ids", "null_values", "producers"):
        assert list(getattr(cheap, column)) == list(getattr(whole, column)), column
    assert cheap.event_times is not None and cheap.event_times[1:3] == [0, 0]
    checked = check(batch_entry(MIXED, api.LZ4), "e")  # (what the broker checks by)
    assert checked.payloads == [b""] * 4
    assert list(checked.sequence_ids or ()) == list(whole.sequence_ids or ())
    assert checked.producers == whole.producers


def test_an_encrypted_entry_is_refused_by_readers_and_opaque_to_the_broker():
    keyed = metadata(num_messages_in_batch=3, partition_key="first")
    keyed.encryption_keys.add(key="k", value=b"sealed")
    entry = headers_and_payload(keyed, b"ciphertext of three messages")
    with pytest.raises(EncryptedMessageError, match="streamlib reads no encrypted messages"):
        decode_batch(entry, "e")
    assert issubclass(EncryptedMessageError, MessageDecodeError)
    for opaque in (decode_batch(entry, "e", payloads=False), check(entry, "e")):
        assert opaque.payloads == [b""] * 3 and opaque.metadata is None  # (keys unknown)
        assert list(opaque.sequence_ids or []) == [10, 11, 12]
    lone = metadata(partition_key="k", properties={"p": "v"})
    lone.encryption_keys.add(key="k", value=b"sealed")
    opaque = check(headers_and_payload(lone, b"ciphertext"), "e")
    assert keys(opaque) == ["k"]  # (a lone message's metadata is not encrypted)


def test_a_marker_entry_holds_no_messages():
    assert decode_batch(headers_and_payload(metadata(marker_type=1), b""), "e").payloads == []


def test_an_entry_behind_a_pulsar_broker_s_entry_metadata_reads_too():
    entry = batch_entry(MIXED)
    extra = api.BrokerEntryMetadata(broker_timestamp=1, index=2).SerializeToString()
    stored = entries.BROKER_ENTRY_MAGIC + len(extra).to_bytes(4, "big") + extra + entry
    assert decode_batch(stored, "e") == decode_batch(entry, "e")
    assert to_pulsar(stored, "e") == entry


def pulsar_pieces(payload: bytes, count: int, codec: int = api.NONE) -> list[bytes]:
    """A Pulsar producer's chunked message: compressed whole, then cut in `count` pieces."""
    packed = CODECS[codec](payload)
    size = -(-len(packed) // count)
    out = []
    for index in range(count):
        outer = metadata(uuid="prod-1-10", chunk_id=index, num_chunks_from_msg=count,
                         total_chunk_msg_size=len(packed), partition_key="big")  # fmt: skip
        if codec != api.NONE:
            outer.compression = codec
            outer.uncompressed_size = len(payload)
        out.append(headers_and_payload(outer, packed[index * size : (index + 1) * size]))
    return out


@pytest.mark.parametrize("codec", [api.NONE, api.ZSTD, api.LZ4])
async def test_a_pulsar_chunked_message_is_put_together_and_decompressed_by_the_reader(codec):
    payload = bytes(range(256)) * 40
    pieces = pulsar_pieces(payload, 3, codec)
    first = decode_batch(pieces[0], "e")
    assert first.chunk is not None and first.chunk.uuid == "prod-1-10"
    assert (first.chunk.index, first.chunk.count) == (0, 3)
    queue = EntryQueue(100)
    for i, piece in enumerate(pieces):
        await queue.put(entry_messages("s", 1, i, piece, MessageId(1, i - 1, -1)))
    whole = queue.take_nowait()
    assert whole is not None and whole.data == payload and whole.key == "big"
    assert whole.message_id == MessageId(1, 2, 0) and whole.previous == MessageId(1, -1, -1)
    assert decode_batch(pieces[1], "e", payloads=False).payloads[0]  # (a piece keeps its own)


async def test_a_chunked_message_whose_whole_does_not_decompress_is_dropped_but_covered():
    pieces = pulsar_pieces(b"x" * 5000, 2, api.ZSTD)
    damaged = parse(pieces[1], "e")[0]
    damaged.uncompressed_size = 4999  # (not what it decompresses to)
    body = parse(pieces[1], "e")[1]
    queue = EntryQueue(100)
    for i, piece in enumerate([pieces[0], headers_and_payload(damaged, bytes(body))]):
        await queue.put(entry_messages("s", 1, i, piece, MessageId(1, i - 1, -1)))
    await queue.put(entry_messages("s", 1, 2, batch_entry([single(b"next")]), MessageId(1, 1, -1)))
    after = queue.take_nowait()
    assert after is not None and after.data == b"next" and after.previous == MessageId(1, -1, -1)


# -- streamlib's entries, for Pulsar consumers ----------------------------------------------


def streamlib_batch() -> BatchBuilder:
    builder = BatchBuilder()
    builder.add(b"one", 1000, 50, metadata_of("k1", {"a": "1"}, b"ok"), 0, 7, "prod")
    builder.add(b"two", 1000, 0, None, 0, 8, "prod")
    builder.add(b"", 1000, 0, metadata_of(None, {"only": "props"}), 0, 9, "prod")
    return builder


def test_a_streamlib_batch_reads_back_the_same_from_its_pulsar_form():
    stored = streamlib_batch().encode()
    pulsar_entry = to_pulsar(stored, "e")
    assert pulsar_entry[:2] == entries.MAGIC
    assert decode_batch(pulsar_entry, "e") == decode_batch(stored, "e")
    outer, _ = parse(pulsar_entry, "e")  # (the checksum checked)
    assert outer.num_messages_in_batch == 3 and outer.sequence_id == 7
    assert outer.highest_sequence_id == 9 and outer.producer_name == "prod"
    assert not outer.HasField("compression")


@settings(max_examples=150)
@given(
    messages=st.lists(
        st.tuples(
            st.binary(max_size=200),
            st.integers(min_value=0, max_value=2**62),  # event time, 0 = none
            st.none() | st.text(max_size=12),  # key ("" is a key)
            st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
            st.none() | st.binary(max_size=6),  # ordering key
        ),
        min_size=1,
        max_size=30,
    ),
    first_id=st.integers(min_value=0, max_value=2**40),
    codec=st.sampled_from(list(Compression)),
)
def test_any_batch_with_what_pulsar_can_hold_reads_back_the_same(messages, first_id, codec):
    builder = BatchBuilder()
    for i, (data, event, key, properties, ordering) in enumerate(messages):
        builder.add(data, 1234, event, metadata_of(key, properties, ordering), 0,
                    first_id + i, "prod")  # fmt: skip
    stored = compress(builder.encode(), codec)
    assert decode_batch(to_pulsar(stored, "e"), "e") == decode_batch(stored, "e")


def test_pulsar_client_s_own_batch_parser_reads_what_to_pulsar_writes():
    outer, body = parse(to_pulsar(streamlib_batch().encode(), "e"), "e")
    messages = _pulsar.MessageBatch().parse_from(bytes(body), outer.num_messages_in_batch)
    got = [
        (m.data(), m.partition_key(), m.properties(), m.event_timestamp(), m.ordering_key())
        for m in messages.messages()
    ]
    assert got == [
        (b"one", "k1", {"a": "1"}, 50, "ok"),
        (b"two", "", {}, 0, ""),
        (b"", "", {"only": "props"}, 0, ""),
    ]
    assert [m.message_id().batch_index() for m in messages.messages()] == [0, 1, 2]


def test_one_message_is_still_a_batch_and_ids_none_are_left_out():
    builder = BatchBuilder()
    builder.add(b"alone", 1000)
    outer, _ = parse(to_pulsar(builder.encode(), "e"), "e")
    assert outer.num_messages_in_batch == 1 and outer.sequence_id == 0
    assert outer.producer_name == ""
    assert decode_batch(to_pulsar(builder.encode(), "e"), "e").payloads == [b"alone"]


def test_a_compressed_entry_stays_compressed_with_its_own_codec():
    builder = BatchBuilder()
    for i in range(200):
        builder.add(b"the same words again %d" % (i % 3), 1000, 0, None, 0, i, "prod")
    stored = compress(builder.encode(), Compression.LZ4)
    outer, body = parse(to_pulsar(stored, "e"), "e")
    assert outer.compression == api.LZ4 and len(body) < outer.uncompressed_size
    assert decode_batch(to_pulsar(stored, "e"), "e").payloads == decode_batch(stored, "e").payloads
    plain, _ = parse(to_pulsar(stored, "e", Compression.NONE), "e")
    assert not plain.HasField("compression")


def test_a_streamlib_piece_becomes_a_pulsar_piece_of_a_chunked_message():
    piece = BatchBuilder()
    piece.add(b"part", 1000, 0, metadata_of("k", {"p": "v"}), 0, 5, "prod")
    pulsar_entry = to_pulsar(piece.encode_chunk("u-1", 1, 3, 11), "e")
    outer, body = parse(pulsar_entry, "e")
    assert not outer.HasField("num_messages_in_batch") and bytes(body) == b"part"
    assert (outer.uuid, outer.chunk_id, outer.num_chunks_from_msg) == ("u-1", 1, 3)
    assert outer.total_chunk_msg_size == 11 and outer.partition_key == "k"
    read = decode_batch(pulsar_entry, "e")
    assert read.chunk == envelope.Chunk(uuid="u-1", index=1, count=3, total_size=11)
    assert read.payloads == [b"part"] and keys(read) == ["k"]


def test_a_pulsar_entry_goes_to_pulsar_consumers_as_it_is():
    entry = batch_entry(MIXED, api.SNAPPY)
    assert to_pulsar(entry, "e") == entry
    decoded = decode_batch(entry, "e")
    assert decode_batch(encode(decoded), "e") == decoded  # (null values kept)


def test_an_empty_batch_has_no_pulsar_form():
    with pytest.raises(MessageDecodeError, match="holds no messages"):
        to_pulsar(BatchBuilder().encode(), "e")


# -- keys to partitions ---------------------------------------------------------------------


def test_murmur3_is_pulsar_s_murmur3_32hash():
    # Pulsar's own vectors (pulsar-client-cpp tests/HashTest.cc, "Same value as Java client").
    assert murmur3_32("k1") == 2110152746
    assert murmur3_32("k2") == 1479966664
    assert murmur3_32("key1") == 462881061
    assert murmur3_32("key2") == 1936800180
    assert murmur3_32("key01") == 39696932
    assert murmur3_32("key02") == 751761803
    assert partition_of("key1", 7) == 462881061 % 7
    assert partition_of("ключ", 5) == murmur3_32("ключ") % 5  # (UTF-8 bytes)


class RoutedMessage:  # what pulsar-client hands a message_router
    def __init__(self, key: str) -> None:
        self._key = key

    def partition_key(self) -> str:
        return self._key


def test_pulsar_client_producers_route_keys_as_streamlib_s_given_the_router():
    for key in ("k1", "customer-42", "ключ"):
        assert murmur3_router(RoutedMessage(key), 6) == partition_of(key, 6)
    spread = {murmur3_router(RoutedMessage(""), 3) for _ in range(6)}
    assert spread == {0, 1, 2}  # (keyless: round robin)


# -- hostile entries --------------------------------------------------------------------------


def test_damaged_entries_are_decode_errors():
    good = batch_entry(MIXED)
    outer = metadata(num_messages_in_batch=2)
    cases = {
        "no magic": b"\x0e\x03" + good[2:],
        "too short": entries.MAGIC + b"\x00\x00",
        "metadata past the end": good[:6] + (10**6).to_bytes(4, "big") + good[10:],
        "a message past the end": headers_and_payload(outer, single(b"x")[:-1]),
        "fewer messages than stated": headers_and_payload(outer, single(b"x")),
        "bytes after the last": headers_and_payload(outer, single(b"x") * 2 + b"!"),
        "more messages than bytes": headers_and_payload(
            metadata(num_messages_in_batch=1000), single(b"x")
        ),
        "no messages": headers_and_payload(metadata(num_messages_in_batch=0), b""),
        "a bomb": headers_and_payload(
            metadata(num_messages_in_batch=1, compression=api.ZSTD, uncompressed_size=2**31),
            CODECS[api.ZSTD](bytes(1000)),
        ),
        "a size it does not decompress to": headers_and_payload(
            metadata(num_messages_in_batch=1, compression=api.LZ4, uncompressed_size=99),
            CODECS[api.LZ4](single(b"x")),
        ),
        "a piece out of range": headers_and_payload(
            metadata(uuid="u", chunk_id=3, num_chunks_from_msg=3, total_chunk_msg_size=9), b"x"
        ),
    }
    for name, entry in cases.items():
        with pytest.raises(MessageDecodeError):
            decode_batch(entry, name)
        with pytest.raises(MessageDecodeError):
            check(entry, name)
    flipped = bytearray(good)
    flipped[-1] ^= 1
    with pytest.raises(ChecksumError, match="checksum"):
        decode_batch(bytes(flipped), "e")
    decode_batch(bytes(flipped), "e", payloads=False)  # (the cheap read checks no checksum)
    with pytest.raises(ChecksumError):
        check(bytes(flipped), "e")
    check(bytes(flipped), "e", verify=False)  # (a broker that checked the frame's already)


def read_everything(entry: bytes, payloads: bool) -> None:
    batch = decode_batch(entry, "e", payloads=payloads)
    for column in batch:
        if column is not None and not isinstance(column, envelope.Chunk):
            list(column)


def checksummed(rest: bytes) -> bytes:
    """An entry of these bytes after the checksum, with the checksum they have."""
    return entries.MAGIC + crc32c.crc32c(rest).to_bytes(4, "big") + rest


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_damage_to_a_pulsar_entry_is_a_decode_error_and_nothing_else(data):
    codec = data.draw(st.sampled_from(list(CODECS)))
    good = batch_entry(MIXED, codec)
    rest = good[6:]  # (damage past the checksum, made right again, reaches the parsing)
    damaged = data.draw(
        st.one_of(
            st.binary(max_size=200).map(checksummed),
            st.tuples(st.integers(0, len(rest) - 1), st.integers(0, 255)).map(
                lambda at: checksummed(rest[: at[0]] + bytes([at[1]]) + rest[at[0] + 1 :])
            ),
            st.integers(0, len(rest)).map(lambda end: checksummed(rest[:end])),
            st.integers(0, len(good)).map(lambda end: good[:end]),
        )
    )
    for payloads in (True, False):
        try:
            read_everything(damaged, payloads)
        except MessageDecodeError:
            pass
    try:
        check(damaged, "e")
    except MessageDecodeError:
        pass


@pytest.mark.parametrize("field", [b"\x12\x02\xff\xfe", b"\x0a\x06\x0a\x02\xff\xfe\x12\x00"])
def test_a_broker_refuses_a_batch_with_a_key_or_property_that_is_not_utf8(field: bytes):
    """(partition_key, then a property's key: proto2 reads them only when asked; the
    broker's check parses them as proto3, which refuses them at once.)"""
    raw = field + b"\x18\x01"  # ... and payload_size 1
    one = len(raw).to_bytes(4, "big") + raw + b"x"
    entry = batch_entry([one])
    with pytest.raises(MessageDecodeError):
        check(entry, "e")
    with pytest.raises(MessageDecodeError):
        decode_batch(entry, "e")
