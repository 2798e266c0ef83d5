"""The protobuf records the metadata layer stores, and their checked codec.

`encode` stamps the current FORMAT_VERSION; `decode` refuses garbage bytes, a missing
format version (what protobuf yields for most garbage and for an empty value) and a
version newer than this code understands, each with SchemaError. A reader never gets
a silently defaulted record.

Must never import: streamlib or bookie.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from metadata.errors import SchemaError
from metadata.schemas.metadata_pb2 import (
    BookieInfo,
    ClusterInstance,
    Compaction,
    Cookie,
    CursorState,
    DigestType,
    Fragment,
    LedgerConfig,
    LedgerInfo,
    LedgerMetadata,
    LedgerState,
    Position,
    PositionRange,
    RetentionPolicy,
    RolloverPolicy,
    StreamMetadata,
    StreamMode,
    UnderReplicatedLedger,
)

FORMAT_VERSION = 1

M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    """Serialize (deterministically, so equal records give equal bytes)."""
    version = getattr(message, "format_version", None)
    if version is None:
        raise SchemaError(f"{type(message).__name__} is not a stored record (no format_version)")
    if version == 0:
        message.format_version = FORMAT_VERSION  # type: ignore[attr-defined]
    elif version > FORMAT_VERSION:
        raise SchemaError(
            f"cannot write format_version {version}; this code writes {FORMAT_VERSION}"
        )
    return message.SerializeToString(deterministic=True)


def decode(cls: type[M], data: bytes) -> M:
    name = cls.__name__
    message = cls()
    try:
        message.ParseFromString(data)
    except (DecodeError, ValueError, TypeError) as exc:
        raise SchemaError(f"stored bytes are not a {name}: {exc}") from exc
    version = getattr(message, "format_version", 0)
    if version == 0:
        raise SchemaError(f"stored bytes are not a {name}: no format_version (garbage or empty)")
    if version > FORMAT_VERSION:
        raise SchemaError(
            f"{name} has format_version {version}, newer than {FORMAT_VERSION}: upgrade this client"
        )
    return message


__all__ = [
    "FORMAT_VERSION",
    "BookieInfo",
    "ClusterInstance",
    "Compaction",
    "Cookie",
    "CursorState",
    "DigestType",
    "Fragment",
    "LedgerConfig",
    "LedgerInfo",
    "LedgerMetadata",
    "LedgerState",
    "Position",
    "PositionRange",
    "RetentionPolicy",
    "RolloverPolicy",
    "StreamMetadata",
    "StreamMode",
    "UnderReplicatedLedger",
    "decode",
    "encode",
]
