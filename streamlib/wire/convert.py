"""Conversions between the stream service's wire (broker.proto) and streamlib's values:
message ids, and errors (an error travels as the name of its class and its message)."""

from __future__ import annotations

import base64
import collections
import dataclasses
import json
from typing import Any

from metadata.schemas import StreamMetadata
from streamlib.protocol import errors as error_types
from streamlib.protocol.errors import BadRequestError, RemoteError, StreamlibError
from streamlib.stream.positions import MessageId
from streamlib.wire import broker_pb2 as pb


def id_pb(message_id: MessageId) -> pb.MessageIdPb:
    return pb.MessageIdPb(
        ledger_id=message_id.ledger_id,
        entry_id=message_id.entry_id,
        batch_index=message_id.batch_index,
    )


def id_from_pb(message_id: pb.MessageIdPb) -> MessageId:
    """The id, checked (BadRequestError for one no stream can hold)."""
    return MessageId(message_id.ledger_id, message_id.entry_id, message_id.batch_index).checked()


def error_pb(error: BaseException) -> pb.Error:
    """An error as the wire carries it: its class's name (a streamlib error's, or the
    bookie's authentication errors', which share the names of ours), and its message."""
    code = type(error).__name__
    if not isinstance(error, StreamlibError | ValueError) and code not in (
        "UnauthenticatedError",
        "UnauthorizedError",
    ):
        code = "StreamlibError"
    return pb.Error(code=code, message=str(error) or code)


def error_from_pb(error: pb.Error) -> StreamlibError:
    """The error a broker answered, as the class it names (an unknown name: a
    StreamlibError carrying it as remote_code)."""
    cls = getattr(error_types, error.code, None)
    if isinstance(cls, type) and issubclass(cls, StreamlibError) and cls is not StreamlibError:
        return cls(error.message)
    if error.code == "IncompatibleSchemaError":
        from streamlib.schema import IncompatibleSchemaError

        return IncompatibleSchemaError(error.message)
    if error.code in ("InvalidNameError", "ValueError", "MessageDecodeError"):
        return BadRequestError(error.message)
    # (an error the broker could not name, or of a class this side does not have: its
    # class says nothing about retrying; RemoteError's is what the client did before)
    return RemoteError(f"{error.code}: {error.message}", remote_code=error.code)


def to_json(value: Any) -> str:
    """An admin call's arguments or result as the wire carries them (JSON; a MessageId
    and a stream's metadata tagged, so they come back as themselves)."""
    return json.dumps(_tagged(value))


def _tagged(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _tagged(dataclasses.asdict(value))
    if isinstance(value, MessageId):
        return {"$message_id": list(value)}
    if isinstance(value, StreamMetadata):
        return {"$stream_metadata": base64.b64encode(value.SerializeToString()).decode()}
    if isinstance(value, dict):
        return {str(k): _tagged(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tagged(v) for v in value]
    return value


def from_json(text: str) -> Any:
    """The value to_json carried; BadRequestError for anything that is not JSON."""
    try:
        return json.loads(text or "null", object_hook=_untagged)
    except (ValueError, TypeError) as error:
        raise BadRequestError(f"not a JSON value: {error}") from None


def _untagged(value: dict[str, Any]) -> Any:
    if len(value) == 1 and "$message_id" in value:
        return MessageId(*value["$message_id"]).checked()
    if len(value) == 1 and "$stream_metadata" in value:
        return StreamMetadata.FromString(base64.b64decode(value["$stream_metadata"]))
    return value


def move_parts(outbox: collections.deque[tuple[int, str, Any, int]], parts: Any, limit: int) -> int:
    """Move queued parts of a Session call -- (handle, kind, message, size) -- into
    `parts` (a SessionRequest's or a SessionResponse's) up to about `limit` bytes, one at
    least; the bytes moved. A part with no message is a flag of its kind (end, cancel)."""
    moved = 0
    while outbox and (not moved or moved + outbox[0][3] <= limit):
        handle, kind, message, size = outbox.popleft()
        part = parts.add(handle=handle)
        if message is None:
            setattr(part, kind, True)
        else:
            getattr(part, kind).CopyFrom(message)
        moved += size
    return moved
