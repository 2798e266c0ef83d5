"""Pulsar's framing (streamlib.pulsar.frames): frames survive the trip through bytes
in any pieces, checksums are checked as Pulsar's broker checks them, and junk of every
kind -- oversize, HTTP, TLS, non-protobuf, headers past the frame -- is a typed error,
never another exception."""

import itertools
import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlib.protocol.errors import BadRequestError
from streamlib.pulsar import PulsarApi_pb2 as api
from streamlib.pulsar.frames import (
    FRAME_PADDING,
    MAX_FRAME_BYTES,
    MAX_MESSAGE_SIZE,
    Frame,
    FrameDecoder,
    FrameError,
    PayloadError,
    encode_command,
    encode_payload_command,
    encode_with_headers,
    headers_and_payload,
    inner_command,
    prepend_broker_entry_metadata,
    read_metadata,
    verify,
    wrap,
)

Type = api.BaseCommand.Type


def ping() -> api.BaseCommand:
    return wrap(api.CommandPing())


def send(sequence_id: int = 7, num_messages: int = 1) -> api.BaseCommand:
    return wrap(api.CommandSend(producer_id=1, sequence_id=sequence_id, num_messages=num_messages))


def metadata(sequence_id: int = 7) -> api.MessageMetadata:
    return api.MessageMetadata(
        producer_name="standalone-0-1",
        sequence_id=sequence_id,
        publish_time=1_700_000_000_000,
        properties=[api.KeyValue(key="k", value="v")],
    )


def decode_all(data: bytes) -> list[Frame]:
    return FrameDecoder().feed(data)


def no_checksum_frame(command: api.BaseCommand, meta: bytes, payload: bytes) -> bytes:
    """A payload frame as a client before protocol v6 writes it: no magic, no crc."""
    raw = command.SerializeToString()
    block = struct.pack(">I", len(meta)) + meta + payload
    return struct.pack(">II", 4 + len(raw) + len(block), len(raw)) + raw + block


# -- round trips ----------------------------------------------------------------------


def test_the_size_limit_is_pulsars_message_size_plus_its_frame_padding():
    assert MAX_MESSAGE_SIZE == 5 * 1024 * 1024
    assert FRAME_PADDING == 10 * 1024
    assert MAX_FRAME_BYTES == MAX_MESSAGE_SIZE + FRAME_PADDING


def test_a_simple_command_frame_is_its_two_sizes_and_the_command():
    command = wrap(api.CommandFlow(consumer_id=3, messagePermits=1000))
    raw = command.SerializeToString()
    assert encode_command(command) == struct.pack(">II", 4 + len(raw), len(raw)) + raw
    [frame] = decode_all(encode_command(command))
    assert frame.command == command
    assert frame.payload is None
    assert frame.checksum_ok() is None
    assert inner_command(frame.command).messagePermits == 1000


def test_a_payload_frame_round_trips_with_its_checksum():
    data = encode_payload_command(send(), metadata(), b"hello")
    [frame] = decode_all(data)
    assert frame.command == send()
    assert frame.checksum_ok() is True
    assert frame.metadata() == metadata()
    assert frame.payload_body() == b"hello"
    assert frame.broker_entry_metadata() is None


def test_the_payload_is_kept_exactly_as_on_the_wire_and_resent_verbatim():
    block = headers_and_payload(metadata(), b"x" * 1000)
    assert block[:2] == b"\x0e\x01"
    [frame] = decode_all(encode_payload_command(send(), metadata(), b"x" * 1000))
    assert frame.payload == block
    message = wrap(
        api.CommandMessage(consumer_id=4, message_id=api.MessageIdData(ledgerId=1, entryId=2))
    )
    [delivered] = decode_all(encode_with_headers(message, frame.payload))
    assert delivered.command == message
    assert delivered.payload == block
    assert delivered.checksum_ok() is True


def test_the_checksum_covers_metadata_size_metadata_and_payload():
    meta = metadata().SerializeToString()
    block = headers_and_payload(meta, b"payload")
    (crc,) = struct.unpack_from(">I", block, 2)
    assert crc == crc32c.crc32c(struct.pack(">I", len(meta)) + meta + b"payload")
    assert verify(block)


def test_metadata_given_as_bytes_or_as_a_message_makes_the_same_frame():
    as_message = encode_payload_command(send(), metadata(), b"p")
    as_bytes = encode_payload_command(send(), metadata().SerializeToString(), b"p")
    assert as_message == as_bytes


def test_an_empty_payload_is_still_a_payload():
    [frame] = decode_all(encode_payload_command(send(), metadata(), b""))
    assert frame.payload_body() == b""
    assert frame.metadata().sequence_id == 7


def test_wrap_names_the_type_from_the_command():
    command = wrap(api.CommandPong())
    assert command.type == Type.PONG
    assert command.HasField("pong")
    assert wrap(api.CommandTopicMigrated(resource_id=1, resource_type=0)).type == 68


# -- pieces and batches of frames ----------------------------------------------------


