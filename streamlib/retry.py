"""The one way this client retries a compare-and-swap of metadata (tenacity): read,
change, CAS; on BadVersionError (someone else wrote meanwhile) read again, with a short
jittered backoff, up to a bound. A retry that gives up raises CasRetriesExhausted, which
says so: never a silent "nothing happened"."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from metadata.errors import BadVersionError
from streamlib.protocol.errors import StreamlibError

T = TypeVar("T")

CAS_ATTEMPTS = 20


class CasRetriesExhausted(StreamlibError):
    """A metadata update lost its compare-and-swap every time it was tried."""


async def retry_cas(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    attempts: int = CAS_ATTEMPTS,
    conflict: type[Exception] = BadVersionError,
) -> T:
    """Run attempt() (read, change, CAS) until it does not raise `conflict`."""
    try:
        async for trying in AsyncRetrying(
            retry=retry_if_exception_type(conflict),
            stop=stop_after_attempt(attempts),
            wait=wait_random_exponential(multiplier=0.005, max=0.2),
        ):
            with trying:
                return await attempt()
    except RetryError:
        raise CasRetriesExhausted(
            f"{what}: the compare-and-swap lost to another writer {attempts} times in a row"
        ) from None
    raise AssertionError("unreachable")  # pragma: no cover
