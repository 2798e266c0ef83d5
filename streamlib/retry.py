"""The one way streamlib tries an operation again (kazoo's retry.py: one KazooRetry, reused
by every recipe), built on tenacity.

A :class:`RetryPolicy` says how many tries and for how long, how long to pause between
them, which failures are worth another try and what to raise when it gives up. Which
failures: by default the error's own word (``is_retriable``: each error class says
whether it is ``retriable``, as aiokafka's do), so no retry site keeps a list of names.
A loop that exists to ride out one condition says so with ``only(...)``: a CAS retries
its conflict, a recovery its abort. A failure not worth retrying ends the run at once,
raised as it is. A run that gives up raises a :class:`RetriesExhausted` (or the policy's
subclass of it) that says what was tried, how often, for how long, and the last error:
never a silent "nothing happened".

The project's retry budgets, side by side (waits: the first pause, doubling up to the
cap; "jittered": each pause drawn from [0, that], so that clients that met the same
contention spread out):

===================== ============================== =================== =================
policy                who                            bound               waits
===================== ============================== =================== =================
CAS                   retry_cas: metadata read,       20 attempts         5 ms..0.2 s,
                      change, compare-and-swap                            jittered
RECOVERY              LedgerManager.open / take_over  20 s (+ attempts)   0.1..2 s, jittered
REPLICATION           ReplicationWorker.repair        3 attempts          0.2..5 s
SCAN_READ             StreamScanner: entries no       30 s                50 ms..1 s,
                      replica could serve                                 jittered
STREAM_LEDGER_CLOSE   StreamWriter: closing a         10 s                50 ms..1 s,
                      ledger rolled away from                             jittered
STREAM_LEDGER_REPLACE StreamWriter: a new ledger for  30 s                0.1..2 s, jittered
                      the broken one
FIRST_CONNECT         service client: a producer's /  30 s                0.1..2 s
                      consumer's first connection
RECONNECT             service client: connecting      none (until closed) 0.1..1 s,
                      again after a break                                 jittered
SPARK_TASK_PRODUCER   a Spark task's named producer:  30 s                0.1..2 s,
                      its name still held by a dead                       jittered
                      attempt's session
registration(t)       a broker registering its id     3 t + 5 s           50 ms..1 s
===================== ============================== =================== =================
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from metadata.errors import BadVersionError, NodeExistsError
from streamlib.protocol.errors import (
    BookieIOError,
    InvalidTermError,
    LedgerFencedError,
    ProducerBusyError,
    RecoveryAbortedError,
    RetriesExhausted,
    StreamFencedError,
    is_retriable,
)

T = TypeVar("T")

Predicate = Callable[[BaseException], bool]


def only(*kinds: type[BaseException]) -> Predicate:
    """A retry_on for a loop that rides out these conditions and no other."""

    def matches(error: BaseException) -> bool:
        return isinstance(error, kinds)

    matches.__qualname__ = f"only({', '.join(k.__name__ for k in kinds)})"
    return matches


# A writer that is fenced hands the ledger or stream over: it never tries again, though
# the same error is retriable for whoever looks the stream up again (a service client).
FENCING = (LedgerFencedError, InvalidTermError, StreamFencedError)


def retriable_unless_fenced(error: BaseException) -> bool:
    """is_retriable, for a writer: being fenced is its cue to stop."""
    return not isinstance(error, FENCING) and is_retriable(error)


def is_transport_failure(error: BaseException) -> bool:
    """A gRPC call that failed, or a socket error or timeout under it: another connection
    (to the same server or another) may work. Here, not in the sans-I/O core, which
    knows nothing of gRPC."""
    return isinstance(error, grpc.aio.AioRpcError | OSError)


def retriable_over_the_wire(error: BaseException) -> bool:
    """is_retriable, for a client of a server: its transport failures are retriable too."""
    return is_retriable(error) or is_transport_failure(error)


class CasRetriesExhausted(RetriesExhausted):
    """A metadata update lost its compare-and-swap every time it was tried."""


class RecoveryRetriesExhausted(RetriesExhausted, RecoveryAbortedError):
    """A ledger's recovery (or takeover) aborted every time it was tried. Also a
    RecoveryAbortedError, as each of its tries was."""


class ReadRetriesExhausted(RetriesExhausted, BookieIOError):
    """Entries no replica could serve, for as long as the reader tried. Also a
    BookieIOError, as each of its tries was."""


@dataclass(frozen=True)
class RetryPolicy:
    """How one kind of operation is tried again. Immutable: ``replace`` gives a variant
    (a caller's own bound, a test's zero waits)."""

    #: At most this many tries (None: no bound on the count).
    attempts: int | None = None
    #: No new try once this long has passed since the first began (None: no bound).
    stop_after_s: float | None = None
    #: The pause after the first failure; it doubles after each further one ...
    wait_initial_s: float = 0.05
    #: ... up to this.
    wait_max_s: float = 2.0
    #: Each pause drawn uniformly from [0, that] ("full jitter").
    jitter: bool = True
    #: Which failures are worth another try (only Exceptions ever are: never a
    #: cancellation).
    retry_on: Predicate = is_retriable
    #: What a run that gives up raises.
    gives_up_with: type[RetriesExhausted] = RetriesExhausted
    #: What to do about it, said in that error's message.
    advice: str = ""
    #: How a pause is taken (a test records the pauses instead of taking them).
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"a retry policy tries at least once, not {self.attempts} times")
        if self.stop_after_s is not None and self.stop_after_s < 0:
            raise ValueError(f"stop_after_s must be >= 0, got {self.stop_after_s}")
        if not 0 <= self.wait_initial_s <= self.wait_max_s:
            raise ValueError(
                f"waits must be 0 <= wait_initial_s <= wait_max_s, "
                f"got {self.wait_initial_s} and {self.wait_max_s}"
            )

    def replace(self, **changes: Any) -> RetryPolicy:
        return dataclasses.replace(self, **changes)

    def _stop(self, spent_s: float = 0.0) -> stop_base:
        stop: stop_base = stop_never
        if self.stop_after_s is not None:
            stop = stop_after_delay(max(0.0, self.stop_after_s - spent_s))
        if self.attempts is not None:
            by_count = stop_after_attempt(self.attempts)
            stop = by_count if self.stop_after_s is None else stop | by_count
        return stop

    def _wait(self) -> wait_base:
        shape = wait_random_exponential if self.jitter else wait_exponential
        return shape(multiplier=self.wait_initial_s, max=self.wait_max_s)

    def _worth_retrying(self, error: BaseException) -> bool:
        return isinstance(error, Exception) and self.retry_on(error)

    async def run(
        self,
        what: str,
        attempt: Callable[[], Awaitable[T]],
        *,
        on_retry: Callable[[BaseException, int], None] | None = None,
    ) -> T:
        """attempt() until it returns, a failure not worth retrying (raised as it is), or
        the bound (``gives_up_with``, naming ``what``). on_retry(error, attempt number) is
        called before each pause (to count or log them)."""

        def before_sleep(state: Any) -> None:
            if on_retry is not None:
                on_retry(state.outcome.exception(), state.attempt_number)

        started = time.monotonic()
        # The first try outside tenacity: most succeed, and setting a retry loop up costs
        # more than many an attempt (a broker reads each entry through one). A failure
        # worth retrying is handed to the loop as its first try's outcome, so pauses,
        # counts and the bound are as if the loop had made it.
        try:
            return await attempt()
        except Exception as error:
            if not self._worth_retrying(error):
                raise
            first: list[BaseException] = [error]

        async def again() -> T:
            if first:
                raise first.pop()
            return await attempt()

        retrying = AsyncRetrying(
            retry=retry_if_exception(self._worth_retrying),
            stop=self._stop(time.monotonic() - started),
            wait=self._wait(),
            before_sleep=before_sleep,
            sleep=self.sleep,
        )
        try:
            async for trying in retrying:
                with trying:
                    return await again()
        except RetryError as gave_up:
            tries = gave_up.last_attempt.attempt_number
            last = gave_up.last_attempt.exception()
            elapsed_s = time.monotonic() - started
            advice = f": {self.advice}" if self.advice else ""
            raise self.gives_up_with(
                f"{what} gave up after {tries} attempt{'s' if tries > 1 else ''} in "
                f"{elapsed_s:.1f}s{advice}. Last error: {type(last).__name__}: {last}",
                attempts=tries,
                elapsed_s=elapsed_s,
                last_error=last,
            ) from last
        raise AssertionError("unreachable")  # pragma: no cover


CAS_ATTEMPTS = 20
CAS = RetryPolicy(
    attempts=CAS_ATTEMPTS,
    wait_initial_s=0.005,
    wait_max_s=0.2,
    retry_on=only(BadVersionError),
    gives_up_with=CasRetriesExhausted,
    advice="the compare-and-swap lost to another writer every time; try again",
)

# A recovery (or takeover) that aborts -- some bookies did not answer, and an Unknown is
# never taken for a missing entry -- is tried again from freshly read metadata, for long
# enough to ride out bookies that restart (their connections come back within a second).
RECOVERY_RETRY_FOR_S = 20.0
RECOVERY = RetryPolicy(
    stop_after_s=RECOVERY_RETRY_FOR_S,
    wait_initial_s=0.1,
    wait_max_s=2.0,
    retry_on=only(RecoveryAbortedError),
    gives_up_with=RecoveryRetriesExhausted,
    advice="the bookies of its last fragment never answered enough to decide; "
    "check that they are up, then try again",
)

# A ledger's repair, per pass: then its lock is released, its mark stays, and a later
# pass (of any worker) tries again.
REPLICATION = RetryPolicy(attempts=3, wait_initial_s=0.2, wait_max_s=5.0, jitter=False)

# Confirmed entries come back with their bookies: a reader waits for them.
SCAN_READ = RetryPolicy(
    stop_after_s=30.0,
    wait_initial_s=0.05,
    wait_max_s=1.0,
    retry_on=only(BookieIOError),
    gives_up_with=ReadRetriesExhausted,
    advice="no replica of these entries could be read; check the ledger's bookies",
)

# Readers wait for the close of a ledger a writer rolled away from.
STREAM_LEDGER_CLOSE = RetryPolicy(
    stop_after_s=10.0, wait_initial_s=0.05, wait_max_s=1.0, retry_on=retriable_unless_fenced
)

# Appends are held while a writer replaces its broken ledger, as bookies come back.
STREAM_LEDGER_REPLACE = RetryPolicy(
    stop_after_s=30.0, wait_initial_s=0.1, wait_max_s=2.0, retry_on=retriable_unless_fenced
)

# The service client (streamlib/broker/client.py): a producer's or consumer's first
# connection gives up after FIRST_CONNECT (its error is create_producer's / subscribe's);
# once it was connected, it connects again after every break until closed, as Pulsar's
# clients do, the pauses starting over after each connection that came up.
FIRST_CONNECT = RetryPolicy(
    stop_after_s=30.0,
    wait_initial_s=0.1,
    wait_max_s=2.0,
    jitter=False,
    retry_on=retriable_over_the_wire,
)
# (an owner stopped past its session: its stream is served again within about a second
# of the session's end, the target of `streamlib bench failover`;
# jittered: after a failover, a broker's many clients do not all come back in step)
RECONNECT = FIRST_CONNECT.replace(stop_after_s=None, wait_max_s=1.0, jitter=True)

# A Spark task publishing from an executor names its producer after its query and
# partition (streamlib/spark/publish.py): a retry of a task whose executor died finds the
# name still connected until the broker notices the dead connection (heartbeats: a few
# seconds), and waits for it rather than failing the task again.
SPARK_TASK_PRODUCER = RetryPolicy(
    stop_after_s=30.0,
    wait_initial_s=0.1,
    wait_max_s=2.0,
    retry_on=only(ProducerBusyError),
    advice="another attempt of the same task still publishes under its name",
)


def registration(session_timeout_s: float) -> RetryPolicy:
    """Registering a process's id (a broker's): after a crash the dead process's
    registration holds the id until the store reaps its session, which it does within
    about three session timeouts."""
    return RetryPolicy(
        stop_after_s=3 * session_timeout_s + 5,
        wait_initial_s=0.05,
        wait_max_s=1.0,
        jitter=False,
        retry_on=only(NodeExistsError),
        advice="the id is still registered: another live process has it, or the store "
        "never reaped the dead one's session",
    )


async def retry_cas(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    attempts: int = CAS_ATTEMPTS,
    conflict: type[Exception] = BadVersionError,
) -> T:
    """Run attempt() (read, change, CAS) until it does not raise `conflict`."""
    return await CAS.replace(attempts=attempts, retry_on=only(conflict)).run(what, attempt)
