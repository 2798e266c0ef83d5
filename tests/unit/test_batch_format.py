"""The entry format of a stream (streamlib.stream.batch) and the messages readers make of
it: columns written by producers now (format 2), single messages written before (format
1), and every kind of entry that is not a batch."""

import asyncio

import lz4.block
import pulsar  # the test extra's: its objects are taken as ours
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamlib.protocol.errors import BadRequestError, StreamlibError
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import (
    COMPRESSED_FORMAT,
    BatchBuilder,
    Compression,
    MessageDecodeError,
    compress,
    decode_batch,
    metadata_of,
    parse_compression,
)
from streamlib.stream.positions import EARLIEST, MessageId
from streamlib.stream.reader import (
    EntryMessages,
    EntryQueue,
    Reader,
    ScannerFeed,
    decode_entry,
    entry_messages,
)

messages_strategy = st.lists(
    st.tuples(
        st.binary(max_size=300),
        st.integers(min_value=0, max_value=2**62),  # publish time
        st.integers(min_value=0, max_value=2**62),  # event time, 0 = none
        st.none() | st.text(max_size=20),  # key ("" is a key)
        st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    ),
    min_size=1,
    max_size=40,
)


def fields(message):
    return (
        message.data,
        message.publish_time_ms,
        message.event_time_ms,
        message.key,
        message.properties,
    )


@pytest.mark.parametrize("version", [2, 1])
@given(messages=messages_strategy)
def test_a_batch_reads_back_as_it_was_written_and_its_size_bound_holds(version, messages):
    builder = BatchBuilder()
    for data, publish, event, key, properties in messages:
        builder.add(data, publish, event, metadata_of(key, properties))
    encoded = builder.encode(version)
    assert envelope.Batch.FromString(encoded).format_version == version
    assert len(encoded) <= builder.size  # what the producer counts never underestimates
    decoded = decode_entry("s", 7, 3, encoded, EARLIEST)
    assert [fields(m) for m in decoded] == list(messages)
    assert [m.message_id for m in decoded] == [MessageId(7, 3, i) for i in range(len(messages))]


def test_plain_messages_carry_no_metadata_columns():
    builder = BatchBuilder()
    for i in range(3):
        builder.add(b"m%d" % i, 1000 + i)
    batch = envelope.Batch.FromString(builder.encode())
    assert batch.format_version == 2
    assert list(batch.payload_sizes) == [2, 2, 2] and batch.payloads == b"m0m1m2"
    assert not batch.event_time_ms and not batch.metadata and not batch.messages
    decoded = decode_batch(builder.encode(), "here")
    assert decoded.event_times is None and decoded.metadata is None
    [first, *_] = decode_entry("s", 1, 0, builder.encode(), EARLIEST)
    assert (first.key, first.properties, first.event_time_ms) == (None, {}, 0)


@pytest.mark.parametrize("version", [0, 1])
def test_format_1_entries_written_before_are_still_read(version):
    old = envelope.Batch(
        format_version=version,
        messages=[
            envelope.Message(payload=b"a", publish_time_ms=5),
            envelope.Message(
                payload=b"b", publish_time_ms=6, event_time_ms=9, key="k", properties={"p": "q"}
            ),
        ],
    )
    decoded = decode_entry("s", 1, 2, old.SerializeToString(), EARLIEST)
    assert [fields(m) for m in decoded] == [
        (b"a", 5, 0, None, {}),
        (b"b", 6, 9, "k", {"p": "q"}),
    ]


