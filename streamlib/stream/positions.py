"""Positions in a stream: MessageId(ledger_id, entry_id, batch_index), totally ordered.

Ledger ids of one stream grow with the ledger list (new ledgers get fresh, larger ids),
so tuple order is stream order. EARLIEST and LATEST are symbolic starting points.
Serialised to 20 bytes (three big-endian integers) or to the string "ledger:entry:index".
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from streamlib.protocol.errors import BadRequestError, InvalidPositionError

_PACKED = struct.Struct(">qqi")


class MessageId(NamedTuple):
    """(ledger id, entry id, index within the entry's batch), ordered as a tuple.

    Constructing one does not validate (it is on the hot path of every message);
    ids that come from outside -- bytes, strings, user calls -- go through
    :meth:`checked`, :meth:`from_bytes`, :meth:`parse` or :func:`parse_start`."""

    ledger_id: int
    entry_id: int
    batch_index: int = 0

    def checked(self) -> MessageId:
        for name, value in zip(self._fields, self, strict=True):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidPositionError(f"{name} must be an int, got {value!r}")
        if self.batch_index < -1 or self.entry_id < -1 or self.ledger_id < -1:
            raise InvalidPositionError(f"invalid message id {tuple(self)}")
        if self.ledger_id >= 2**63 or self.entry_id >= 2**63 or self.batch_index >= 2**31:
            raise InvalidPositionError(f"message id out of range {tuple(self)}")
        return self

    def to_bytes(self) -> bytes:
        return _PACKED.pack(self.ledger_id, self.entry_id, self.batch_index)

    @classmethod
    def from_bytes(cls, data: bytes) -> MessageId:
        if not isinstance(data, bytes | bytearray) or len(data) != _PACKED.size:
            raise InvalidPositionError(
                f"a serialised message id is {_PACKED.size} bytes, got {data!r:.60}"
            )
        return cls(*_PACKED.unpack(data)).checked()

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.batch_index}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """From "ledger:entry[:index]" (the str() form)."""
        parts = str(text).split(":")
        if len(parts) not in (2, 3):
            raise InvalidPositionError(f"expected ledger:entry[:index], got {text!r}")
        try:
            return cls(*(int(p) for p in parts)).checked()
        except ValueError:
            raise InvalidPositionError(f"expected integers in {text!r}") from None


SIZE = _PACKED.size

# Symbolic starts: before everything, and after everything published so far.
EARLIEST = MessageId(-1, -1, -1)
LATEST = MessageId(2**63 - 1, 2**63 - 1, 2**31 - 1)


def parse_start(value: MessageId | str | bytes) -> MessageId:
    if isinstance(value, MessageId):
        return value.checked()
    if isinstance(value, tuple):
        return MessageId(*value).checked()
    if isinstance(value, bytes | bytearray):
        return MessageId.from_bytes(bytes(value))
    if value in ("earliest", "EARLIEST"):
        return EARLIEST
    if value in ("latest", "LATEST"):
        return LATEST
    return MessageId.parse(value)


def parse_initial_position(value: object) -> str:
    """The string "latest" or "earliest", from those (any case), InitialPosition, or
    anything with such a ``name`` (pulsar-client's ``InitialPosition.Latest`` /
    ``.Earliest``); BadRequestError for anything else."""
    text = value if isinstance(value, str) else getattr(value, "name", None)
    if isinstance(text, str) and text.lower() in ("latest", "earliest"):
        return text.lower()
    raise BadRequestError(
        f"initial_position is 'latest' or 'earliest' (or streamlib.InitialPosition, or "
        f"pulsar-client's InitialPosition), got {value!r}"
    )


def position_before(position: MessageId) -> MessageId:
    """The mark-delete position that makes `position` the next message delivered."""
    if position.batch_index > 0:
        return MessageId(position.ledger_id, position.entry_id, position.batch_index - 1)
    if position.entry_id > 0:
        return MessageId(position.ledger_id, position.entry_id - 1, LATEST.batch_index)
    return MessageId(position.ledger_id - 1, LATEST.entry_id, LATEST.batch_index)


def describe(position: MessageId) -> str:
    """A position as people read it: "earliest" (nothing consumed yet), "latest",
    "LEDGER:ENTRY" for a whole entry, else "LEDGER:ENTRY:INDEX" (no sentinel numbers)."""
    if position == EARLIEST:
        return "earliest"
    if position == LATEST:
        return "latest"
    if position.batch_index in (-1, LATEST.batch_index):
        return f"{position.ledger_id}:{position.entry_id}"
    return str(position)
