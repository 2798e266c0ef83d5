"""Errors the bookie raises internally, rooted in :class:`BookieError`.

Request-level problems are not exceptions on the wire: the service turns each of
these into a StatusCode. :class:`RequestError` carries that code; the storage
problems that must stop the process (a corrupt journal, a refused cookie) are
separate classes so ``bookie serve`` can print them and exit non-zero.
"""

from __future__ import annotations

from bookie.wire import bookie_pb2 as pb


class BookieError(Exception):
    """Root of every error the bookie raises."""


class RequestError(BookieError):
    """A request the bookie refuses; ``status`` is the wire StatusCode to answer with."""

    status: pb.StatusCode = pb.BAD_REQUEST

    def __init__(self, message: str, *, term: int = 0) -> None:
        super().__init__(message)
        self.term = term


class BadRequestError(RequestError):
    status = pb.BAD_REQUEST


class TooLargeError(RequestError):
    status = pb.TOO_LARGE


class UnauthorizedError(RequestError):
    status = pb.UNAUTHORIZED


class UnauthenticatedError(RequestError):
    """``kind`` names the refusal for logging it once (none, expired, signature,
    algorithm, malformed, claim, header): never the message, which holds text a caller
    controls."""

    status = pb.UNAUTHENTICATED

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class LedgerFencedError(RequestError):
    status = pb.FENCED


class InvalidTermError(RequestError):
    status = pb.INVALID_TERM


class ReadOnlyError(RequestError):
    status = pb.READ_ONLY


class NoSuchLedgerError(RequestError):
    status = pb.NO_SUCH_LEDGER


class NoSuchEntryError(RequestError):
    status = pb.NO_SUCH_ENTRY


class StorageIOError(RequestError):
    """Stored data could not be read or failed its CRC: an Unknown, never a negative."""

    status = pb.IO_ERROR


class JournalCorruptError(BookieError):
    """A journal record failed its CRC with valid records after it: not a torn tail.

    Skipping it could drop an acknowledged entry, so the bookie refuses to start.
    """


class CookieError(BookieError):
    """The bookie's on-disk identity does not match the metadata store's."""


class GcRefusedError(BookieError):
    """A garbage-collection round that would delete what may still be needed; it deleted
    nothing. ``reason`` labels the refusal in the bookie_gc_refused_rounds metric."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class DataDirectoryError(BookieError):
    """A data, journal or entry-log file is not in a format this bookie can use."""


class TooManyRequestsError(RequestError):
    status = pb.TOO_MANY_REQUESTS
