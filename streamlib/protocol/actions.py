"""What the protocol state machines ask the I/O layer to do (their outputs), and the
entry data they take back (part of their inputs).

The driver (streamlib.ledger, or the simulator in tests/sim) executes each action and
hands its answer, an event of events.py, to the step() of the machine that emitted it.
Bookies are named by id.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from streamlib.protocol.errors import StreamlibError
from streamlib.protocol.ledger_metadata import LedgerMetadata

# Add flag bits; the numbers are the wire's (bookie.proto AddFlag). A read's fence flag
# travels as ReadLac.fence / ReadEntry.fence.
ADD_FLAG_RECOVERY = 1
ADD_FLAG_TRUNCATE = 2
ADD_FLAG_NOOP = 4


def is_noop(flags: int) -> bool:
    """Whether a stored entry is a no-op of unbounded mode (readers skip it)."""
    return bool(flags & (ADD_FLAG_TRUNCATE | ADD_FLAG_NOOP))


def rewrite_flags(flags: int) -> int:
    """The add flags that write a stored entry again (recovery's write-back,
    re-replication): a recovery add, and a no-op stays a no-op but never truncates
    again -- a TRUNCATE written back after the entries above it would delete them."""
    return ADD_FLAG_RECOVERY | (ADD_FLAG_NOOP if is_noop(flags) else 0)


class EntryData(NamedTuple):
    """An entry as stored on a bookie. (Immutable; a NamedTuple rather than a frozen
    dataclass because one is built per entry on the add path, three times cheaper.)"""

    entry_id: int
    last_add_confirmed: int
    length: int  # ledger length up to and including this entry
    payload: bytes
    digest: bytes
    flags: int = 0
    term: int = 0  # as read back: the term of the add that stored this copy


class Purpose(enum.Enum):
    ENSEMBLE_CHANGE = "ensemble_change"
    WRITER_CLOSE = "writer_close"
    MARK_IN_RECOVERY = "mark_in_recovery"
    RECOVERY_CLOSE = "recovery_close"
    RECOVERY_REPLACEMENT = "recovery_replacement"
    REOPEN = "reopen"
    FRAGMENT_ROLL = "fragment_roll"


@dataclass(frozen=True, slots=True)
class SendAdd:
    """Send these entries to one bookie (one batch on its add stream). The answers come
    back as ``on_add_results(bookie, [(entry_id, status | None), ...])``."""

    bookie: str
    ledger_id: int
    entries: tuple[EntryData, ...]
    master_key: bytes
    flags: int = 0
    term: int = 0


@dataclass(frozen=True, slots=True)
class ReadLac:
    bookie: str
    ledger_id: int
    fence: bool
    master_key: bytes
    term: int = 0


@dataclass(frozen=True, slots=True)
class ReadEntry:
    bookie: str
    ledger_id: int
    entry_id: int
    fence: bool
    master_key: bytes
    term: int = 0


@dataclass(frozen=True, slots=True)
class ChooseBookies:
    """Pick `count` writable bookies not in `exclude` (placement policy)."""

    count: int
    exclude: frozenset[str]
    purpose: Purpose
    slots: tuple[int, ...] = ()  # the ensemble indexes being filled (rack-aware placement)


@dataclass(frozen=True, slots=True)
class WriteMetadata:
    """CAS the ledger metadata at expected_version."""

    metadata: LedgerMetadata
    expected_version: int
    purpose: Purpose


@dataclass(frozen=True, slots=True)
class ReadMetadata:
    purpose: Purpose


@dataclass(frozen=True, slots=True)
class CompleteAdds:
    """Entries first..last (inclusive) are acknowledged, in order; LAC is now last."""

    first_entry_id: int
    last_entry_id: int


@dataclass(frozen=True, slots=True)
class FailAdds:
    entry_ids: tuple[int, ...]
    error: StreamlibError


@dataclass(frozen=True, slots=True)
class Closed:
    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True)
class CloseFailed:
    error: StreamlibError


@dataclass(frozen=True, slots=True)
class RecoveryDone:
    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    error: StreamlibError


Action = (
    SendAdd
    | ReadLac
    | ReadEntry
    | ChooseBookies
    | WriteMetadata
    | ReadMetadata
    | CompleteAdds
    | FailAdds
    | Closed
    | CloseFailed
    | RecoveryDone
    | RecoveryFailed
)
