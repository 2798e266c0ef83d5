"""Retrying is one idea: each error class says whether it is retriable, one predicate asks
it, one policy object (streamlib.retry.RetryPolicy) runs the tries. No test here waits
on a clock: pauses are recorded, not taken."""

from __future__ import annotations

import asyncio
import builtins
import itertools

import grpc
import pytest

from metadata import errors as metadata_errors
from streamlib.autorecovery import errors as autorecovery_errors
from streamlib.ledger.driver import MetadataStoreFailure
from streamlib.protocol import errors
from streamlib.protocol.errors import (
    BadRequestError,
    BookieIOError,
    BookieTlsError,
    BookieUnavailableError,
    LedgerFencedError,
    NoSuchEntryError,
    RecoveryAbortedError,
    RemoteError,
    RetriesExhausted,
    StreamlibError,
    TooManySessionsError,
    is_retriable,
)
from streamlib.retry import (
    CAS,
    FIRST_CONNECT,
    RECONNECT,
    RECOVERY,
    REPLICATION,
    SCAN_READ,
    STREAM_LEDGER_CLOSE,
    STREAM_LEDGER_REPLACE,
    CasRetriesExhausted,
    ReadRetriesExhausted,
    RecoveryRetriesExhausted,
    RetryPolicy,
    registration,
    retriable_over_the_wire,
    retriable_unless_fenced,
    retry_cas,
)
from streamlib.schema import IncompatibleSchemaError, SchemaDecodeError

# The service client's list of errors no reconnect can cure (streamlib/broker/client.py's
# PERMANENT, before the classes said it themselves): every one stays not retriable.
OLD_PERMANENT = {"BadRequestError", "UnauthorizedError", "UnauthenticatedError",
                 "ProducerFencedError", "IncompatibleSchemaError", "NoSuchStreamError",
                 "TooLargeError", "InvalidPositionError", "UnsupportedConsumerTypeError",
                 "ProducerBusyError", "ConsumerBusyError", "InvalidNameError",
                 "ClientClosedError", "InvalidSchemaError", "TlsError",
                 "BookieTlsError"}  # fmt: skip


def _named(name: str) -> type[BaseException]:
    for home in (errors, metadata_errors):
        found = getattr(home, name, None)
        if isinstance(found, type):
            return found
    return {"IncompatibleSchemaError": IncompatibleSchemaError}[name]


def _classes_of(module: object, root: type[BaseException]) -> list[type[BaseException]]:
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, root)
        and value.__module__ == module.__name__
    ]


@pytest.mark.parametrize("name", sorted(OLD_PERMANENT))
def test_every_error_the_service_client_never_retried_says_it_is_not_retriable(name):
    cls = _named(name)
    assert cls.retriable is False
    assert not is_retriable(cls("refused"))


@pytest.mark.parametrize(
    "cls",
    [
        c
        for c in _classes_of(errors, StreamlibError)
        if c.__name__ not in OLD_PERMANENT and c is not errors.InvalidLedgerConfigError
    ],
    ids=lambda c: c.__name__,
)
def test_every_other_error_of_the_core_stays_retriable_as_the_service_client_had_it(cls):
    # Two exceptions. The root: the default of a class that says nothing (what a broker
    # reports under a code this client does not know is a RemoteError, retriable). And
    # InvalidLedgerConfigError, which the list forgot: a BadRequestError like the others.
    assert cls is StreamlibError or cls.retriable is True
    assert not StreamlibError.retriable and not errors.InvalidLedgerConfigError.retriable


