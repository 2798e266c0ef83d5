"""Positions in a stream: MessageId(ledger_id, entry_id, batch_index), totally ordered.

Ledger ids of one stream grow with the ledger list (new ledgers get fresh, larger ids),
so tuple order is stream order. EARLIEST and LATEST are symbolic starting points.
Serialised to 20 bytes (three big-endian integers) or to the string "ledger:entry:index".

pulsar-client's objects are taken where ours are, recognised by their shape (it is not a
dependency): its MessageId (``MessageId.earliest``, ``.latest`` or one with ledger and
entry ids) by :func:`as_message_id`, its InitialPosition by
:func:`parse_initial_position`.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from streamlib.protocol.errors import BadRequestError, InvalidPositionError

_PACKED = struct.Struct(">qqi")


class MessageId(NamedTuple):
    """(ledger id, entry id, index within the entry's batch), ordered as a tuple.

    Constructing one does not validate (it is on the hot path of every message);
    ids that come from outside -- bytes, strings, user calls -- go through
    :meth:`checked`, :meth:`from_bytes`, :meth:`parse` or :func:`parse_start`.

    pulsar-client's MessageId has methods ``ledger_id()``, ``entry_id()`` and
    ``batch_index()``; here they are the tuple's fields (``mid.ledger_id``), which a
    method of the same name cannot share. :func:`as_message_id` turns pulsar-client's
    into this."""

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


# pulsar-client's MessageId.latest: both ids at C++'s INT64_MAX (and batch index -1).
_PULSAR_LATEST = 2**63 - 1


def as_message_id(value: object) -> MessageId:
    """A MessageId from ours (checked), a (ledger, entry[, index]) tuple, or
    pulsar-client's MessageId: anything with ``ledger_id()``, ``entry_id()`` and
    ``batch_index()`` methods. InvalidPositionError for anything else.

    Pulsar's ``MessageId.earliest`` (ledger and entry -1) is EARLIEST, its
    ``MessageId.latest`` (both INT64_MAX) is LATEST. Pulsar's batch index -1 marks a
    message that is not part of a batch -- an entry's only message -- which is index 0
    here. Its partition is not needed: a ledger id names one stream's ledger."""
    if isinstance(value, MessageId):
        return value.checked()
    if isinstance(value, tuple):
        if not 2 <= len(value) <= 3:
            raise InvalidPositionError(f"a message id is (ledger, entry[, index]), got {value!r}")
        return MessageId(*value).checked()
    ledger_of, entry_of, index_of = (
        getattr(value, name, None) for name in ("ledger_id", "entry_id", "batch_index")
    )
    if not (callable(ledger_of) and callable(entry_of) and callable(index_of)):
        raise InvalidPositionError(
            f"expected a MessageId (streamlib's or pulsar-client's), EARLIEST or LATEST, "
            f"got {value!r:.80}"
        )
    ledger_id, entry_id, batch_index = ledger_of(), entry_of(), index_of()
    if ledger_id == -1 and entry_id == -1:
        return EARLIEST
    if ledger_id == _PULSAR_LATEST and entry_id == _PULSAR_LATEST:
        return LATEST
    return MessageId(ledger_id, entry_id, 0 if batch_index == -1 else batch_index).checked()


def parse_start(value: object) -> MessageId:
    """A start or seek position: a MessageId (ours or pulsar-client's, see
    :func:`as_message_id`), EARLIEST / LATEST or "earliest" / "latest", its 20 bytes
    or its "ledger:entry[:index]" string. InvalidPositionError for anything else."""
    if isinstance(value, bytes | bytearray):
        return MessageId.from_bytes(bytes(value))
    if isinstance(value, str):
        if value in ("earliest", "EARLIEST"):
            return EARLIEST
        if value in ("latest", "LATEST"):
            return LATEST
        return MessageId.parse(value)
    return as_message_id(value)


class InitialPosition(enum.Enum):
    """Where a new subscription starts (Pulsar's ``InitialPosition.Latest`` /
    ``.Earliest``): after what is published now, or at the stream's first message."""

    Latest = "latest"
    Earliest = "earliest"


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
