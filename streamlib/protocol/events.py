"""What the I/O layer tells the ledger machines (their inputs): the answer to each action
of actions.py, as a value. A machine takes one at a time through ``step(event)``, which
returns the actions it leads to.

    SendAdd        -> AddOk | AddResults
    ReadLac        -> LacResult
    ReadEntry      -> ReadResult
    ChooseBookies  -> BookiesChosen | BookiesUnavailable
    WriteMetadata  -> MetadataWritten | MetadataConflict | MetadataFailed
    ReadMetadata   -> MetadataRead | MetadataFailed

A status is the wire's (errors.StatusCode); None means no answer came (a timeout, a
broken connection): an Unknown, never a Negative. (Not to be confused with
states.LedgerEvent: the transitions of the ledger's metadata state.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamlib.protocol.actions import EntryData
from streamlib.protocol.errors import StreamlibError
from streamlib.protocol.ledger_metadata import LedgerMetadata


@dataclass(frozen=True, slots=True)
class AddOk:
    """The bookie stored these entries durably (the hot path: AddResults, all OK)."""

    bookie: str
    entry_ids: Sequence[int]


@dataclass(frozen=True, slots=True)
class AddResults:
    """The bookie answered adds: (entry id, status or None), in the order it answered."""

    bookie: str
    results: Sequence[tuple[int, int | None]]


@dataclass(frozen=True, slots=True)
class LacResult:
    """A (fencing) LAC read answered; lac is meaningful only when status is OK."""

    bookie: str
    status: int | None
    lac: int = -1


@dataclass(frozen=True, slots=True)
class ReadResult:
    """A read of one entry answered; entry is the copy read when status is OK."""

    bookie: str
    entry_id: int
    status: int | None
    entry: EntryData | None = None


@dataclass(frozen=True, slots=True)
class BookiesChosen:
    """Placement chose these bookies, one per slot asked for; now_ms dates a new fragment."""

    bookies: Sequence[str]
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class BookiesUnavailable:
    """Placement found no bookie to choose."""

    error: StreamlibError


@dataclass(frozen=True, slots=True)
class MetadataWritten:
    """The metadata CAS succeeded: metadata is stored at version."""

    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True)
class MetadataConflict:
    """The metadata CAS failed on a version mismatch: someone else wrote first."""


@dataclass(frozen=True, slots=True)
class MetadataRead:
    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True)
class MetadataFailed:
    """The metadata store failed (not a version conflict): a write may or may not have
    happened."""

    error: StreamlibError


Event = (
    AddOk
    | AddResults
    | LacResult
    | ReadResult
    | BookiesChosen
    | BookiesUnavailable
    | MetadataWritten
    | MetadataConflict
    | MetadataRead
    | MetadataFailed
)