# What each class says, one row per class (the aiokafka rule: the class decides).
RETRIABLE = {
    # streamlib.protocol.errors
    errors.StreamlibError: False,
    errors.NoSuchLedgerError: True,
    errors.NoSuchEntryError: True,
    errors.LedgerFencedError: True,
    errors.InvalidTermError: True,
    errors.UnauthorizedError: False,
    errors.UnauthenticatedError: False,
    errors.ReadOnlyError: True,
    errors.TooLargeError: False,
    errors.BadRequestError: False,
    errors.BookieIOError: True,
    errors.TooManyRequestsError: True,
    errors.InvalidLedgerConfigError: False,
    errors.InvalidSchemaError: False,
    errors.IllegalTransitionError: True,
    errors.LedgerClosedError: True,
    errors.LedgerStateConflictError: True,
    errors.DigestMismatchError: True,
    errors.RecoveryAbortedError: True,
    errors.NotEnoughBookiesError: True,
    errors.TooManySessionsError: True,
    errors.TooManyEnsembleChangesError: True,
    errors.BookieUnavailableError: True,
    errors.TlsError: False,
    errors.BookieTlsError: False,
    errors.StreamFencedError: True,
    errors.NoSuchStreamError: False,
    errors.NoSuchSubscriptionError: True,
    errors.InvalidPositionError: False,
    errors.ClientClosedError: False,
    errors.ConsumerBusyError: False,
    errors.UnsupportedConsumerTypeError: False,
    errors.ProducerBusyError: False,
    errors.ProducerFencedError: False,
    errors.BrokerUnavailableError: True,
    errors.TimeoutError: True,
    errors.RetriesExhausted: True,
    errors.RemoteError: True,
    # elsewhere in streamlib
    IncompatibleSchemaError: False,
    SchemaDecodeError: False,
    MetadataStoreFailure: True,
    CasRetriesExhausted: True,
    RecoveryRetriesExhausted: True,
    ReadRetriesExhausted: True,
    autorecovery_errors.AutoRecoveryError: False,
    autorecovery_errors.ReplicationCopyError: True,
    autorecovery_errors.UnknownBookieError: False,
    autorecovery_errors.BookieStillWritableError: False,
    autorecovery_errors.DecommissionTimeoutError: True,
    # metadata.errors (the same attribute: one predicate asks both families)
    metadata_errors.MetadataError: False,
    metadata_errors.BadVersionError: True,
    metadata_errors.NoNodeError: False,
    metadata_errors.NodeExistsError: False,
    metadata_errors.NotEmptyError: False,
    metadata_errors.NoChildrenForEphemeralsError: False,
    metadata_errors.InvalidPathError: False,
    metadata_errors.InvalidValueError: False,
    metadata_errors.ValueTooLargeError: False,
    metadata_errors.InvalidURIError: False,
    metadata_errors.UnknownSchemeError: False,
    metadata_errors.SessionExpiredError: False,
    metadata_errors.ConnectionLossError: True,
    metadata_errors.StoreBusyError: True,
    metadata_errors.StoreIOError: False,
    metadata_errors.AuthFailedError: False,
    metadata_errors.SchemaError: False,
    metadata_errors.ServiceError: False,
    metadata_errors.NoSuchLedgerError: False,
    metadata_errors.LedgerExistsError: False,
    metadata_errors.NoSuchStreamError: False,
    metadata_errors.StreamExistsError: False,
    metadata_errors.InvalidNameError: False,
}


@pytest.mark.parametrize("cls", list(RETRIABLE), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_each_error_class_says_whether_it_is_retriable(cls):
    assert cls.retriable is RETRIABLE[cls]
    assert is_retriable(cls("x")) is RETRIABLE[cls]


def test_the_table_names_every_error_class_of_the_core_and_of_the_metadata_layer():
    every = _classes_of(errors, StreamlibError) + _classes_of(
        metadata_errors, metadata_errors.MetadataError
    )
    # (TransactionError's instances say it: see the next test)
    assert set(every) - set(RETRIABLE) == {metadata_errors.TransactionError}


def test_a_transaction_failure_is_retriable_when_its_cause_is():
    assert is_retriable(metadata_errors.TransactionError(0, metadata_errors.BadVersionError()))
    assert not is_retriable(metadata_errors.TransactionError(1, metadata_errors.NoNodeError()))


def test_an_error_a_broker_reports_under_an_unknown_code_is_retriable():
    error = RemoteError("StreamGone: unloaded", remote_code="StreamGone")
    assert is_retriable(error) and error.remote_code == "StreamGone"


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="down")


