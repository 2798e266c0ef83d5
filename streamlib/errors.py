"""Every error a streamlib caller can meet, in one namespace.

Two families: :class:`StreamlibError` (ledgers, bookies, streams; mirrors the bookie
status codes) and :class:`metadata.errors.MetadataError` (the coordination store:
BadVersionError, NoNodeError, ...). They are two roots because the metadata package
sits below streamlib and imports nothing of ours.
"""

from streamlib.protocol.errors import (
    BadRequestError,
    BookieIOError,
    BookieUnavailableError,
    ClientClosedError,
    DigestMismatchError,
    IllegalTransitionError,
    InvalidLedgerConfigError,
    InvalidPositionError,
    InvalidTermError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerStateConflictError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NoSuchStreamError,
    NotEnoughBookiesError,
    ReadOnlyError,
    RecoveryAbortedError,
    StatusCode,
    StreamFencedError,
    StreamlibError,
    TooLargeError,
    TooManyEnsembleChangesError,
    TooManyRequestsError,
    UnauthenticatedError,
    UnauthorizedError,
    error_for_status,
)

__all__ = [
    "BadRequestError",
    "BookieIOError",
    "BookieUnavailableError",
    "ClientClosedError",
    "DigestMismatchError",
    "IllegalTransitionError",
    "InvalidLedgerConfigError",
    "InvalidPositionError",
    "InvalidTermError",
    "LedgerClosedError",
    "LedgerFencedError",
    "LedgerStateConflictError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NoSuchStreamError",
    "NotEnoughBookiesError",
    "ReadOnlyError",
    "RecoveryAbortedError",
    "StatusCode",
    "StreamFencedError",
    "StreamlibError",
    "TooLargeError",
    "TooManyEnsembleChangesError",
    "TooManyRequestsError",
    "UnauthenticatedError",
    "UnauthorizedError",
    "error_for_status",
]