def three_frames() -> tuple[bytes, list[api.BaseCommand]]:
    commands = [ping(), send(1), send(2)]
    data = (
        encode_command(commands[0])
        + encode_payload_command(commands[1], metadata(1), b"first")
        + encode_payload_command(commands[2], metadata(2), b"second")
    )
    return data, commands


def test_several_frames_in_one_feed_come_out_in_order():
    data, commands = three_frames()
    frames = decode_all(data)
    assert [f.command for f in frames] == commands
    assert [f.payload_body() for f in frames[1:]] == [b"first", b"second"]


def test_a_frame_split_at_every_byte_boundary_decodes_the_same():
    data, commands = three_frames()
    for cut in range(len(data) + 1):
        decoder = FrameDecoder()
        frames = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        assert [f.command for f in frames] == commands, cut
        assert decoder.buffered == 0


def test_frames_fed_one_byte_at_a_time_decode_the_same():
    data, commands = three_frames()
    decoder = FrameDecoder()
    frames = [frame for i in range(len(data)) for frame in decoder.feed(data[i : i + 1])]
    assert [f.command for f in frames] == commands
    assert [f.payload for f in frames] == [f.payload for f in decode_all(data)]


def test_frames_do_not_alias_the_buffer_they_were_fed_from():
    data, commands = three_frames()
    buffer = bytearray(data)
    decoder = FrameDecoder()
    frames = decoder.feed(memoryview(buffer)[:-3])  # the last frame stays pending
    buffer[:] = bytes(len(buffer))  # the caller reuses its buffer
    frames += decoder.feed(data[-3:])
    assert [f.command for f in frames] == commands
    assert [f.payload_body() for f in frames[1:]] == [b"first", b"second"]


def test_an_incomplete_frame_waits_in_the_buffer():
    data = encode_payload_command(send(), metadata(), b"z" * 100)
    decoder = FrameDecoder()
    assert decoder.feed(data[:-1]) == []
    assert decoder.buffered == len(data) - 1
    assert len(decoder.feed(data[-1:])) == 1
    assert decoder.buffered == 0


def test_a_large_frame_in_small_chunks_is_decoded_once_whole():
    payload = bytes(range(256)) * 16_000  # ~4 MB, under the limit
    data = encode_payload_command(send(), metadata(), payload)
    decoder = FrameDecoder()
    frames = []
    for i in range(0, len(data), 65536):
        frames += decoder.feed(memoryview(data)[i : i + 65536])
    [frame] = frames
    assert frame.payload_body() == payload
    assert frame.checksum_ok() is True


# -- checksums ------------------------------------------------------------------------


def test_a_corrupted_payload_fails_its_checksum():
    data = bytearray(encode_payload_command(send(), metadata(), b"hello"))
    data[-1] ^= 0x01
    [frame] = decode_all(bytes(data))
    assert frame.checksum_ok() is False
    assert not verify(frame.payload)
    assert frame.payload_body() == b"helln"  # the frame is still whole


def test_a_frame_without_a_checksum_is_accepted():
    meta = metadata().SerializeToString()
    [frame] = decode_all(no_checksum_frame(send(), meta, b"old client"))
    assert frame.checksum_ok() is None
    assert verify(frame.payload)  # nothing to fail, as Pulsar's broker decides
    assert frame.metadata() == metadata()
    assert frame.payload_body() == b"old client"


def test_broker_entry_metadata_ahead_of_the_headers_is_skipped_and_readable():
    entry = api.BrokerEntryMetadata(broker_timestamp=1_700_000_000_123, index=41)
    block = prepend_broker_entry_metadata(entry, headers_and_payload(metadata(), b"body"))
    message = wrap(
        api.CommandMessage(consumer_id=4, message_id=api.MessageIdData(ledgerId=1, entryId=2))
    )
    [frame] = decode_all(encode_with_headers(message, block))
    assert frame.broker_entry_metadata() == entry
    assert frame.checksum_ok() is True
    assert frame.metadata() == metadata()
    assert frame.payload_body() == b"body"


# -- junk -----------------------------------------------------------------------------


def refused(data: bytes) -> FrameError:
    with pytest.raises(FrameError) as caught:
        FrameDecoder().feed(data)
    return caught.value


def test_frame_errors_are_bad_requests_not_worth_retrying():
    err = refused(b"\xff" * 8)
    assert isinstance(err, BadRequestError)
    assert not err.retriable


def test_a_frame_over_the_limit_is_refused_from_its_first_four_bytes():
    err = refused(struct.pack(">I", MAX_FRAME_BYTES - 4 + 1))
    assert "over the limit" in str(err)
    assert FrameDecoder().feed(struct.pack(">I", MAX_FRAME_BYTES - 4)) == []  # just fits


def test_the_limit_is_the_decoders_to_choose():
    data = encode_payload_command(send(), metadata(), b"x" * 2000)
    with pytest.raises(FrameError, match="over the limit of 1024"):
        FrameDecoder(max_frame_bytes=1024).feed(data)


def test_an_http_request_is_named_as_http():
    err = refused(b"GET / HTTP/1.1\r\nHost: localhost:6650\r\n\r\n")
    assert "HTTP" in str(err)
    assert "HTTP" in str(refused(b"POST /admin/v2 HTTP/1.1\r\n"))