def _columns(**overrides):
    values = {
        "format_version": 2,
        "payload_sizes": [1, 2],
        "payloads": b"abc",
        "publish_time_ms": [1, 2],
    }
    values.update(overrides)
    return envelope.Batch(**values).SerializeToString()


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\xff\xff\xff", "is not a message batch"),
        (_columns(payloads=b"ab"), "columns of its batch disagree"),
        (_columns(payloads=b"abcd"), "columns of its batch disagree"),
        (_columns(publish_time_ms=[1]), "columns of its batch disagree"),
        (_columns(event_time_ms=[1, 2, 3]), "columns of its batch disagree"),
        (_columns(metadata=[envelope.Metadata(key="k")]), "columns of its batch disagree"),
        (_columns(messages=[envelope.Message(payload=b"x")]), "columns of its batch disagree"),
        (_columns(format_version=1), "format 1 batch with format 2 columns"),
        (
            envelope.Batch(format_version=1, publish_time_ms=[1]).SerializeToString(),
            "format 1 batch with format 2 columns",
        ),
        (
            envelope.Batch(format_version=2, publish_time_ms=[1]).SerializeToString(),
            "columns of its batch disagree",
        ),
        (
            envelope.Batch(format_version=2, messages=[envelope.Message()]).SerializeToString(),
            "columns of its batch disagree",
        ),
        (_columns(format_version=5), "batch format 5 is newer than this client reads"),
        (_columns(format_version=4), "not a well-formed piece of a chunked message"),
    ],
)
def test_entries_that_are_not_batches_get_a_typed_error_naming_the_entry(payload, reason):
    with pytest.raises(MessageDecodeError, match=reason) as caught:
        decode_entry("orders", 4, 17, payload, EARLIEST)
    assert "stream 'orders' ledger 4 entry 17" in str(caught.value)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_a_batch_of_no_messages_has_no_messages(version):
    empty = envelope.Batch(format_version=version).SerializeToString()
    assert decode_entry("s", 1, 0, empty, EARLIEST) == []
    assert entry_messages("s", 1, 0, empty, EARLIEST) is None


class _FailingScanner:
    """A scanner whose reading breaks in a way nobody planned for."""

    name = "broken"
    start_after = EARLIEST

    async def batches(self):
        raise ZeroDivisionError("a bug")
        yield  # an async generator


async def test_a_reader_whose_reading_fails_raises_instead_of_waiting_forever():
    feed = ScannerFeed(_FailingScanner(), 1000, None)  # type: ignore[arg-type]
    reader = Reader(feed, "broken", EARLIEST, inclusive=False)
    with pytest.raises(StreamlibError, match="reading stream 'broken' failed") as caught:
        await reader.read_next(timeout=5)
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    await reader.close()


def test_an_entry_read_after_a_position_inside_it_starts_after_that_position():
    builder = BatchBuilder()
    for i in range(4):
        builder.add(b"%d" % i, i)
    payload = builder.encode()
    before = MessageId(3, 8, 2**31 - 1)
    whole = entry_messages("s", 3, 9, payload, before)
    assert whole is not None and len(whole) == 4
    assert [m.previous for m in whole] == [before, *(MessageId(3, 9, i) for i in range(3))]
    after = MessageId(3, 9, 1)
    rest = entry_messages("s", 3, 9, payload, before, after)
    assert rest is not None and len(rest) == 2
    assert [(m.data, m.previous) for m in rest] == [(b"2", after), (b"3", MessageId(3, 9, 2))]
    assert rest.last_id == MessageId(3, 9, 3)
    assert entry_messages("s", 3, 9, payload, before, MessageId(3, 9, 3)) is None
    assert entry_messages("s", 3, 9, payload, before, MessageId(3, 10, 0)) is None
    assert entry_messages("s", 3, 9, payload, before, MessageId(4, 0, -1)) is None


def test_a_redelivered_message_keeps_its_fields_and_counts_deliveries():
    builder = BatchBuilder()
    builder.add(b"a", 1, 0, metadata_of("k", None))
    builder.add(b"b", 2)
    [a, b] = decode_entry("s", 1, 0, builder.encode(), MessageId(0, 5, 0))
    again = b.redelivered().redelivered()
    assert (again.data, again.key, again.redelivery_count) == (b"b", None, 2)
    assert again.message_id == b.message_id and again.previous == a.message_id
    assert b.redelivery_count == 0


def _entry(count: int, entry_id: int) -> EntryMessages:
    builder = BatchBuilder()
    for i in range(count):
        builder.add(b"x", i)
    entry = entry_messages("s", 1, entry_id, builder.encode(), EARLIEST)
    assert entry is not None
    return entry


