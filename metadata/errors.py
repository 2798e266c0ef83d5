"""The metadata layer's one exception hierarchy.

Every backend raises these and nothing else: a kazoo or sqlite3 exception that escapes
a backend is a bug. Callers branch on the class (BadVersionError -> re-read and retry,
NodeExistsError -> someone else created it, ...), so each class names one situation.

Each class also says whether the operation, tried again, may succeed (``retriable``, the
attribute streamlib's errors carry too, so one predicate asks both families): a lost
CAS (after a re-read), a store briefly unreachable or busy. Not a missing or existing
node, a bad argument, a refusal, an expired session (its ephemeral nodes and locks are
gone: the caller must start over, not repeat the call).
"""

from __future__ import annotations


class MetadataError(Exception):
    """Root of every error the metadata layer raises."""

    retriable: bool = False


class BadVersionError(MetadataError):
    """A compare-and-swap lost: the node's version is not the expected one. Re-read it."""

    retriable = True


class NoNodeError(MetadataError):
    """The node (or, for a create, its parent) does not exist."""


class NodeExistsError(MetadataError):
    """A create found the node already there."""


class NotEmptyError(MetadataError):
    """A non-recursive delete of a node that still has children."""


class NoChildrenForEphemeralsError(MetadataError):
    """Ephemeral nodes cannot have children (as in ZooKeeper)."""


class InvalidPathError(MetadataError, ValueError):
    """A malformed node path (not absolute, empty component, '.' or '..', control chars)."""


class InvalidValueError(MetadataError, TypeError):
    """A node value that is not bytes, a version that is not an int >= -1, or a bad
    connect() option or credential setting."""


class ValueTooLargeError(MetadataError, ValueError):
    """A node value over the 1 MiB limit every backend shares."""


class InvalidURIError(MetadataError, ValueError):
    """A metadata URI that cannot be parsed (missing host, bad port, relative path...)."""


class UnknownSchemeError(InvalidURIError):
    """A metadata URI whose scheme is not zk://, sqlite:// or memory://."""


class SessionExpiredError(MetadataError):
    """The session ended (expired or closed): its ephemeral nodes are gone."""


class ConnectionLossError(MetadataError):
    """The store could not be reached; the outcome of the operation is unknown."""

    retriable = True


class StoreBusyError(MetadataError):
    """The embedded database stayed locked by other processes past the retry budget."""

    retriable = True


class StoreIOError(MetadataError):
    """The store's storage failed (disk error, corrupt database file)."""


class AuthFailedError(MetadataError):
    """The store rejected our credentials, or an ACL forbids the operation."""


class TransactionError(MetadataError):
    """One operation of a multi-op transaction failed, so none was applied.

    ``index`` is the position of the failing op and ``cause`` the error it alone would
    have raised (BadVersionError, NoNodeError, ...). Retriable when that cause is.
    """

    def __init__(self, index: int, cause: MetadataError) -> None:
        super().__init__(f"transaction op #{index} failed, nothing applied: {cause!r}")
        self.index = index
        self.cause = cause
        self.retriable = cause.retriable


class SchemaError(MetadataError, ValueError):
    """Stored bytes that are not a valid record of the expected schema and format version."""


class ServiceError(MetadataError):
    """Root of the errors raised by the services over the store (metadata.services)."""


class NoSuchLedgerError(ServiceError):
    """No metadata for that ledger id."""


class LedgerExistsError(ServiceError):
    """Ledger metadata already exists for that id."""


class NoSuchStreamError(ServiceError):
    """No stream by that name."""


class StreamExistsError(ServiceError):
    """A stream by that name already exists."""


class InvalidNameError(ServiceError, ValueError):
    """A stream, subscription or bookie name outside the allowed characters."""