@pytest.mark.parametrize(
    ("error", "in_the_core", "over_the_wire"),
    [
        (builtins.TimeoutError("slow"), True, True),
        (ConnectionRefusedError("refused"), True, True),
        (ConnectionResetError("reset"), True, True),
        (FileNotFoundError("no such file"), False, True),  # an OSError: the client's today
        (_rpc_error(grpc.StatusCode.UNAVAILABLE), False, True),
        (_rpc_error(grpc.StatusCode.INTERNAL), False, True),
        (ValueError("bad"), False, False),
        (RuntimeError("bug"), False, False),
        (KeyError("k"), False, False),
        (asyncio.CancelledError(), False, False),
        (BadRequestError("bad"), False, False),
        (TooManySessionsError("full"), True, True),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_is_retriable_on_exceptions_from_outside_streamlib(error, in_the_core, over_the_wire):
    assert is_retriable(error) is in_the_core
    assert retriable_over_the_wire(error) is over_the_wire


def test_a_fenced_writer_does_not_retry_being_fenced():
    assert is_retriable(LedgerFencedError("x"))  # (whoever looks the stream up again)
    for fencing in (errors.LedgerFencedError, errors.InvalidTermError, errors.StreamFencedError):
        assert not retriable_unless_fenced(fencing("fenced"))
    assert retriable_unless_fenced(BookieUnavailableError("down"))
    assert not retriable_unless_fenced(BookieTlsError("mismatch"))


# -- the policy ---------------------------------------------------------------------------


class Pauses:
    """A policy's sleep that records each pause instead of taking it."""

    def __init__(self) -> None:
        self.taken: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)


def failing(*outcomes: BaseException | str):
    """An attempt that raises (or returns) these outcomes in turn; .calls counts them."""
    queue = list(outcomes)

    async def attempt() -> str:
        attempt.calls += 1
        outcome = queue.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    attempt.calls = 0
    return attempt


async def test_a_policy_retries_a_retriable_error_until_the_attempt_succeeds():
    pauses = Pauses()
    policy = RetryPolicy(attempts=5, wait_initial_s=0.1, wait_max_s=1.0, jitter=False, sleep=pauses)
    attempt = failing(BookieUnavailableError("down"), TooManySessionsError("full"), "done")
    retried: list[tuple[str, int]] = []

    result = await policy.run(
        "a thing", attempt, on_retry=lambda e, n: retried.append((type(e).__name__, n))
    )

    assert result == "done" and attempt.calls == 3
    assert retried == [("BookieUnavailableError", 1), ("TooManySessionsError", 2)]
    assert pauses.taken == [0.1, 0.2]


async def test_a_policy_stops_at_once_on_an_error_that_is_not_retriable_and_raises_it_unchanged():
    refused = BadRequestError("malformed")
    attempt = failing(refused, "never")
    with pytest.raises(BadRequestError) as raised:
        await RetryPolicy(attempts=5, sleep=Pauses()).run("a thing", attempt)
    assert raised.value is refused and attempt.calls == 1


async def test_a_policy_gives_up_at_its_bound_with_an_error_that_says_so():
    last = BookieUnavailableError("still down")
    attempt = failing(BookieUnavailableError("down"), BookieUnavailableError("down"), last)
    policy = RetryPolicy(attempts=3, sleep=Pauses(), advice="check the bookies")

    with pytest.raises(RetriesExhausted) as gave_up:
        await policy.run("ledger 7: a thing", attempt)

    assert attempt.calls == 3
    assert gave_up.value.attempts == 3 and gave_up.value.last_error is last
    assert gave_up.value.__cause__ is last
    message = str(gave_up.value)
    assert message.startswith("ledger 7: a thing gave up after 3 attempts in ")
    assert "check the bookies" in message and "BookieUnavailableError: still down" in message
    assert is_retriable(gave_up.value)  # (a caller with a budget of its own may try later)


async def test_a_policy_bounded_in_time_gives_up_once_the_time_is_spent():
    attempt = failing(BookieUnavailableError("down"), "never")
    with pytest.raises(RetriesExhausted, match="gave up after 1 attempt in"):
        await RetryPolicy(stop_after_s=0, sleep=Pauses()).run("a thing", attempt)
    assert attempt.calls == 1


async def test_a_policy_never_retries_a_cancellation():
    attempt = failing(asyncio.CancelledError(), "never")
    policy = RetryPolicy(attempts=5, retry_on=lambda error: True, sleep=Pauses())
    with pytest.raises(asyncio.CancelledError):
        await policy.run("a thing", attempt)
    assert attempt.calls == 1


async def test_a_jittered_pause_is_drawn_below_the_doubling_cap():
    pauses = Pauses()
    policy = RetryPolicy(attempts=8, wait_initial_s=0.1, wait_max_s=0.5, sleep=pauses)
    with pytest.raises(RetriesExhausted):
        await policy.run("a thing", failing(*[BookieIOError("io")] * 8))
    caps = [0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5]
    assert len(pauses.taken) == len(caps)
    assert all(0 <= pause <= cap for pause, cap in zip(pauses.taken, caps, strict=True))


@pytest.mark.parametrize(
    "bad", [{"attempts": 0}, {"stop_after_s": -1}, {"wait_initial_s": 2, "wait_max_s": 1}]
)
def test_a_policy_refuses_a_bound_or_wait_that_makes_no_sense(bad):
    with pytest.raises(ValueError):
        RetryPolicy(**bad)


# -- the project's named policies ---------------------------------------------------------


async def test_reconnecting_pauses_as_the_service_client_did():
    # The first connection: min(2 s, 0.05 s * 2**n), n = 1, 2, ...
    pauses = Pauses()
    with pytest.raises(RetriesExhausted):
        await FIRST_CONNECT.replace(attempts=9, sleep=pauses).run(
            "stream 's'", failing(*[BookieUnavailableError("down")] * 9)
        )
    assert pauses.taken == [min(2.0, 0.05 * 2 ** min(n, 6)) for n in range(1, 9)]
    # Again after a break: jittered, each pause within [0, min(1 s, 0.05 s * 2**n)], so
    # a failed-over broker's clients do not all come back at once.
    pauses = Pauses()
    with pytest.raises(RetriesExhausted):
        await RECONNECT.replace(attempts=9, sleep=pauses).run(
            "stream 's'", failing(*[BookieUnavailableError("down")] * 9)
        )
    caps = [min(1.0, 0.05 * 2 ** min(n, 6)) for n in range(1, 9)]
    assert all(0 <= taken <= cap for taken, cap in zip(pauses.taken, caps, strict=True))
    assert RECONNECT.attempts is None and RECONNECT.stop_after_s is None  # until closed
    assert FIRST_CONNECT.stop_after_s == 30.0


@pytest.mark.parametrize(
    "error",
    [
        _rpc_error(grpc.StatusCode.UNAVAILABLE),
        ConnectionRefusedError(),
        builtins.TimeoutError(),
        TooManySessionsError("full"),
        errors.BrokerUnavailableError("gone"),
        RemoteError("StreamGone: moved", remote_code="StreamGone"),
        errors.StreamFencedError("the broker lost the stream"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_service_client_reconnects_after_what_it_reconnected_after(error):
    assert RECONNECT.retry_on(error) and FIRST_CONNECT.retry_on(error)


@pytest.mark.parametrize("name", sorted(OLD_PERMANENT))
def test_the_service_client_fails_on_what_it_failed_on(name):
    assert not RECONNECT.retry_on(_named(name)("refused"))


def test_each_named_policy_rides_out_its_own_condition():
    assert CAS.retry_on(metadata_errors.BadVersionError())
    assert not CAS.retry_on(metadata_errors.ConnectionLossError())  # (the outcome is unknown)
    assert RECOVERY.retry_on(RecoveryAbortedError("unknowns"))
    assert not RECOVERY.retry_on(BookieUnavailableError("down"))  # (recovery handles those)
    assert SCAN_READ.retry_on(BookieIOError("no replica"))
    assert not SCAN_READ.retry_on(NoSuchEntryError("trimmed"))  # (the scanner skips ahead)
    assert not SCAN_READ.retry_on(BookieTlsError("mismatch"))
    assert REPLICATION.retry_on is is_retriable
    for writer in (STREAM_LEDGER_CLOSE, STREAM_LEDGER_REPLACE):
        assert writer.retry_on(errors.NotEnoughBookiesError("2 of 3"))
        assert not writer.retry_on(LedgerFencedError("fenced"))
    broker = registration(10.0)
    assert broker.stop_after_s == 35.0
    assert broker.retry_on(metadata_errors.NodeExistsError("/brokers/b1"))
    assert not broker.retry_on(metadata_errors.ConnectionLossError())


async def test_giving_up_keeps_the_class_a_caller_catches():
    aborted = RecoveryAbortedError("unknowns")
    with pytest.raises(RecoveryAbortedError) as recovery:
        await RECOVERY.replace(attempts=2, wait_initial_s=0, sleep=Pauses()).run(
            "ledger 3: recovery", failing(aborted, aborted)
        )
    assert isinstance(recovery.value, RecoveryRetriesExhausted)
    assert "ledger 3: recovery gave up after 2 attempts" in str(recovery.value)

    with pytest.raises(BookieIOError) as read:
        await SCAN_READ.replace(attempts=2, sleep=Pauses()).run(
            "ledger 3: entries 0..9", failing(BookieIOError("io"), BookieIOError("io"))
        )
    assert isinstance(read.value, ReadRetriesExhausted)
    assert read.value.code is errors.StatusCode.IO_ERROR


async def test_retry_cas_rereads_after_a_conflict_and_gives_up_after_its_attempts():
    conflicts = itertools.count(1)

    async def lost_twice() -> int:
        if (n := next(conflicts)) <= 2:
            raise metadata_errors.BadVersionError(f"conflict {n}")
        return n

    # (CAS pauses at most 5 ms, then 10 ms: no wait worth faking)
    assert await retry_cas("node /x", lost_twice, attempts=5) == 3

    async def always_lost() -> None:
        raise metadata_errors.BadVersionError("conflict")

    with pytest.raises(CasRetriesExhausted, match=r"node /x gave up after 2 attempts .*lost"):
        await retry_cas("node /x", always_lost, attempts=2)

    gone = metadata_errors.NoNodeError("/x")

    async def vanished() -> None:
        raise gone

    with pytest.raises(metadata_errors.NoNodeError) as raised:
        await retry_cas("node /x", vanished)
    assert raised.value is gone