async def _entry_ids(queue: EntryQueue, messages: int) -> list[int]:
    return [(await queue.take(timeout=1)).message_id.entry_id for _ in range(messages)]


async def test_the_read_ahead_queue_holds_at_most_its_size_in_messages():
    queue = EntryQueue(10)
    await queue.put(_entry(6, 1))
    await queue.put(_entry(6, 2))  # over the limit now: the next put waits for room
    third = asyncio.ensure_future(queue.put(_entry(6, 3)))
    await asyncio.sleep(0)  # one turn of the loop: it runs up to its wait
    assert not third.done()
    assert await _entry_ids(queue, 6) == [1] * 6  # the first entry, whole
    await asyncio.wait_for(third, 1)  # room again: 6 + 6 held
    assert await _entry_ids(queue, 12) == [2] * 6 + [3] * 6
    with pytest.raises(TimeoutError):
        await queue.take(timeout=0.01)
    # An error ends the reading in order, after the entries before it.
    await queue.put(_entry(2, 4))
    await queue.put(MessageDecodeError("bad"))
    assert await _entry_ids(queue, 2) == [4, 4]
    with pytest.raises(MessageDecodeError):
        await queue.take(timeout=1)


@pytest.mark.parametrize("codec", ["lz4", "zlib", "zstd", "snappy", Compression.ZSTD])
@given(messages=messages_strategy)
def test_a_compressed_batch_reads_back_as_written(codec, messages):
    builder = BatchBuilder()
    for data, publish, event, key, properties in messages:
        builder.add(data, publish, event, metadata_of(key, properties))
    encoded = builder.encode()
    entry = compress(encoded, parse_compression(codec))
    # Per entry: compressed (format 3) only when that is smaller.
    expected_format = COMPRESSED_FORMAT if len(entry) < len(encoded) else 2
    assert envelope.Batch.FromString(entry).format_version == expected_format
    assert [fields(m) for m in decode_entry("s", 7, 3, entry, EARLIEST)] == list(messages)


def compressible_batch() -> bytes:
    builder = BatchBuilder()
    for i in range(50):
        builder.add(b"the same words again and again %d " % (i % 3) * 20, 1000 + i)
    return builder.encode()


@pytest.mark.parametrize(
    "codec", [Compression.LZ4, Compression.ZLIB, Compression.ZSTD, Compression.SNAPPY]
)
def test_compression_shrinks_what_repeats(codec):
    encoded = compressible_batch()
    entry = compress(encoded, codec)
    batch = envelope.Batch.FromString(entry)
    assert batch.format_version == COMPRESSED_FORMAT and batch.compression == codec
    assert batch.uncompressed_size == len(encoded) and len(entry) < len(encoded) / 5


def damaged(codec=Compression.ZSTD, **changes) -> bytes:
    batch = envelope.Batch.FromString(compress(compressible_batch(), codec))
    for name, value in changes.items():
        setattr(batch, name, value)
    return batch.SerializeToString()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (damaged(compression=9), "compression 9 is unknown to this client"),
        (damaged(compressed=b"\x00" * 40), "does not decompress"),
        (damaged(uncompressed_size=10), "not the 10 it states"),  # the frame holds more
        (damaged(uncompressed_size=2**31), "over the 67108864-byte limit"),  # a bomb
        (
            envelope.Batch(
                format_version=3, compression=1, uncompressed_size=3,
                compressed=lz4.block.compress(b"abc", store_size=False),
            ).SerializeToString(),
            "compressed batch is not a batch",
        ),
        (
            compress(BatchBuilder().encode(1) + b"\x08\x01" * 200, Compression.ZLIB),
            "must hold format 2",
        ),
        (damaged(Compression.SNAPPY, compressed=b""), "holds 0 bytes, not the"),
        (damaged(Compression.SNAPPY, uncompressed_size=10), "bytes, not the 10 it states"),
        (damaged(Compression.SNAPPY, uncompressed_size=2**31), "over the 67108864-byte limit"),
    ],
)  # fmt: skip
def test_damaged_compressed_entries_get_a_typed_error_naming_the_entry(payload, reason):
    with pytest.raises(MessageDecodeError, match="ledger 4 entry 5") as refused:
        decode_batch(payload, "ledger 4 entry 5")
    assert reason in str(refused.value)


