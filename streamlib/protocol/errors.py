"""One exception hierarchy for everything a streamlib client raises.

The root is :class:`StreamlibError`. Errors that mirror a bookie status code carry
that code (``err.code``), so a caller can act on the class or on the code. Metadata
store errors (BadVersionError, NoNodeError, ...) live in ``metadata.errors`` because
the metadata package sits below this one and imports nothing of ours; the public
``streamlib.errors`` module re-exports both families.

Each class says whether it is worth trying again (``retriable``, as aiokafka's errors
do): whether the same operation, tried later -- after looking things up again, the
ledger's metadata or the stream's broker -- may succeed. Whoever retries asks the error
(:func:`is_retriable`, through a ``streamlib.retry.RetryPolicy``), never a list of
names. Retriable are a bookie's passing conditions (unreachable, pushing back, I/O,
read-only), an aborted recovery, and what a broker relays when its own work failed --
the ledger or stream moved on under it (fenced, closed, another term, a subscription
not there yet) -- which a service client cures by looking the stream up again. Not retriable: a refused request (bad,
unauthorized, too large, a busy name or subscription, a fenced producer), a stream that
does not exist, a TLS mismatch, a closed client. A writer that is fenced stops all the
same: fencing is retriable for whoever looks the stream up again, not for the writer it
fenced (streamlib.retry.retriable_unless_fenced).
"""

from __future__ import annotations

import builtins
import enum


class StatusCode(enum.IntEnum):
    """Bookie status codes; the numbers are the wire's (bookie.proto StatusCode)."""

    STATUS_UNSPECIFIED = 0
    OK = 1
    NO_SUCH_LEDGER = 2
    NO_SUCH_ENTRY = 3
    FENCED = 4
    INVALID_TERM = 5
    UNAUTHORIZED = 6
    READ_ONLY = 7
    TOO_LARGE = 8
    BAD_REQUEST = 9
    IO_ERROR = 10
    TOO_MANY_REQUESTS = 11
    UNAUTHENTICATED = 12


class StreamlibError(Exception):
    """Root of every error streamlib raises. ``retriable``: see the module docstring; the
    root says no, and a class whose condition passes says yes itself."""

    code: StatusCode | None = None
    retriable: bool = False


# -- errors that mirror a bookie status code ------------------------------------------


class NoSuchLedgerError(StreamlibError):
    """The ledger does not exist (on a bookie, or in the metadata)."""

    code = StatusCode.NO_SUCH_LEDGER
    retriable = True


class NoSuchEntryError(StreamlibError):
    """The entry does not exist (beyond the end of the ledger, or trimmed)."""

    code = StatusCode.NO_SUCH_ENTRY
    retriable = True


class LedgerFencedError(StreamlibError):
    """The ledger was fenced by a recovery: this writer may not add any more.

    As protocol.txt says, an add failing with this error may or may not have been
    written; only the recovered ledger's last entry tells."""

    code = StatusCode.FENCED
    retriable = True


class InvalidTermError(StreamlibError):
    """A newer writer took over the unbounded ledger (a higher term): disengage."""

    code = StatusCode.INVALID_TERM
    retriable = True


class UnauthorizedError(StreamlibError):
    """Not allowed: a wrong ledger password (master key mismatch), or a principal whose
    roles do not allow the request (a reader adding or fencing, a revoked principal)."""

    code = StatusCode.UNAUTHORIZED
    retriable = False


class UnauthenticatedError(UnauthorizedError):
    """The bookie requires a principal and got none it accepts: no credentials, or a
    token that is expired, forged or malformed (the message says which). A subclass of
    UnauthorizedError, so code that stops on a refusal stops on this one too."""

    code = StatusCode.UNAUTHENTICATED
    retriable = False


class ReadOnlyError(StreamlibError):
    """The bookie is read-only and refuses normal adds."""

    code = StatusCode.READ_ONLY
    retriable = True