def test_a_tls_client_hello_on_the_plain_port_is_named_as_tls():
    hello = bytes.fromhex("16030100f8010000f40303") + bytes(32)
    assert "TLS" in str(refused(hello))


def test_a_frame_too_short_for_its_command_size_is_refused():
    assert "no room" in str(refused(struct.pack(">I", 2) + b"\x00\x00"))


def test_a_command_size_beyond_the_frame_is_refused():
    assert "command of 100 bytes" in str(refused(struct.pack(">II", 6, 100) + b"\x08\x12"))


def test_bytes_that_are_no_protobuf_are_refused():
    junk = b"\xff\xff\xff\xff\xff"
    err = refused(struct.pack(">II", 4 + len(junk), len(junk)) + junk)
    assert "not a BaseCommand" in str(err)


def frame_of(raw_command: bytes) -> bytes:
    return struct.pack(">II", 4 + len(raw_command), len(raw_command)) + raw_command


def test_a_command_without_a_type_is_refused():
    assert "without a type" in str(refused(frame_of(b"")))


def test_a_type_newer_than_this_protocol_is_refused():
    assert "without a type" in str(refused(frame_of(b"\x08\x63")))  # type = 99


def test_a_command_without_the_field_its_type_names_is_refused():
    bare = api.BaseCommand(type=Type.SEND).SerializeToString()
    assert "without its send field" in str(refused(frame_of(bare)))


def test_a_command_lacking_required_fields_is_refused():
    command = api.BaseCommand(type=Type.SEND)
    command.send.producer_id = 1  # no sequence_id
    err = refused(frame_of(command.SerializePartialToString()))
    assert "send.sequence_id" in str(err)


def test_frames_before_junk_come_with_the_error_and_the_stream_stays_refused():
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as caught:
        decoder.feed(encode_command(ping()) + b"GET / HTTP/1.1\r\n")
    assert [f.command for f in caught.value.frames] == [ping()]
    with pytest.raises(FrameError):
        decoder.feed(encode_command(ping()))


def block_frame(block: bytes) -> Frame:
    [frame] = decode_all(encode_with_headers(send(), block))
    return frame


@pytest.mark.parametrize(
    ("block", "complaint"),
    [
        (struct.pack(">I", 1000) + b"short", "runs past the frame"),
        (b"\x0e\x01\x00\x00\x00\x00" + struct.pack(">I", 50) + b"x", "runs past the frame"),
        (b"\x0e\x01\x00\x00", "checksum cut short"),
        (b"\x00\x00", "headers cut short"),
        (b"\x0e\x02\x00\x00\x00\x09", "broker entry metadata of 9 bytes"),
        (struct.pack(">I", 3) + b"\xff\xff\xff", "not a MessageMetadata"),
        (struct.pack(">I", 0), "lacks required fields"),
    ],
)
def test_bad_headers_are_a_payload_error_on_a_sound_frame(block, complaint):
    frame = block_frame(block)
    with pytest.raises(PayloadError, match=complaint):
        frame.metadata()
    with pytest.raises(PayloadError):
        read_metadata(block)


def test_a_payload_helper_on_a_frame_without_payload_is_a_payload_error():
    [frame] = decode_all(encode_command(ping()))
    with pytest.raises(PayloadError, match="PING frame without a payload"):
        frame.metadata()
    assert frame.broker_entry_metadata() is None


# -- fuzz -----------------------------------------------------------------------------


def use(frame: Frame) -> None:
    """Everything a broker asks of a frame: only PayloadError may come of it."""
    assert isinstance(frame.command, api.BaseCommand)
    inner_command(frame.command)
    if frame.payload is None:
        return
    for helper in (frame.checksum_ok, frame.metadata, frame.payload_body,
                   frame.broker_entry_metadata):  # fmt: skip
        try:
            helper()
        except PayloadError:
            pass


def feed_in_pieces(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_frame_bytes=64 * 1024)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    try:
        for start, end in itertools.pairwise(bounds):
            for frame in decoder.feed(data[start:end]):
                use(frame)
    except FrameError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0), max_size=5))
def test_random_bytes_give_frames_or_a_frame_error(data, cuts):
    feed_in_pieces(data, cuts)


@settings(max_examples=500, deadline=None)
@given(
    st.binary(max_size=200),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4),
    st.lists(st.integers(min_value=0), max_size=3),
)
def test_damaged_frames_give_frames_or_a_frame_error(payload, damage, cuts):
    data = bytearray(
        encode_command(ping())
        + encode_payload_command(send(), metadata(), payload)
        + encode_command(wrap(api.CommandFlow(consumer_id=1, messagePermits=10)))
    )
    for where, value in damage:
        data[where % len(data)] = value
    feed_in_pieces(bytes(data), cuts)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_command_bytes_in_a_sound_frame_give_a_frame_or_a_frame_error(raw):
    feed_in_pieces(frame_of(raw), [])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_headers_on_a_send_give_a_frame_whose_helpers_raise_only_payload_errors(block):
    use(block_frame(block))
    try:
        verify(block)
    except PayloadError:
        pass
