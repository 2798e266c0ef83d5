"""Who may do what through the stream service: the broker's authorization table.

The bookies enforce roles per ledger request (bookie/ledger_rules.py); a broker acts on
the bookies with its own principal, so it must ask, for every operation a caller asks
of it, whether the CALLER may (architecture 4a: "the broker acts for its caller"). This
module is that question and nothing else: sans-I/O, a table a reviewer can hold against
Pulsar's broker authorization (produce / consume permissions per topic, plus
subscription-level grants) line by line.

- Roles are the bookies' four: read, write, admin, bookie. The bookie role is the
  bookies' own (re-replication); it may do nothing through the broker.
- A grant names one subscription a principal may consume and manage, whatever its
  roles: ``STREAM/SUB``, or a prefix ending in ``*`` (``orders/*``: every subscription of
  orders; ``team-a-*``: every subscription of every stream whose name starts so).
  ``streamlib admin principals grant NAME consume STREAM/SUB`` stores one
  (metadata/services/principals.py keeps them and checks their form).
- Whether a stream that does not exist is created by the operation that names it
  (``allow_auto_create``, Pulsar's allowAutoTopicCreation) is the cluster's policy; when
  it is on, creating still needs a role that may create.

Must never import anything outside streamlib.protocol (see its __init__).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from streamlib.protocol.errors import UnauthorizedError


class Operation(enum.Enum):
    LOOKUP = "look the stream up"
    CREATE = "create the stream"
    PRODUCE = "produce to (take over, fencing any other writer) the stream"
    CONSUME = "consume the subscription"
    READ = "read the stream without a subscription"
    MANAGE_SUBSCRIPTION = "seek, reset, skip or unsubscribe the subscription"
    UNLOAD = "unload the stream from its broker"
    ADMINISTER = "administer streams (create, delete, change defaults, trim)"


_READERS = frozenset({"read", "write", "admin"})
_WRITERS = frozenset({"write", "admin"})

#: The roles that allow each operation on any stream and subscription.
ROLES_ALLOWED: dict[Operation, frozenset[str]] = {
    Operation.LOOKUP: _READERS,
    Operation.CREATE: _WRITERS,
    Operation.PRODUCE: _WRITERS,
    Operation.CONSUME: _READERS,
    Operation.READ: _READERS,
    Operation.MANAGE_SUBSCRIPTION: _WRITERS,
    Operation.UNLOAD: frozenset({"admin"}),
    Operation.ADMINISTER: frozenset({"admin"}),
}

#: What a grant of a subscription allows (LOOKUP: of that subscription's stream).
GRANT_ALLOWS = frozenset({Operation.LOOKUP, Operation.CONSUME, Operation.MANAGE_SUBSCRIPTION})


@dataclass(frozen=True)
class Caller:
    """Who asks: a principal (None: authentication is off, and everyone may do
    everything), its roles, and its subscription grants."""

    principal: str | None
    roles: frozenset[str] = frozenset()
    grants: tuple[str, ...] = ()

    @property
    def anonymous(self) -> bool:
        return self.principal is None


_PARTITION = re.compile(r"(.+)-partition-\d+")  # (streamlib/stream/admin.py's names)


def grant_covers(grant: str, stream: str, subscription: str | None) -> bool:
    """Whether grant allows the subscription of the stream (subscription None: some
    subscription of the stream, for a lookup). A grant of a partitioned stream's
    subscription covers the same subscription of each of its partitions (the client
    consumes them one by one)."""
    partition = _PARTITION.fullmatch(stream)
    return _covers(grant, stream, subscription) or (
        partition is not None and _covers(grant, partition.group(1), subscription)
    )


def _covers(grant: str, stream: str, subscription: str | None) -> bool:
    if grant.endswith("*"):
        prefix = grant[:-1]
        if subscription is not None:
            return f"{stream}/{subscription}".startswith(prefix)
        # Some subscription of the stream can match: the prefix runs within the stream's
        # name, or past it into its subscriptions.
        head = f"{stream}/"
        return head.startswith(prefix) or prefix.startswith(head)
    if subscription is None:
        return grant.rpartition("/")[0] == stream
    return grant == f"{stream}/{subscription}"


def may(
    caller: Caller, operation: Operation, stream: str = "", subscription: str | None = None
) -> bool:
    if caller.anonymous:
        return True
    if caller.roles & ROLES_ALLOWED[operation]:
        return True
    return operation in GRANT_ALLOWS and any(
        grant_covers(g, stream, subscription) for g in caller.grants
    )


def check(
    caller: Caller, operation: Operation, stream: str = "", subscription: str | None = None
) -> None:
    """UnauthorizedError unless caller may do operation (on stream / subscription)."""
    if may(caller, operation, stream, subscription):
        return
    where = f" {stream!r}" if stream else ""
    if subscription is not None and operation in (Operation.CONSUME, Operation.MANAGE_SUBSCRIPTION):
        where += f" subscription {subscription!r}"
    allowed = sorted(ROLES_ALLOWED[operation])
    grant = (
        f", or a grant of the subscription (`streamlib admin principals grant "
        f"{caller.principal} consume {stream}/{subscription or 'SUB'}`)"
        if operation in GRANT_ALLOWS
        else ""
    )
    raise UnauthorizedError(
        f"principal {caller.principal!r} may not {operation.value}{where}: it needs one of "
        f"the roles {allowed}{grant}; it has {sorted(caller.roles) or 'no role'}"
    )


def may_create(caller: Caller, allow_auto_create: bool) -> bool:
    """Whether an operation naming a stream that does not exist creates it."""
    return allow_auto_create and may(caller, Operation.CREATE)
