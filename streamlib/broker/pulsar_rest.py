"""Pulsar's admin REST conventions, for the broker's admin port (pulsar_admin.py): a
route's path parameters, a topic's name in a path (its stream: streamlib/pulsar/topics.py;
412 when invalid, as Pulsar answers), JSON bodies, a message id body (MessageIdImpl or
ResetCursorData) as the position it names, and an error of the streams' administration
as Pulsar's status code."""

from __future__ import annotations

import json
import logging
from typing import Any

from metadata.errors import BadVersionError, InvalidNameError, NodeExistsError, StreamExistsError
from metadata.errors import NoSuchStreamError as StoreNoSuchStream
from streamlib.broker.http_server import HttpError, Request
from streamlib.protocol.errors import (
    BadRequestError,
    ConsumerBusyError,
    NoSuchStreamError,
    NoSuchSubscriptionError,
    UnauthorizedError,
)
from streamlib.pulsar.topics import stream_of
from streamlib.stream.positions import EARLIEST, LATEST, MessageId

log = logging.getLogger(__name__)

_LONG_MAX = 2**63 - 1  # Pulsar's MessageId.latest has both ids at Long.MAX_VALUE


def match(pattern: tuple[str, ...], segments: list[str]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    params = {}
    for want, got in zip(pattern, segments, strict=True):
        if want.startswith("{"):
            if not got:
                return None
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


def topic_stream(tenant: str, namespace: str, topic: str) -> str:
    try:
        return stream_of(f"persistent://{tenant}/{namespace}/{topic}")
    except InvalidNameError as error:
        raise HttpError(412, f"Topic name is not valid: {error}") from None


def check_namespace(tenant: str, namespace: str) -> None:
    try:
        stream_of(f"persistent://{tenant}/{namespace}/t")
    except InvalidNameError:
        raise HttpError(412, f"Namespace name is not valid: {tenant}/{namespace}") from None


def json_body(request: Request, default: Any) -> Any:
    if not request.body.strip():
        return default
    try:
        return json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise HttpError(400, "the request body is not JSON") from None


def message_id(body: Any, default: MessageId) -> MessageId:
    """The position a message id body names (Pulsar's MessageIdImpl or ResetCursorData:
    ledgerId, entryId, batchIndex, isExcluded): the message that comes next. -1:-1 is
    the earliest, Long.MAX_VALUE the latest."""
    if body is None:
        return default
    if not isinstance(body, dict) or not all(is_int(body.get(k)) for k in ("ledgerId", "entryId")):
        raise HttpError(400, 'a message id is {"ledgerId": L, "entryId": E}')
    ledger_id, entry_id = int(body["ledgerId"]), int(body["entryId"])
    if (ledger_id, entry_id) == (-1, -1):
        return EARLIEST
    if ledger_id == _LONG_MAX or entry_id == _LONG_MAX:
        return LATEST
    batch_index = body.get("batchIndex", -1)
    if not is_int(batch_index) or not 0 <= ledger_id < _LONG_MAX or entry_id < 0:
        raise HttpError(400, f"not a message id: {ledger_id}:{entry_id}:{batch_index}")
    if body.get("isExcluded") is True:  # (from the one after it)
        if batch_index >= 0:
            return MessageId(ledger_id, entry_id, batch_index + 1)
        return MessageId(ledger_id, entry_id + 1, 0)
    return MessageId(ledger_id, entry_id, max(batch_index, 0))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_http(error: Exception) -> HttpError:
    """An error of the streams' administration as Pulsar's status code."""
    reason = f"{type(error).__name__}: {error}"
    if isinstance(error, InvalidNameError):
        return HttpError(412, reason)
    if isinstance(error, NoSuchStreamError | StoreNoSuchStream | NoSuchSubscriptionError):
        return HttpError(404, reason)
    if isinstance(error, StreamExistsError | NodeExistsError):
        return HttpError(409, reason)
    if isinstance(error, BadVersionError):
        return HttpError(409, f"Concurrent modification: {error}")
    if isinstance(error, ConsumerBusyError):
        return HttpError(412, reason)
    if isinstance(error, UnauthorizedError):
        return HttpError(403, reason)
    if isinstance(error, BadRequestError):
        return HttpError(400, reason)
    log.warning("pulsar admin: %s", reason)
    return HttpError(500, reason)