class TooLargeError(StreamlibError):
    """An entry or request is over the size limit."""

    code = StatusCode.TOO_LARGE
    retriable = False


class BadRequestError(StreamlibError, ValueError):
    """A malformed request or argument."""

    code = StatusCode.BAD_REQUEST
    retriable = False


class BookieIOError(StreamlibError):
    """A bookie could not read or write. Never evidence that an entry is absent."""

    code = StatusCode.IO_ERROR
    retriable = True


class TooManyRequestsError(StreamlibError):
    """A bookie pushed back; retry later."""

    code = StatusCode.TOO_MANY_REQUESTS
    retriable = True


# -- client-side errors -----------------------------------------------------------------


class InvalidLedgerConfigError(BadRequestError):
    """Ledger creation parameters break E >= Qw >= Qa >= 1 (or another rule)."""


class InvalidSchemaError(BadRequestError):
    """A schema definition no stream may keep (streamlib.schema.validate_definition):
    not what its type says -- not JSON, not a JSON object, nested or sized past the
    limits, an Avro schema fastavro refuses, an unknown type. The message says which."""


class IllegalTransitionError(StreamlibError):
    """A ledger state change the state table does not allow."""

    retriable = True


class LedgerClosedError(StreamlibError):
    """The ledger is closed: no more adds, and reads stop at its last entry."""

    retriable = True


class LedgerStateConflictError(StreamlibError):
    """Someone else closed the ledger at a different last entry than this writer's LAC."""

    retriable = True


class DigestMismatchError(StreamlibError):
    """An entry's digest does not match its contents: try another replica."""

    retriable = True


class RecoveryAbortedError(StreamlibError):
    """Recovery could not decide (too many Unknown responses); retry it later.

    Closing on Unknowns could truncate committed data, so recovery aborts instead."""

    retriable = True


class NotEnoughBookiesError(StreamlibError):
    """Fewer writable bookies than the ensemble needs."""

    retriable = True


class TooManySessionsError(StreamlibError):
    """A broker holds as many sessions (producers, consumers, readers) as it may, for
    everyone or for this principal: retry later (the service client does, with
    backoff), or close some."""

    retriable = True


class TooManyEnsembleChangesError(StreamlibError):
    """The writer hit its cap on ensemble changes for one ledger."""

    retriable = True


class BookieUnavailableError(StreamlibError):
    """A bookie could not be reached or did not answer in time."""

    retriable = True


class TlsError(StreamlibError):
    """This client's TLS settings and a server's do not match: plaintext to a TLS port,
    TLS to a plaintext one, a certificate the client does not trust (another CA, expired)
    or none where the server wants one. The message says which and what to set. No retry
    mends it: callers that retry give up on it at once."""

    retriable = False


class BookieTlsError(TlsError, BookieUnavailableError):
    """A TlsError with a bookie. Also a BookieUnavailableError: a read or a recovery
    goes on with the other replicas as for any bookie it cannot reach, and raises this
    when TLS is why it reached none."""

    retriable = False


class StreamFencedError(StreamlibError):
    """Another writer took over the stream; this producer may not send any more."""

    retriable = True


class NoSuchStreamError(StreamlibError):
    """The stream does not exist."""

    retriable = False


class NoSuchSubscriptionError(StreamlibError):
    """The stream has no subscription of that name."""

    retriable = True


class InvalidPositionError(BadRequestError):
    """A position (message id) that cannot be parsed or is out of range."""


class ClientClosedError(StreamlibError):
    """The client (or producer / consumer / handle) was closed."""

    retriable = False


class ConsumerBusyError(StreamlibError):
    """The subscription already has its active consumer (exclusive), or its consumers
    are of another type than the one asked for."""

    retriable = False


class UnsupportedConsumerTypeError(BadRequestError):
    """A consumer type that direct mode (clients talking to bookies) cannot deliver."""


