"""The CRC-framed record format shared by the journal and the entry logs.

A record is ``MAGIC(4) | body length(4) | crc32c(body)(4) | body``. The magic lets a
replay tell "garbage after a torn tail" (no magic+CRC-valid record follows) from
"a damaged record in the middle" (one does), without trusting lengths read from
damaged bytes. All integers are big-endian.

The body of an entry record is the wire's AddEntry message, serialized: one C call
on the hot path instead of copying each field into Python objects, and a format
with a schema of its own. On the hot path the bookie keeps only an
:class:`EntryHeader` (the fields its rules look at) beside the record bytes, and
decodes the whole :class:`StoredEntry` when it serves a read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
from google.protobuf.message import DecodeError

from bookie.wire import bookie_pb2 as pb

RECORD_MAGIC = b"SLR1"
_FRAME = struct.Struct(">4sII")
FRAME_SIZE = _FRAME.size


@dataclass(slots=True)
class EntryHeader:
    """The fields of an entry the add and apply rules need (no payload copy)."""

    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    flags: int
    term: int
    master_key: bytes


@dataclass(slots=True)
class StoredEntry:
    """One entry as the bookie keeps it (the digest is the client's, never checked here)."""

    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    flags: int
    term: int
    master_key: bytes
    digest: bytes
    payload: bytes
    length: int = 0  # the ledger's length up to and including this entry, as the client sent it


class RecordError(ValueError):
    """A record whose frame or CRC is wrong."""


def frame_header(body: bytes) -> bytes:
    """The 12 bytes that precede ``body`` in its record (kept apart to save a copy)."""
    return _FRAME.pack(RECORD_MAGIC, len(body), crc32c.crc32c(body))


def frame(body: bytes) -> bytes:
    return frame_header(body) + body


def encode_entry(e: StoredEntry) -> bytes:
    """The framed record of one entry (off the hot path: replay, tests, tools)."""
    return frame(
        pb.AddEntry(
            ledger_id=e.ledger_id,
            entry_id=e.entry_id,
            last_add_confirmed=e.last_add_confirmed,
            payload=e.payload,
            digest=e.digest,
            master_key=e.master_key,
            flags=e.flags,
            term=e.term,
            length=e.length,
        ).SerializeToString()
    )


def _parse_add(body: bytes | memoryview) -> pb.AddEntry:
    try:
        return pb.AddEntry.FromString(bytes(body))
    except DecodeError as e:
        raise RecordError(f"undecodable entry record: {e}") from None


def decode_entry(body: bytes | memoryview) -> StoredEntry:
    a = _parse_add(body)
    return StoredEntry(
        a.ledger_id,
        a.entry_id,
        a.last_add_confirmed,
        a.flags,
        a.term,
        a.master_key,
        a.digest,
        a.payload,
        a.length,
    )


def decode_header(body: bytes | memoryview) -> EntryHeader:
    a = _parse_add(body)
    return EntryHeader(a.ledger_id, a.entry_id, a.last_add_confirmed, a.flags, a.term, a.master_key)


def parse_frame(buf: bytes | memoryview, offset: int) -> tuple[memoryview, int]:
    """The body of the record at ``offset`` and the offset after it.

    Raises :class:`RecordError` for a bad magic, a length past the buffer, or a CRC
    mismatch; :class:`EOFError` when fewer than a frame header's bytes remain or the
    bytes are all zero (preallocated, never written).
    """
    mv = memoryview(buf)
    if offset + FRAME_SIZE > len(mv):
        raise EOFError
    magic, length, crc = _FRAME.unpack_from(mv, offset)
    if magic != RECORD_MAGIC:
        if magic == b"\0\0\0\0" and length == 0 and crc == 0:
            raise EOFError
        raise RecordError(f"bad record magic at offset {offset}")
    start = offset + FRAME_SIZE
    end = start + length
    if end > len(mv):
        raise RecordError(f"record at offset {offset} runs past the end of the file")
    body = mv[start:end]
    if crc32c.crc32c(body) != crc:
        raise RecordError(f"CRC mismatch in the record at offset {offset}")
    return body, end


def valid_record_after(buf: bytes | memoryview, offset: int) -> int | None:
    """The offset of the first CRC-valid record strictly after ``offset``, if any."""
    data = bytes(buf)
    pos = offset
    while True:
        pos = data.find(RECORD_MAGIC, pos + 1)
        if pos < 0:
            return None
        try:
            parse_frame(data, pos)
        except (RecordError, EOFError):
            continue
        return pos
