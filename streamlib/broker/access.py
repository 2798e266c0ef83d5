"""Who calls the broker, what they may do, and how many sessions they may hold.

The broker authenticates a caller as the bookies do (bookie/auth.py: a token or a
client certificate names a principal, the metadata store's principal map gives its
roles), adds the principal's subscription grants (metadata/services/principals.py,
followed by a watch), and asks the table in streamlib/protocol/service_access.py
before every operation: the broker's own principal is for the work its callers may
ask of it, never for what they may not.

Budgets bound what one subscription and one consumer may make the broker hold, in
bytes. Sessions (producers, consumers, readers: one call each) are counted per broker and per
principal; one over either cap is refused with TooManySessionsError, which a client
retries with backoff (another may have ended meanwhile), as Pulsar answers
ServiceNotReady / ProducerBusy.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any

from streamlib.broker.dedup import RECENT_BUDGET
from streamlib.protocol import service_access
from streamlib.protocol.dispatch import Dispatch, Kind
from streamlib.protocol.errors import TooManySessionsError, UnauthorizedError
from streamlib.protocol.service_access import Caller, Operation

ANYONE = Caller(None)  # authentication off: the plaintext sandbox's default
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_MAX_SESSIONS_PER_PRINCIPAL = 5_000


@dataclass(frozen=True)
class Budgets:
    """What one subscription and one consumer may make the broker hold (Pulsar's
    maxUnackedMessagesPerConsumer, plus bytes: messages handed out and not yet
    acknowledged are held for redelivery, and a count alone let a consumer granting
    2**32-1 permits and never reading hold a whole backlog). A subscription also reads
    ahead up to RECEIVER_QUEUE_BYTES (streamlib/stream/reader.py) in its cursor's queue
    and a few range reads in flight."""

    read_ahead_bytes_per_subscription: int = 4 << 20  # read, not yet handed out
    unacked_bytes_per_consumer: int = 8 << 20
    unacked_messages_per_consumer: int = 50_000
    # Sends read from producers and not yet durable, for the whole broker (Pulsar's
    # maxMessagePublishBufferSizeInMB): past it, producers' streams stop being read.
    publish_buffer_bytes: int = 64 << 20
    # The positions of producers' recent sequence ids (a duplicate's answer) every
    # stream's dedup keeps, together (streamlib/broker/dedup.py).
    dedup_recent_ids: int = RECENT_BUDGET

    def dispatch(self, kind: Kind) -> Dispatch:
        return Dispatch(
            kind,
            max_unacked=self.unacked_messages_per_consumer,
            max_pending_bytes=self.read_ahead_bytes_per_subscription,
            max_unacked_bytes=self.unacked_bytes_per_consumer,
        )


class BrokerAccess:
    """control: the bookies' AccessControl (authentication and roles), None: off."""

    def __init__(self, control: Any = None) -> None:
        self.control = control
        self.grants: dict[str, tuple[str, ...]] = {}

    def set_grants(self, grants: dict[str, tuple[str, ...]]) -> None:
        self.grants = dict(grants)

    def caller(self, context: Any) -> Caller:
        """Who makes this call; UnauthenticatedError when nobody the broker accepts."""
        if self.control is None:
            return ANYONE
        principal = self.control.principal(context)
        if principal is None:
            return ANYONE
        return Caller(
            principal,
            self.control.roles.get(principal, frozenset()),
            self.grants.get(principal, ()),
        )

    def check(
        self,
        caller: Caller,
        operation: Operation,
        stream: str = "",
        subscription: str | None = None,
    ) -> None:
        """UnauthorizedError unless the caller may; a refusal is counted and logged as
        the bookies' are."""
        try:
            service_access.check(caller, operation, stream, subscription)
        except UnauthorizedError as error:
            if self.control is not None:
                self.control.refused_role(caller.principal or "?", str(error))
            raise


class ByteBudget:
    """Bytes held at once across callers: a taker waits while the budget is spent (one
    larger than the whole budget goes alone, when nothing else is held)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._freed = asyncio.Event()

    async def take(self, size: int) -> None:
        while self.held and self.held + size > self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.held += size

    def give_back(self, size: int) -> None:
        self.held -= size
        self._freed.set()


class HeldBytes:
    """One session's share of a ByteBudget, so its end gives back what it still holds:
    after give_back_all, nothing more is held (a take that ends later gives its bytes
    back at once, and giving back is done)."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.held = 0
        self.ended = False

    async def take(self, size: int) -> None:
        await self.budget.take(size)
        if self.ended:
            self.budget.give_back(size)
        else:
            self.held += size

    def give_back(self, size: int) -> None:
        if self.ended:
            return
        self.held -= size
        self.budget.give_back(size)

    def give_back_all(self) -> None:
        self.give_back(self.held)
        self.ended = True


class SessionLimits:
    """Sessions held, per broker and per principal (anonymous callers count as one)."""

    def __init__(
        self,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_per_principal: int = DEFAULT_MAX_SESSIONS_PER_PRINCIPAL,
    ) -> None:
        if max_sessions < 1 or max_per_principal < 1:
            raise ValueError("session limits must be >= 1")
        self.max_sessions = max_sessions
        self.max_per_principal = max_per_principal
        self.held = 0
        self.by_principal: collections.Counter[str] = collections.Counter()

    def take(self, caller: Caller) -> None:
        """Hold one more session for caller; TooManySessionsError when over a cap."""
        who = caller.principal or ""
        if self.held >= self.max_sessions:
            raise TooManySessionsError(
                f"this broker holds {self.held} sessions, its limit (--max-sessions): "
                "retry later or on another broker"
            )
        if self.by_principal[who] >= self.max_per_principal:
            raise TooManySessionsError(
                f"principal {caller.principal or '(anonymous)'} holds "
                f"{self.by_principal[who]} sessions on this broker, its limit "
                "(--max-sessions-per-principal): close some producers or consumers"
            )
        self.held += 1
        self.by_principal[who] += 1

    def give_back(self, caller: Caller) -> None:
        who = caller.principal or ""
        self.held -= 1
        self.by_principal[who] -= 1
        if self.by_principal[who] <= 0:
            del self.by_principal[who]


async def follow_grants(store: Any, access: BrokerAccess, ready: asyncio.Event) -> None:
    """Keep access's grants equal to the metadata store's grants map."""
    from bookie.auth import follow_node
    from metadata.services.principals import SubscriptionGrants

    await follow_node(SubscriptionGrants(store), access.set_grants, ready)
