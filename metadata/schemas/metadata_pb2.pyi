from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LedgerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEDGER_STATE_UNSPECIFIED: _ClassVar[LedgerState]
    OPEN: _ClassVar[LedgerState]
    IN_RECOVERY: _ClassVar[LedgerState]
    CLOSED: _ClassVar[LedgerState]

class DigestType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIGEST_TYPE_UNSPECIFIED: _ClassVar[DigestType]
    CRC32C: _ClassVar[DigestType]
    HMAC_SHA256: _ClassVar[DigestType]

class StreamMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_MODE_UNSPECIFIED: _ClassVar[StreamMode]
    MANAGED: _ClassVar[StreamMode]
    UNBOUNDED: _ClassVar[StreamMode]
LEDGER_STATE_UNSPECIFIED: LedgerState
OPEN: LedgerState
IN_RECOVERY: LedgerState
CLOSED: LedgerState
DIGEST_TYPE_UNSPECIFIED: DigestType
CRC32C: DigestType
HMAC_SHA256: DigestType
STREAM_MODE_UNSPECIFIED: StreamMode
MANAGED: StreamMode
UNBOUNDED: StreamMode

class Fragment(_message.Message):
    __slots__ = ("first_entry_id", "bookies", "created_time_ms", "start_length", "term")
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BOOKIES_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    START_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    first_entry_id: int
    bookies: _containers.RepeatedScalarFieldContainer[str]
    created_time_ms: int
    start_length: int
    term: int
    def __init__(self, first_entry_id: _Optional[int] = ..., bookies: _Optional[_Iterable[str]] = ..., created_time_ms: _Optional[int] = ..., start_length: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class LedgerMetadata(_message.Message):
    __slots__ = ("format_version", "ledger_id", "ensemble_size", "write_quorum", "ack_quorum", "state", "last_entry_id", "length", "fragments", "digest_type", "password_hash", "term", "unbounded", "first_entry_id", "custom_metadata", "creation_time_ms", "key_version")
    class CustomMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_TYPE_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_HASH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    UNBOUNDED_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATION_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_VERSION_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerState
    last_entry_id: int
    length: int
    fragments: _containers.RepeatedCompositeFieldContainer[Fragment]
    digest_type: DigestType
    password_hash: bytes
    term: int
    unbounded: bool
    first_entry_id: int
    custom_metadata: _containers.ScalarMap[str, bytes]
    creation_time_ms: int
    key_version: int
    def __init__(self, format_version: _Optional[int] = ..., ledger_id: _Optional[int] = ..., ensemble_size: _Optional[int] = ..., write_quorum: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., state: _Optional[_Union[LedgerState, str]] = ..., last_entry_id: _Optional[int] = ..., length: _Optional[int] = ..., fragments: _Optional[_Iterable[_Union[Fragment, _Mapping]]] = ..., digest_type: _Optional[_Union[DigestType, str]] = ..., password_hash: _Optional[bytes] = ..., term: _Optional[int] = ..., unbounded: _Optional[bool] = ..., first_entry_id: _Optional[int] = ..., custom_metadata: _Optional[_Mapping[str, bytes]] = ..., creation_time_ms: _Optional[int] = ..., key_version: _Optional[int] = ...) -> None: ...

class LedgerInfo(_message.Message):
    __slots__ = ("ledger_id", "entries", "size_bytes", "created_time_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entries: int
    size_bytes: int
    created_time_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., entries: _Optional[int] = ..., size_bytes: _Optional[int] = ..., created_time_ms: _Optional[int] = ...) -> None: ...

class LedgerConfig(_message.Message):
    __slots__ = ("ensemble_size", "write_quorum", "ack_quorum", "digest_type")
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    DIGEST_TYPE_FIELD_NUMBER: _ClassVar[int]
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest_type: DigestType
    def __init__(self, ensemble_size: _Optional[int] = ..., write_quorum: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., digest_type: _Optional[_Union[DigestType, str]] = ...) -> None: ...

class RolloverPolicy(_message.Message):
    __slots__ = ("max_entries", "max_bytes", "max_age_ms")
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    max_entries: int
    max_bytes: int
    max_age_ms: int
    def __init__(self, max_entries: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_age_ms: _Optional[int] = ...) -> None: ...

class RetentionPolicy(_message.Message):
    __slots__ = ("time_ms", "size_bytes", "compacted")
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    time_ms: int
    size_bytes: int
    compacted: bool
    def __init__(self, time_ms: _Optional[int] = ..., size_bytes: _Optional[int] = ..., compacted: _Optional[bool] = ...) -> None: ...

class Compaction(_message.Message):
    __slots__ = ("ledger_id", "horizon", "entries", "keys", "size_bytes", "compacted_time_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    horizon: Position
    entries: int
    keys: int
    size_bytes: int
    compacted_time_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., horizon: _Optional[_Union[Position, _Mapping]] = ..., entries: _Optional[int] = ..., keys: _Optional[int] = ..., size_bytes: _Optional[int] = ..., compacted_time_ms: _Optional[int] = ...) -> None: ...

class StreamMetadata(_message.Message):
    __slots__ = ("format_version", "name", "mode", "ledgers", "properties", "ledger_config", "rollover", "retention", "created_time_ms", "compaction", "compaction_threshold_bytes")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    LEDGER_CONFIG_FIELD_NUMBER: _ClassVar[int]
    ROLLOVER_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_THRESHOLD_BYTES_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    name: str
    mode: StreamMode
    ledgers: _containers.RepeatedCompositeFieldContainer[LedgerInfo]
    properties: _containers.ScalarMap[str, str]
    ledger_config: LedgerConfig
    rollover: RolloverPolicy
    retention: RetentionPolicy
    created_time_ms: int
    compaction: Compaction
    compaction_threshold_bytes: int
    def __init__(self, format_version: _Optional[int] = ..., name: _Optional[str] = ..., mode: _Optional[_Union[StreamMode, str]] = ..., ledgers: _Optional[_Iterable[_Union[LedgerInfo, _Mapping]]] = ..., properties: _Optional[_Mapping[str, str]] = ..., ledger_config: _Optional[_Union[LedgerConfig, _Mapping]] = ..., rollover: _Optional[_Union[RolloverPolicy, _Mapping]] = ..., retention: _Optional[_Union[RetentionPolicy, _Mapping]] = ..., created_time_ms: _Optional[int] = ..., compaction: _Optional[_Union[Compaction, _Mapping]] = ..., compaction_threshold_bytes: _Optional[int] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "batch_index")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    batch_index: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., batch_index: _Optional[int] = ...) -> None: ...

