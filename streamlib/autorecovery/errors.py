"""Errors of auto-recovery's operations, each named for the problem."""

from __future__ import annotations

from streamlib.protocol.errors import BadRequestError, StreamlibError


class AutoRecoveryError(StreamlibError):
    """Base of auto-recovery's own errors."""


class ReplicationCopyError(AutoRecoveryError):
    """The replacement bookie refused or did not answer a recovery add: the next try
    picks a replacement again."""

    retriable = True


class UnknownBookieError(AutoRecoveryError, BadRequestError):
    """The bookie is neither registered nor named by any ledger."""


class BookieStillWritableError(AutoRecoveryError, BadRequestError):
    """Decommissioning needs the bookie down or read-only, so nothing new lands on it."""


class DecommissionTimeoutError(AutoRecoveryError):
    """Ledgers still referenced the bookie when the wait ran out: running it again goes on
    from there."""

    retriable = True
