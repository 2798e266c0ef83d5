from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Message(_message.Message):
    __slots__ = ("key", "properties", "publish_time_ms", "event_time_ms", "payload", "ordering_key")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    properties: _containers.ScalarMap[str, str]
    publish_time_ms: int
    event_time_ms: int
    payload: bytes
    ordering_key: bytes
    def __init__(self, key: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., publish_time_ms: _Optional[int] = ..., event_time_ms: _Optional[int] = ..., payload: _Optional[bytes] = ..., ordering_key: _Optional[bytes] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("key", "properties", "ordering_key")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    properties: _containers.ScalarMap[str, str]
    ordering_key: bytes
    def __init__(self, key: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., ordering_key: _Optional[bytes] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("format_version", "messages", "payload_sizes", "payloads", "publish_time_ms", "event_time_ms", "metadata", "deliver_at_ms", "compression", "uncompressed_size", "compressed", "chunk", "first_sequence_id", "sequence_ids", "producers", "producer_index")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZES_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_INDEX_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    payload_sizes: _containers.RepeatedScalarFieldContainer[int]
    payloads: bytes
    publish_time_ms: _containers.RepeatedScalarFieldContainer[int]
    event_time_ms: _containers.RepeatedScalarFieldContainer[int]
    metadata: _containers.RepeatedCompositeFieldContainer[Metadata]
    deliver_at_ms: _containers.RepeatedScalarFieldContainer[int]
    compression: int
    uncompressed_size: int
    compressed: bytes
    chunk: Chunk
    first_sequence_id: int
    sequence_ids: _containers.RepeatedScalarFieldContainer[int]
    producers: _containers.RepeatedScalarFieldContainer[str]
    producer_index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, format_version: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., payload_sizes: _Optional[_Iterable[int]] = ..., payloads: _Optional[bytes] = ..., publish_time_ms: _Optional[_Iterable[int]] = ..., event_time_ms: _Optional[_Iterable[int]] = ..., metadata: _Optional[_Iterable[_Union[Metadata, _Mapping]]] = ..., deliver_at_ms: _Optional[_Iterable[int]] = ..., compression: _Optional[int] = ..., uncompressed_size: _Optional[int] = ..., compressed: _Optional[bytes] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., first_sequence_id: _Optional[int] = ..., sequence_ids: _Optional[_Iterable[int]] = ..., producers: _Optional[_Iterable[str]] = ..., producer_index: _Optional[_Iterable[int]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("uuid", "index", "count", "total_size", "compression", "uncompressed_size")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_SIZE_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    count: int
    total_size: int
    compression: int
    uncompressed_size: int
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., count: _Optional[int] = ..., total_size: _Optional[int] = ..., compression: _Optional[int] = ..., uncompressed_size: _Optional[int] = ...) -> None: ...

class CompactedEntry(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "first_index", "batch")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    first_index: int
    batch: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., first_index: _Optional[int] = ..., batch: _Optional[bytes] = ...) -> None: ...
