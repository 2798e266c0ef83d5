from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionRequest(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[SessionPart]
    def __init__(self, parts: _Optional[_Iterable[_Union[SessionPart, _Mapping]]] = ...) -> None: ...

class SessionPart(_message.Message):
    __slots__ = ("handle", "produce", "consume", "end", "cancel")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    handle: int
    produce: ProduceRequest
    consume: ConsumeRequest
    end: bool
    cancel: bool
    def __init__(self, handle: _Optional[int] = ..., produce: _Optional[_Union[ProduceRequest, _Mapping]] = ..., consume: _Optional[_Union[ConsumeRequest, _Mapping]] = ..., end: _Optional[bool] = ..., cancel: _Optional[bool] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[SessionAnswer]
    def __init__(self, parts: _Optional[_Iterable[_Union[SessionAnswer, _Mapping]]] = ...) -> None: ...

class SessionAnswer(_message.Message):
    __slots__ = ("handle", "produce", "consume", "end")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    handle: int
    produce: ProduceResponse
    consume: ConsumeResponse
    end: bool
    def __init__(self, handle: _Optional[int] = ..., produce: _Optional[_Union[ProduceResponse, _Mapping]] = ..., consume: _Optional[_Union[ConsumeResponse, _Mapping]] = ..., end: _Optional[bool] = ...) -> None: ...

class LastMessageIdRequest(_message.Message):
    __slots__ = ("stream", "before_time_ms", "read_compacted")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    BEFORE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    READ_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    stream: str
    before_time_ms: int
    read_compacted: bool
    def __init__(self, stream: _Optional[str] = ..., before_time_ms: _Optional[int] = ..., read_compacted: _Optional[bool] = ...) -> None: ...

class LastMessageIdResponse(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: MessageIdPb
    def __init__(self, message_id: _Optional[_Union[MessageIdPb, _Mapping]] = ...) -> None: ...

class AdminRequest(_message.Message):
    __slots__ = ("call", "arguments_json")
    CALL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    call: str
    arguments_json: str
    def __init__(self, call: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class AdminResponse(_message.Message):
    __slots__ = ("result_json",)
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    result_json: str
    def __init__(self, result_json: _Optional[str] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("stream", "create")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    create: bool
    def __init__(self, stream: _Optional[str] = ..., create: _Optional[bool] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("broker_id", "address", "partitions")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    address: str
    partitions: int
    def __init__(self, broker_id: _Optional[str] = ..., address: _Optional[str] = ..., partitions: _Optional[int] = ...) -> None: ...

class UnloadRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    def __init__(self, stream: _Optional[str] = ...) -> None: ...

class UnloadResponse(_message.Message):
    __slots__ = ("unloaded",)
    UNLOADED_FIELD_NUMBER: _ClassVar[int]
    unloaded: bool
    def __init__(self, unloaded: _Optional[bool] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class MessageIdPb(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "batch_index")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    batch_index: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., batch_index: _Optional[int] = ...) -> None: ...

class ProducerOpen(_message.Message):
    __slots__ = ("stream", "producer_name", "access_mode", "schema_type", "schema_definition", "schema_checked_type", "schema_checked_definition", "resume")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    ACCESS_MODE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_CHECKED_TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_CHECKED_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    stream: str
    producer_name: str
    access_mode: str
    schema_type: str
    schema_definition: str
    schema_checked_type: str
    schema_checked_definition: str
    resume: bool
    def __init__(self, stream: _Optional[str] = ..., producer_name: _Optional[str] = ..., access_mode: _Optional[str] = ..., schema_type: _Optional[str] = ..., schema_definition: _Optional[str] = ..., schema_checked_type: _Optional[str] = ..., schema_checked_definition: _Optional[str] = ..., resume: _Optional[bool] = ...) -> None: ...

class EntrySend(_message.Message):
    __slots__ = ("entry", "first_sequence_id", "last_sequence_id", "messages")
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    entry: bytes
    first_sequence_id: int
    last_sequence_id: int
    messages: int
    def __init__(self, entry: _Optional[bytes] = ..., first_sequence_id: _Optional[int] = ..., last_sequence_id: _Optional[int] = ..., messages: _Optional[int] = ...) -> None: ...

class EntryBatch(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[EntrySend]
    def __init__(self, entries: _Optional[_Iterable[_Union[EntrySend, _Mapping]]] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("open", "entries")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    open: ProducerOpen
    entries: EntryBatch
    def __init__(self, open: _Optional[_Union[ProducerOpen, _Mapping]] = ..., entries: _Optional[_Union[EntryBatch, _Mapping]] = ...) -> None: ...

class ProducerReady(_message.Message):
    __slots__ = ("producer_name", "last_sequence_id", "recent")
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    producer_name: str
    last_sequence_id: int
    recent: _containers.RepeatedCompositeFieldContainer[Receipt]
    def __init__(self, producer_name: _Optional[str] = ..., last_sequence_id: _Optional[int] = ..., recent: _Optional[_Iterable[_Union[Receipt, _Mapping]]] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("sequence_id", "message_id", "duplicate")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    sequence_id: int
    message_id: MessageIdPb
    duplicate: bool
    def __init__(self, sequence_id: _Optional[int] = ..., message_id: _Optional[_Union[MessageIdPb, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class ReceiptBatch(_message.Message):
    __slots__ = ("receipts",)
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    receipts: _containers.RepeatedCompositeFieldContainer[Receipt]
    def __init__(self, receipts: _Optional[_Iterable[_Union[Receipt, _Mapping]]] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("ready", "receipts", "error", "failed", "heartbeat")
    READY_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ready: ProducerReady
    receipts: ReceiptBatch
    error: Error
    failed: SendFailed
    heartbeat: Heartbeat
    def __init__(self, ready: _Optional[_Union[ProducerReady, _Mapping]] = ..., receipts: _Optional[_Union[ReceiptBatch, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., failed: _Optional[_Union[SendFailed, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SendFailed(_message.Message):
    __slots__ = ("sequence_ids", "error")
    SEQUENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    sequence_ids: _containers.RepeatedScalarFieldContainer[int]
    error: Error
    def __init__(self, sequence_ids: _Optional[_Iterable[int]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class ConsumerOpen(_message.Message):
    __slots__ = ("stream", "subscription", "consumer_type", "consumer_name", "initial_position", "negative_ack_redelivery_delay_ms", "ack_timeout_ms", "start", "start_latest", "start_inclusive", "resume", "cursor_persist_interval_ms", "protocol_version", "read_compacted")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    INITIAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_ACK_REDELIVERY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    START_LATEST_FIELD_NUMBER: _ClassVar[int]
    START_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    CURSOR_PERSIST_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    READ_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    consumer_type: str
    consumer_name: str
    initial_position: str
    negative_ack_redelivery_delay_ms: int
    ack_timeout_ms: int
    start: MessageIdPb
    start_latest: bool
    start_inclusive: bool
    resume: bool
    cursor_persist_interval_ms: int
    protocol_version: int
    read_compacted: bool
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ..., consumer_type: _Optional[str] = ..., consumer_name: _Optional[str] = ..., initial_position: _Optional[str] = ..., negative_ack_redelivery_delay_ms: _Optional[int] = ..., ack_timeout_ms: _Optional[int] = ..., start: _Optional[_Union[MessageIdPb, _Mapping]] = ..., start_latest: _Optional[bool] = ..., start_inclusive: _Optional[bool] = ..., resume: _Optional[bool] = ..., cursor_persist_interval_ms: _Optional[int] = ..., protocol_version: _Optional[int] = ..., read_compacted: _Optional[bool] = ...) -> None: ...

class Flow(_message.Message):
    __slots__ = ("permits",)
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    permits: int
    def __init__(self, permits: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("ids", "cumulative", "negative", "entries")
    IDS_FIELD_NUMBER: _ClassVar[int]
    CUMULATIVE_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedCompositeFieldContainer[MessageIdPb]
    cumulative: bool
    negative: bool
    entries: _containers.RepeatedCompositeFieldContainer[EntryAck]
    def __init__(self, ids: _Optional[_Iterable[_Union[MessageIdPb, _Mapping]]] = ..., cumulative: _Optional[bool] = ..., negative: _Optional[bool] = ..., entries: _Optional[_Iterable[_Union[EntryAck, _Mapping]]] = ...) -> None: ...

class EntryAck(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "indexes")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    indexes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., indexes: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("open", "flow", "ack", "seek", "unsubscribe")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    SEEK_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    open: ConsumerOpen
    flow: Flow
    ack: AckRequest
    seek: SeekRequest
    unsubscribe: UnsubscribeRequest
    def __init__(self, open: _Optional[_Union[ConsumerOpen, _Mapping]] = ..., flow: _Optional[_Union[Flow, _Mapping]] = ..., ack: _Optional[_Union[AckRequest, _Mapping]] = ..., seek: _Optional[_Union[SeekRequest, _Mapping]] = ..., unsubscribe: _Optional[_Union[UnsubscribeRequest, _Mapping]] = ...) -> None: ...

class SeekRequest(_message.Message):
    __slots__ = ("message_id", "timestamp_ms")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    message_id: MessageIdPb
    timestamp_ms: int
    def __init__(self, message_id: _Optional[_Union[MessageIdPb, _Mapping]] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class UnsubscribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Done(_message.Message):
    __slots__ = ("what", "error")
    WHAT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    what: str
    error: Error
    def __init__(self, what: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class DeliveredEntry(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "entry", "indexes", "redelivery_count")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    entry: bytes
    indexes: _containers.RepeatedScalarFieldContainer[int]
    redelivery_count: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., entry: _Optional[bytes] = ..., indexes: _Optional[_Iterable[int]] = ..., redelivery_count: _Optional[int] = ...) -> None: ...

class EntryDeliveries(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DeliveredEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[DeliveredEntry, _Mapping]]] = ...) -> None: ...

class ConsumerReady(_message.Message):
    __slots__ = ("active",)
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    active: bool
    def __init__(self, active: _Optional[bool] = ...) -> None: ...

class ActiveChange(_message.Message):
    __slots__ = ("active",)
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    active: bool
    def __init__(self, active: _Optional[bool] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("ready", "active", "error", "heartbeat", "done", "entries")
    READY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ready: ConsumerReady
    active: ActiveChange
    error: Error
    heartbeat: Heartbeat
    done: Done
    entries: EntryDeliveries
    def __init__(self, ready: _Optional[_Union[ConsumerReady, _Mapping]] = ..., active: _Optional[_Union[ActiveChange, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ..., entries: _Optional[_Union[EntryDeliveries, _Mapping]] = ...) -> None: ...
