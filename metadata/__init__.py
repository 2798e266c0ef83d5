"""The coordination layer: versioned metadata with compare-and-swap, ephemeral
registrations tied to a session, watches, multi-op transactions, locks and elections,
over ZooKeeper (zk://), an embedded multi-process sqlite store (sqlite://, the
default) or memory (memory://, unit tests). Also the protobuf schemas of what is
stored (metadata.schemas) and the services built on the store (metadata.services).

Must never import: streamlib or bookie — the metadata layer depends on nothing of ours
(tests/unit/test_layering.py checks).
"""

from metadata.errors import (
    AuthFailedError,
    BadVersionError,
    ConnectionLossError,
    InvalidPathError,
    InvalidURIError,
    InvalidValueError,
    MetadataError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SchemaError,
    SessionExpiredError,
    StoreBusyError,
    StoreIOError,
    TransactionError,
    UnknownSchemeError,
    ValueTooLargeError,
)
from metadata.paths import MAX_VALUE_BYTES
from metadata.store import (
    CheckVersion,
    Create,
    Delete,
    Election,
    Lock,
    MetadataStore,
    Op,
    Set,
    Versioned,
    Watch,
    WatchEvent,
)
from metadata.uri import connect, parse_uri

__all__ = [
    "MAX_VALUE_BYTES",
    "AuthFailedError",
    "BadVersionError",
    "CheckVersion",
    "ConnectionLossError",
    "Create",
    "Delete",
    "Election",
    "InvalidPathError",
    "InvalidURIError",
    "InvalidValueError",
    "Lock",
    "MetadataError",
    "MetadataStore",
    "NoChildrenForEphemeralsError",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "Op",
    "SchemaError",
    "SessionExpiredError",
    "Set",
    "StoreBusyError",
    "StoreIOError",
    "TransactionError",
    "UnknownSchemeError",
    "ValueTooLargeError",
    "Versioned",
    "Watch",
    "WatchEvent",
    "connect",
    "parse_uri",
]
