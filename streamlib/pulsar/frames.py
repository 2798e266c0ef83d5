"""Pulsar's binary framing, sans I/O: bytes in, frames out, and frames back to bytes.

Every frame on a Pulsar connection, either way, is

    [totalSize u32][commandSize u32][BaseCommand]                       a simple command
    [totalSize u32][commandSize u32][BaseCommand][headers and payload]  SEND and MESSAGE

with big-endian sizes and totalSize counting everything after itself. The headers and
payload block is

    [0x0e02][size u32][BrokerEntryMetadata]    optional, broker to client only
    [0x0e01][crc32c u32]                       optional (clients before v6 omit it)
    [metadataSize u32][MessageMetadata][payload]

where the crc32c (Castagnoli) covers everything after itself: metadataSize, metadata
and payload. The block is what a broker stores as an entry and later hands to a
consumer verbatim (encode_with_headers), so a Frame keeps it exactly as it came.

No magic is ambiguous with a metadataSize: 0x0e01.... would be a 235 MB metadata, far
beyond any frame accepted here.

Junk (an oversize frame, an HTTP request or a TLS ClientHello on the plain port, bytes
that are no BaseCommand) raises FrameError: the byte stream has no frame boundary
left to trust, and the connection must be closed. A frame whose boundaries are sound
but whose headers and payload are not raises PayloadError from the Frame's helpers:
the connection stays usable, the broker answers that one SEND with an error.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, NoReturn

import crc32c as _crc32c
from google.protobuf.message import DecodeError, Message

from streamlib.protocol.errors import BadRequestError
from streamlib.pulsar.PulsarApi_pb2 import BaseCommand, BrokerEntryMetadata, MessageMetadata

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02

# Pulsar's default maxMessageSize, and the allowance its broker adds for the command
# and headers around a message that size (Commands.MESSAGE_SIZE_FRAME_PADDING). The
# broker's frame decoder refuses a frame of more than the sum, counting the 4 bytes of
# totalSize as Netty's LengthFieldBasedFrameDecoder does.
MAX_MESSAGE_SIZE = 5 * 1024 * 1024
FRAME_PADDING = 10 * 1024
MAX_FRAME_BYTES = MAX_MESSAGE_SIZE + FRAME_PADDING

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_SIZES = struct.Struct(">II")  # totalSize, commandSize
_CHECKSUM = struct.Struct(">HI")  # magic, crc32c
_MAGIC_CRC32C_BYTES = _U16.pack(MAGIC_CRC32C)
_MAGIC_BEM_BYTES = _U16.pack(MAGIC_BROKER_ENTRY_METADATA)

_crc = _crc32c.crc32c

# BaseCommand's design: the field holding a command has the number of its type.
FIELD_OF_TYPE: dict[int, str] = {
    number: BaseCommand.DESCRIPTOR.fields_by_number[number].name
    for number in BaseCommand.Type.values()
}
_TYPE_OF_MESSAGE: dict[str, tuple[int, str]] = {
    field.message_type.full_name: (field.number, field.name)
    for field in BaseCommand.DESCRIPTOR.fields
    if field.message_type is not None
}

Bytes = bytes | bytearray | memoryview


class FrameError(BadRequestError):
    """Bytes that are not a Pulsar frame: the stream cannot be read any further and the
    connection must be closed. ``frames`` holds the sound frames that came before the
    junk in the same FrameDecoder.feed call, for a caller that wants to act on them."""

    def __init__(self, message: str, frames: list[Frame] | None = None) -> None:
        super().__init__(message)
        self.frames: list[Frame] = frames if frames is not None else []


class PayloadError(FrameError):
    """A frame's headers and payload are malformed (a metadata size beyond the frame, a
    metadata that is no MessageMetadata). The frame's boundaries were sound, so the
    connection is not lost: answer the command (a SEND: a SendError) and go on."""


# -- the headers-and-payload block ----------------------------------------------------


class _Layout(NamedTuple):
    """Offsets into one headers-and-payload block."""

    broker_entry_metadata: tuple[int, int] | None  # start, end
    checksum: int | None  # the crc32c sent; None when the block has none
    checked_from: int  # where the checksummed part (metadataSize onwards) starts
    metadata_start: int
    metadata_end: int  # where the payload starts


def _locate(block: Bytes) -> _Layout:
    """Find the parts of a headers-and-payload block; PayloadError if it is cut short."""
    size = len(block)
    pos = 0
    bem: tuple[int, int] | None = None
    if block[:2] == _MAGIC_BEM_BYTES:
        if size < 6:
            raise PayloadError(f"broker entry metadata cut short: {size} bytes of headers")
        end = 6 + _U32.unpack_from(block, 2)[0]
        if end > size:
            raise PayloadError(
                f"broker entry metadata of {end - 6} bytes in headers of {size} bytes"
            )
        bem = (6, end)
        pos = end
    checksum: int | None = None
    if block[pos : pos + 2] == _MAGIC_CRC32C_BYTES:
        if size < pos + 6:
            raise PayloadError(f"checksum cut short: {size - pos} bytes after its magic")
        checksum = _CHECKSUM.unpack_from(block, pos)[1]
        pos += 6
    if size < pos + 4:
        raise PayloadError(
            f"headers cut short: {size - pos} bytes where the metadata size (4) should be"
        )
    metadata_start = pos + 4
    metadata_end = metadata_start + _U32.unpack_from(block, pos)[0]
    if metadata_end > size:
        raise PayloadError(
            f"metadata size {metadata_end - metadata_start} runs past the frame "
            f"({size - metadata_start} bytes follow it)"
        )
    return _Layout(bem, checksum, pos, metadata_start, metadata_end)


def _parse(message: Message, data: Bytes, what: str) -> None:
    """Parse data into message, or raise PayloadError: junk, or required fields missing
    (which protobuf's parser lets through, and Pulsar's does not)."""
    try:
        message.ParseFromString(data)  # type: ignore[arg-type]  # upb takes any buffer
    except DecodeError as exc:
        raise PayloadError(f"{what} is not a {message.DESCRIPTOR.name}: {exc}") from None
    if not message.IsInitialized():
        missing = ", ".join(_missing_fields(message))
        raise PayloadError(f"{what} lacks required fields: {missing}")


def _missing_fields(message: Message) -> list[str]:
    """The required fields message lacks, by path (protobuf's own list; its stubs omit
    the method)."""
    missing: list[str] = message.FindInitializationErrors()  # type: ignore[attr-defined]
    return missing


def verify(headers_and_payload: Bytes) -> bool:
    """Whether a block's checksum is right, as Pulsar's broker decides before storing a
    SEND: a block without a checksum (an old client's) passes, having nothing to fail."""
    layout = _locate(headers_and_payload)
    if layout.checksum is None:
        return True
    return _crc(memoryview(headers_and_payload)[layout.checked_from :]) == layout.checksum


def read_metadata(headers_and_payload: Bytes) -> MessageMetadata:
    """The MessageMetadata of a block (PayloadError on junk or a size past the end)."""
    layout = _locate(headers_and_payload)
    metadata = MessageMetadata()
    data = memoryview(headers_and_payload)[layout.metadata_start : layout.metadata_end]
    _parse(metadata, data, "the message metadata")
    return metadata


def headers_and_payload(metadata: MessageMetadata | Bytes, payload: Bytes) -> bytes:
    """The block [magic][crc32c][metadataSize][metadata][payload], checksum computed."""
    raw = metadata.SerializeToString() if isinstance(metadata, Message) else metadata
    size = _U32.pack(len(raw))
    crc = _crc(payload, _crc(raw, _crc(size)))
    return b"".join((_CHECKSUM.pack(MAGIC_CRC32C, crc), size, raw, payload))


def prepend_broker_entry_metadata(
    metadata: BrokerEntryMetadata | Bytes, headers_and_payload: Bytes
) -> bytes:
    """A stored block with the broker's entry metadata ahead of it, as a MESSAGE carries
    it to a client whose FeatureFlags say supports_broker_entry_metadata."""
    raw = metadata.SerializeToString() if isinstance(metadata, Message) else metadata
    return b"".join((_MAGIC_BEM_BYTES, _U32.pack(len(raw)), raw, headers_and_payload))


# -- frames ---------------------------------------------------------------------------


class Frame(NamedTuple):
    """One decoded frame: its command and, for SEND and MESSAGE, the headers and payload
    block exactly as on the wire (checksum and all), or None when there is none."""

    command: BaseCommand
    payload: bytes | None = None

    def _block(self) -> bytes:
        if self.payload is None:
            raise PayloadError(
                f"a {BaseCommand.Type.Name(self.command.type)} frame without a payload"
            )
        return self.payload

    def checksum_ok(self) -> bool | None:
        """Whether the payload's crc32c matches; None when the sender sent none (or no
        payload came at all). PayloadError if the headers are cut short."""
        if self.payload is None:
            return None
        layout = _locate(self.payload)
        if layout.checksum is None:
            return None
        return _crc(memoryview(self.payload)[layout.checked_from :]) == layout.checksum

    def metadata(self) -> MessageMetadata:
        """The payload's MessageMetadata (parsed anew on each call)."""
        return read_metadata(self._block())

    def payload_body(self) -> bytes:
        """The bytes after the metadata: one message, or a whole batch of them."""
        block = self._block()
        return block[_locate(block).metadata_end :]

    def broker_entry_metadata(self) -> BrokerEntryMetadata | None:
        """The broker's entry metadata ahead of the headers, if the frame has any."""
        if self.payload is None:
            return None
        span = _locate(self.payload).broker_entry_metadata
        if span is None:
            return None
        metadata = BrokerEntryMetadata()
        data = memoryview(self.payload)[span[0] : span[1]]
        _parse(metadata, data, "the broker entry metadata")
        return metadata


def inner_command(command: BaseCommand) -> Message:
    """The command a BaseCommand carries: the field its type names (command.send for a
    SEND). Decoded frames always have it; see wrap for the other way round."""
    inner: Message = getattr(command, FIELD_OF_TYPE[command.type])
    return inner


def wrap(inner: Message) -> BaseCommand:
    """The BaseCommand carrying one command, its type taken from the command's message
    type: wrap(CommandPong()) is BaseCommand(type=PONG, pong=CommandPong())."""
    number, name = _TYPE_OF_MESSAGE[inner.DESCRIPTOR.full_name]
    command = BaseCommand(type=number)  # type: ignore[arg-type]
    getattr(command, name).CopyFrom(inner)
    return command


# -- encoding -------------------------------------------------------------------------


def encode_command(command: BaseCommand) -> bytes:
    """A simple command frame. protobuf's EncodeError if a required field is unset."""
    raw = command.SerializeToString()
    return _SIZES.pack(4 + len(raw), len(raw)) + raw


def encode_with_headers(command: BaseCommand, headers_and_payload: Bytes) -> bytes:
    """A payload command frame around a block already built (and checksummed), sent
    verbatim: what a broker does with a stored entry for a MESSAGE."""
    raw = command.SerializeToString()
    sizes = _SIZES.pack(4 + len(raw) + len(headers_and_payload), len(raw))
    return b"".join((sizes, raw, headers_and_payload))


def encode_payload_command(
    command: BaseCommand, metadata: MessageMetadata | Bytes, payload: Bytes
) -> bytes:
    """A payload command frame, always with the magic and a correct crc32c."""
    return encode_with_headers(command, headers_and_payload(metadata, payload))


# -- decoding -------------------------------------------------------------------------


def _looks_like(head: bytes) -> str:
    """What a frame that is far too large probably is, for the error message."""
    if head[:1] == b"\x16" and head[1:2] == b"\x03":
        return "; it looks like a TLS handshake: this port speaks plain Pulsar, not TLS"
    token = head.split(b" ", 1)[0]
    if token in {b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH", b"PRI"}:
        return "; it looks like HTTP: this port speaks Pulsar's binary protocol, not HTTP"
    return ""


class FrameDecoder:
    """Cuts a byte stream into Frames. Feed it what the socket gives, in any pieces.

    Bytes wait in one buffer only while a frame is incomplete; whole frames in the data
    fed are decoded straight from it. The first junk raises FrameError, and every feed
    after it raises the same error: nothing after junk can be trusted."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._pending = bytearray()
        self._error: FrameError | None = None

    @property
    def buffered(self) -> int:
        """How many bytes wait for the rest of their frame."""
        return len(self._pending)

    def feed(self, data: Bytes) -> list[Frame]:
        """The frames that data completes, in order."""
        if self._error is not None:
            raise self._error
        if self._pending:
            self._pending += data
            view = memoryview(self._pending)
        else:
            view = memoryview(data)
        frames: list[Frame] = []
        try:
            consumed = self._decode(view, frames)
        except FrameError as exc:
            # A new buffer, not clear(): the traceback may still hold views of the old.
            self._pending = bytearray()
            self._error = FrameError(str(exc), frames)
            raise self._error from None
        finally:
            view.release()
        if self._pending:
            del self._pending[:consumed]
        elif consumed < len(data):
            self._pending += memoryview(data)[consumed:]
        return frames

    def _decode(self, view: memoryview, frames: list[Frame]) -> int:
        """Decode the whole frames at the start of view into frames; return the number
        of bytes they take."""
        pos = 0
        size = len(view)
        while size - pos >= 4:
            total = _U32.unpack_from(view, pos)[0]
            if total + 4 > self.max_frame_bytes or total < 4:
                self._refuse(total, view[pos : pos + 8].tobytes())
            end = pos + 4 + total
            if end > size:
                break
            frames.append(_decode_frame(view, pos + 4, end))
            pos = end
        return pos

    def _refuse(self, total: int, head: bytes) -> NoReturn:
        """Raise the FrameError for a totalSize out of bounds."""
        if total + 4 > self.max_frame_bytes:
            raise FrameError(
                f"frame of {total + 4} bytes is over the limit of {self.max_frame_bytes}"
                f"{_looks_like(head)}"
            )
        raise FrameError(f"frame of {total + 4} bytes has no room for its command size")


def _decode_frame(view: memoryview, start: int, end: int) -> Frame:
    """The frame whose bytes after totalSize are view[start:end]."""
    command_size = _U32.unpack_from(view, start)[0]
    command_end = start + 4 + command_size
    if command_end > end:
        raise FrameError(f"command of {command_size} bytes in a frame of {end - start} bytes")
    command = _decode_command(view[start + 4 : command_end])
    payload = view[command_end:end].tobytes() if command_end < end else None
    return Frame(command, payload)


def _decode_command(data: memoryview) -> BaseCommand:
    """A BaseCommand that holds the command its type names, with every required field,
    as Pulsar's own decoder insists; FrameError otherwise."""
    command = BaseCommand()
    try:
        command.ParseFromString(data)  # type: ignore[arg-type]  # upb takes any buffer
    except DecodeError as exc:
        raise FrameError(f"the frame's command is not a BaseCommand: {exc}") from None
    if not command.HasField("type"):
        # protobuf keeps a type number it does not know aside, as an unknown field.
        raise FrameError("a command without a type, or of a type newer than protocol v20")
    field = FIELD_OF_TYPE[command.type]
    if not command.HasField(field):
        name = BaseCommand.Type.Name(command.type)
        raise FrameError(f"a {name} command without its {field} field")
    if not command.IsInitialized():
        missing = ", ".join(_missing_fields(command))
        raise FrameError(f"a {BaseCommand.Type.Name(command.type)} command lacks {missing}")
    return command