def test_damaged_snappy_blocks_get_the_same_typed_error():
    good = envelope.Batch.FromString(damaged(Compression.SNAPPY)).compressed
    size = len(compressible_batch())
    cut = next(i for i, byte in enumerate(good) if byte < 0x80) + 1  # its length varint
    length, body = good[:cut], good[cut:]
    for block, reason in [
        (length + body[:-5], "does not decompress"),  # cut short
        (length + bytes(b ^ 0x5A for b in body), "does not decompress"),  # scrambled
        (length + b"\xfe" * 40, "does not decompress"),  # copies from before the start
        # a bomb: a block that claims 4 GiB, in an entry that claims the right size
        (b"\xff\xff\xff\xff\x0f" + body, f"holds 4294967295 bytes, not the {size}"),
    ]:
        with pytest.raises(MessageDecodeError, match="ledger 4 entry 5") as refused:
            decode_batch(damaged(Compression.SNAPPY, compressed=block), "ledger 4 entry 5")
        assert reason in str(refused.value)


def test_a_client_that_knows_only_format_2_would_refuse_format_3_cleanly():
    # What readers before format 3 do with a format they do not know: refuse it as
    # newer (never read it as an empty batch), because format_version is 3.
    entry = compress(compressible_batch(), Compression.LZ4)
    batch = envelope.Batch.FromString(entry)
    assert batch.format_version == 3
    assert not batch.payload_sizes and not batch.payloads and not batch.messages
    future = envelope.Batch(format_version=5).SerializeToString()
    with pytest.raises(MessageDecodeError, match="batch format 5 is newer"):
        decode_batch(future, "e")


def test_compression_names_as_pulsar_spells_them():
    class PulsarCompressionType:  # pulsar-client's enum members carry their name
        name = "ZSTD"

    assert parse_compression(PulsarCompressionType()) is Compression.ZSTD
    assert parse_compression("LZ4") is Compression.LZ4
    assert parse_compression("snappy") is Compression.SNAPPY
    for codec in ("NONE", "LZ4", "ZLib", "ZSTD", "SNAPPY"):  # pulsar-client's own enum
        pulsar_codec = getattr(pulsar.CompressionType, codec)
        assert parse_compression(pulsar_codec) == int(pulsar_codec)  # the same numbering
    with pytest.raises(BadRequestError, match="one of none, lz4, zlib, zstd, snappy"):
        parse_compression("brotli")


def test_snappy_entries_are_snappy_raw_blocks_as_pulsar_writes_them():
    # A block made by hand from the format (a length varint, then one literal), not by
    # the library that reads it: the raw format, not snappy's framed one.
    builder = BatchBuilder()
    builder.add(b"abc", 1000)
    inner = builder.encode()
    assert len(inner) < 60  # (one literal tag holds lengths up to 60)
    block = bytes([len(inner), (len(inner) - 1) << 2]) + inner
    entry = envelope.Batch(
        format_version=COMPRESSED_FORMAT,
        compression=Compression.SNAPPY,
        uncompressed_size=len(inner),
        compressed=block,
    ).SerializeToString()
    [message] = decode_entry("s", 1, 0, entry, EARLIEST)
    assert (message.data, message.publish_time_ms) == (b"abc", 1000)


@pytest.mark.parametrize("version", [1, 2, 3])
@given(
    ordering_keys=st.lists(
        st.none() | st.binary(max_size=12) | st.text(max_size=6), min_size=1, max_size=10
    ),
    keyed=st.booleans(),
)
def test_ordering_keys_read_back_in_every_format(version, ordering_keys, keyed):
    builder = BatchBuilder()
    for i, ordering_key in enumerate(ordering_keys):
        key = f"k{i}" if keyed else None
        builder.add(b"x" * 100, 1000 + i, 0, metadata_of(key, None, ordering_key))
    encoded = builder.encode(min(version, 2))
    entry = compress(encoded, Compression.ZLIB) if version == 3 else encoded
    decoded = decode_entry("s", 1, 0, entry, EARLIEST)
    expected = [k.encode() if isinstance(k, str) else k for k in ordering_keys]
    assert [m.ordering_key() for m in decoded] == expected
    assert [m.key for m in decoded] == [(f"k{i}" if keyed else None) for i in range(len(decoded))]