class ProducerBusyError(StreamlibError):
    """The stream service refuses this producer: an exclusive producer holds the stream,
    exclusive access was asked while others publish, or its name is connected already."""

    retriable = False


class ProducerFencedError(StreamlibError):
    """An exclusive_with_fencing producer took the stream: this one may not send."""

    retriable = False


class BrokerUnavailableError(StreamlibError):
    """No broker of the stream service could be reached (or none serves the stream)."""

    retriable = True


class TimeoutError(StreamlibError, builtins.TimeoutError):
    """Nothing came within the timeout the caller gave; also the builtin TimeoutError,
    so ``except TimeoutError`` catches it either way."""

    retriable = True


class RetriesExhausted(StreamlibError):
    """A retry policy (streamlib.retry.RetryPolicy) tried an operation as long as it may
    and every try failed with an error worth retrying. The message says what was tried,
    how often, for how long and the last error (also ``last_error``, and the cause).
    Retriable: each failure was; only this policy's budget ran out, and a caller with a
    budget of its own (a later pass, the user) may try again."""

    retriable = True

    def __init__(
        self,
        message: str = "",
        *,
        attempts: int = 0,
        elapsed_s: float = 0.0,
        last_error: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.last_error = last_error


class RemoteError(StreamlibError):
    """A peer (a broker) failed with an error whose code this client does not know: a
    newer peer's, or a class of the server's own. ``remote_code`` is that code.
    Retriable: an unknown code cannot say it is permanent, and a peer whose own work
    failed is looked up again (what the service client did before classes said)."""

    retriable = True

    def __init__(self, message: str = "", *, remote_code: str = "") -> None:
        super().__init__(message)
        self.remote_code = remote_code


def is_retriable(error: BaseException) -> bool:
    """Whether trying again may succeed. The error's own ``retriable`` if it has one:
    every StreamlibError does, and metadata.errors' MetadataError (asked by attribute:
    this module imports nothing outside the protocol core). Otherwise only the builtins
    that name a passing condition wherever they come from: TimeoutError, ConnectionError.
    A library's transport errors (gRPC's) are the I/O layer's to judge
    (streamlib.retry.retriable_over_the_wire). Never a cancellation."""
    retriable = getattr(error, "retriable", None)
    if isinstance(retriable, bool):
        return retriable
    return isinstance(error, builtins.TimeoutError | ConnectionError)


_BY_CODE: dict[StatusCode, type[StreamlibError]] = {
    cls.code: cls
    for cls in (
        NoSuchLedgerError,
        NoSuchEntryError,
        LedgerFencedError,
        InvalidTermError,
        UnauthorizedError,
        UnauthenticatedError,
        ReadOnlyError,
        TooLargeError,
        BadRequestError,
        BookieIOError,
        TooManyRequestsError,
    )
    if cls.code is not None
}


def error_for_status(code: int, message: str = "") -> StreamlibError:
    """The exception for a non-OK wire status (an unknown or unspecified code is a
    broken peer, reported as BadRequestError)."""
    try:
        status = StatusCode(code)
    except ValueError:
        return BadRequestError(f"bookie answered unknown status code {code}: {message}")
    cls = _BY_CODE.get(status)
    if cls is None:
        return BadRequestError(f"bookie answered {status.name}: {message}")
    return cls(message or status.name)


REFUSALS = (StatusCode.UNAUTHORIZED, StatusCode.UNAUTHENTICATED)


def refusal(bookie: str, status: int) -> StreamlibError:
    """The error for a bookie refusing a recovery or write (REFUSALS): this client may
    not go on with the ledger there."""
    if status == StatusCode.UNAUTHENTICATED:
        return UnauthenticatedError(
            f"bookie {bookie} requires authentication and refused this client's "
            f"credentials (none, expired or not signed with the cluster's key)"
        )
    return UnauthorizedError(
        f"bookie {bookie} refused: a wrong ledger password, or this principal lacks the write role"
    )