class PositionRange(_message.Message):
    __slots__ = ("lower", "upper")
    LOWER_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    lower: Position
    upper: Position
    def __init__(self, lower: _Optional[_Union[Position, _Mapping]] = ..., upper: _Optional[_Union[Position, _Mapping]] = ...) -> None: ...

class CursorState(_message.Message):
    __slots__ = ("format_version", "mark_delete", "individually_acked", "properties", "last_active_ms", "read_compacted")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_FIELD_NUMBER: _ClassVar[int]
    INDIVIDUALLY_ACKED_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_MS_FIELD_NUMBER: _ClassVar[int]
    READ_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    mark_delete: Position
    individually_acked: _containers.RepeatedCompositeFieldContainer[PositionRange]
    properties: _containers.ScalarMap[str, int]
    last_active_ms: int
    read_compacted: bool
    def __init__(self, format_version: _Optional[int] = ..., mark_delete: _Optional[_Union[Position, _Mapping]] = ..., individually_acked: _Optional[_Iterable[_Union[PositionRange, _Mapping]]] = ..., properties: _Optional[_Mapping[str, int]] = ..., last_active_ms: _Optional[int] = ..., read_compacted: _Optional[bool] = ...) -> None: ...

class BookieInfo(_message.Message):
    __slots__ = ("format_version", "bookie_id", "address", "rack", "read_only", "free_bytes", "total_bytes", "metrics_address", "registered_ms", "framed_address")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_MS_FIELD_NUMBER: _ClassVar[int]
    FRAMED_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    bookie_id: str
    address: str
    rack: str
    read_only: bool
    free_bytes: int
    total_bytes: int
    metrics_address: str
    registered_ms: int
    framed_address: str
    def __init__(self, format_version: _Optional[int] = ..., bookie_id: _Optional[str] = ..., address: _Optional[str] = ..., rack: _Optional[str] = ..., read_only: _Optional[bool] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., metrics_address: _Optional[str] = ..., registered_ms: _Optional[int] = ..., framed_address: _Optional[str] = ...) -> None: ...

class Cookie(_message.Message):
    __slots__ = ("format_version", "bookie_id", "instance_id", "journal_dir", "data_dirs", "created_ms", "cluster_instance_id")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_DIR_FIELD_NUMBER: _ClassVar[int]
    DATA_DIRS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    bookie_id: str
    instance_id: str
    journal_dir: str
    data_dirs: _containers.RepeatedScalarFieldContainer[str]
    created_ms: int
    cluster_instance_id: str
    def __init__(self, format_version: _Optional[int] = ..., bookie_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., journal_dir: _Optional[str] = ..., data_dirs: _Optional[_Iterable[str]] = ..., created_ms: _Optional[int] = ..., cluster_instance_id: _Optional[str] = ...) -> None: ...

class ClusterInstance(_message.Message):
    __slots__ = ("format_version", "instance_id", "created_ms")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    instance_id: str
    created_ms: int
    def __init__(self, format_version: _Optional[int] = ..., instance_id: _Optional[str] = ..., created_ms: _Optional[int] = ...) -> None: ...

class UnderReplicatedLedger(_message.Message):
    __slots__ = ("format_version", "ledger_id", "missing_bookies", "marked_ms")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MISSING_BOOKIES_FIELD_NUMBER: _ClassVar[int]
    MARKED_MS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    ledger_id: int
    missing_bookies: _containers.RepeatedScalarFieldContainer[str]
    marked_ms: int
    def __init__(self, format_version: _Optional[int] = ..., ledger_id: _Optional[int] = ..., missing_bookies: _Optional[_Iterable[str]] = ..., marked_ms: _Optional[int] = ...) -> None: ...
