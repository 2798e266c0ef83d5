"""The streams' administration through a broker (the Admin call): for clients that
reach the cluster only through its brokers (`streamlib admin streams ... --metadata
streamlib://...`). Each call is StreamManager's of that name, run with the broker's
client for the caller -- after the caller's own authorization (the table below), never
with the broker's role for what the caller may not do.
"""

from __future__ import annotations

from typing import Any

from streamlib.protocol.errors import BadRequestError
from streamlib.protocol.service_access import Caller, Operation, check

#: call -> (what it needs, whether its first argument names a subscription too).
CALLS: dict[str, tuple[Operation, bool]] = {
    "list": (Operation.LOOKUP, False),
    "partitions": (Operation.LOOKUP, False),
    # (every subscription's position, the stream's metadata: not for a grant of one)
    "stats": (Operation.READ, False),
    "cursors": (Operation.READ, False),
    "defaults": (Operation.READ, False),
    "read": (Operation.READ, False),
    "create": (Operation.ADMINISTER, False),
    "delete": (Operation.ADMINISTER, False),
    "set_defaults": (Operation.ADMINISTER, False),
    "trim": (Operation.ADMINISTER, False),
    "trim_fragments": (Operation.ADMINISTER, False),
    "compact": (Operation.ADMINISTER, False),
    "set_policies": (Operation.ADMINISTER, False),
    "skip": (Operation.MANAGE_SUBSCRIPTION, True),
    "reset_cursor": (Operation.MANAGE_SUBSCRIPTION, True),
    "unsubscribe": (Operation.MANAGE_SUBSCRIPTION, True),
}
# Arguments only a caller in the same process can give (a callback is no JSON value).
LOCAL_ONLY = frozenset({"on_step"})
# Calls that name no stream.
NO_STREAM = frozenset({"list", "defaults", "set_defaults"})


async def run(streams: Any, caller: Caller, call: str, arguments: Any) -> Any:
    """StreamManager.call(**arguments) for the caller: BadRequestError for a call or
    arguments that are not offered, UnauthorizedError for one it may not make."""
    if call not in CALLS:
        raise BadRequestError(f"admin call {call!r} is not one of {', '.join(sorted(CALLS))}")
    if not isinstance(arguments, dict):
        raise BadRequestError("an admin call's arguments are a JSON object")
    if LOCAL_ONLY & arguments.keys():
        raise BadRequestError(
            f"admin call {call!r} takes no {', '.join(LOCAL_ONLY & arguments.keys())}"
        )
    operation, names_subscription = CALLS[call]
    stream = "" if call in NO_STREAM else arguments.get("name")
    if call not in NO_STREAM and not isinstance(stream, str):
        raise BadRequestError(f"admin call {call!r} needs the stream's name (name)")
    subscription = arguments.get("subscription") if names_subscription else None
    if names_subscription and not isinstance(subscription, str):
        raise BadRequestError(f"admin call {call!r} needs a subscription")
    check(caller, operation, stream or "", subscription)
    try:
        return await getattr(streams, call)(**arguments)
    except TypeError as error:  # (arguments the call does not take)
        raise BadRequestError(f"admin call {call!r}: {error}") from None