def test_an_ordering_key_is_bytes_or_str():
    assert metadata_of(None, None, bytearray(b"o")).ordering_key == b"o"
    assert metadata_of(None, None, b"").HasField("ordering_key")  # b"" is a key
    assert metadata_of(None, None) is None
    with pytest.raises(BadRequestError, match="ordering_key is bytes or str"):
        metadata_of("k", None, 7)


# Entries as producers wrote them before ordering keys: a message with a key and a
# property, then one without (format 2, then format 1).
BEFORE_ORDERING_KEYS = {
    2: "08021a020101220261622a020506320200093a0b0a016b12060a01701201713a00",
    1: "080112100a016b12060a017012017118052a01611207180620092a0162",
}


@pytest.mark.parametrize("version", [2, 1])
def test_entries_from_before_ordering_keys_read_as_before(version):
    entry = bytes.fromhex(BEFORE_ORDERING_KEYS[version])
    first, second = decode_entry("s", 1, 0, entry, EARLIEST)
    assert [fields(first), fields(second)] == [
        (b"a", 5, 0, "k", {"p": "q"}),
        (b"b", 6, 9, None, {}),
    ]
    assert first.ordering_key() is None and second.ordering_key() is None
    assert first.partition_key() == "k" and second.partition_key() is None


def test_messages_answer_to_pulsar_clients_accessor_names():
    builder = BatchBuilder()
    builder.add(b"p", 1000, 900, metadata_of("k", {"a": "b"}, b"ok"))
    [message] = decode_entry("orders", 1, 0, builder.encode(), EARLIEST)
    assert message.partition_key() == message.key == "k"
    assert message.ordering_key() == b"ok"
    assert message.publish_timestamp() == message.publish_time_ms == 1000
    assert message.event_timestamp() == message.event_time_ms == 900
    assert message.topic_name() == message.stream == "orders"
    assert message.redelivered().redelivery_count == 1


def pieces(uuid: str, parts: list[bytes], total: int, entry0: int) -> list:
    out = []
    for i, part in enumerate(parts):
        piece = BatchBuilder()
        piece.add(part, 1000)
        raw = piece.encode_chunk(uuid, i, len(parts), total)
        out.append(entry_messages("s", 1, entry0 + i, raw, MessageId(1, entry0 + i - 1, -1)))
    return out


def plain(entry: int, data: bytes):
    builder = BatchBuilder()
    builder.add(data, 1000)
    return entry_messages("s", 1, entry, builder.encode(), MessageId(1, entry - 1, -1))


async def test_pieces_come_whole_and_broken_ones_are_dropped_but_covered():
    queue = EntryQueue(100)
    for item in [
        *pieces("a", [b"ab", b"cd", b"e"], 5, 0),  # entries 0-2: whole
        *pieces("b", [b"xx", b"yy"], 99, 3),  # entries 3-4: a damaged total size
        plain(5, b"after"),
        *pieces("c", [b"zz"] * 3, 6, 6)[1:],  # entries 7-8: no start (read from inside)
        plain(9, b"end"),
        *pieces("d", [b"q", b"r"], 2, 10)[:1],  # entry 10: its producer died
    ]:
        await queue.put(item)
    whole = queue.take_nowait()
    assert whole.data == b"abcde" and whole.message_id == MessageId(1, 2, 0)
    assert whole.previous == MessageId(1, -1, -1)  # acknowledging it covers every piece
    after = queue.take_nowait()
    assert after.data == b"after" and after.previous == MessageId(1, 2, -1)  # covers 3-4
    end = queue.take_nowait()
    assert end.data == b"end" and end.previous == MessageId(1, 6, -1)  # covers 7-8
    assert queue.take_nowait() is None  # the unfinished one is never seen
