from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[StatusCode]
    OK: _ClassVar[StatusCode]
    NO_SUCH_LEDGER: _ClassVar[StatusCode]
    NO_SUCH_ENTRY: _ClassVar[StatusCode]
    FENCED: _ClassVar[StatusCode]
    INVALID_TERM: _ClassVar[StatusCode]
    UNAUTHORIZED: _ClassVar[StatusCode]
    READ_ONLY: _ClassVar[StatusCode]
    TOO_LARGE: _ClassVar[StatusCode]
    BAD_REQUEST: _ClassVar[StatusCode]
    IO_ERROR: _ClassVar[StatusCode]
    TOO_MANY_REQUESTS: _ClassVar[StatusCode]
    UNAUTHENTICATED: _ClassVar[StatusCode]

class AddFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADD_FLAG_NONE: _ClassVar[AddFlag]
    RECOVERY_ADD: _ClassVar[AddFlag]
    TRUNCATE: _ClassVar[AddFlag]
    NOOP: _ClassVar[AddFlag]

class ReadFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_FLAG_NONE: _ClassVar[ReadFlag]
    FENCE: _ClassVar[ReadFlag]
STATUS_UNSPECIFIED: StatusCode
OK: StatusCode
NO_SUCH_LEDGER: StatusCode
NO_SUCH_ENTRY: StatusCode
FENCED: StatusCode
INVALID_TERM: StatusCode
UNAUTHORIZED: StatusCode
READ_ONLY: StatusCode
TOO_LARGE: StatusCode
BAD_REQUEST: StatusCode
IO_ERROR: StatusCode
TOO_MANY_REQUESTS: StatusCode
UNAUTHENTICATED: StatusCode
ADD_FLAG_NONE: AddFlag
RECOVERY_ADD: AddFlag
TRUNCATE: AddFlag
NOOP: AddFlag
READ_FLAG_NONE: ReadFlag
FENCE: ReadFlag

class AddEntry(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "last_add_confirmed", "payload", "digest", "master_key", "flags", "term", "length")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    payload: bytes
    digest: bytes
    master_key: bytes
    flags: int
    term: int
    length: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., last_add_confirmed: _Optional[int] = ..., payload: _Optional[bytes] = ..., digest: _Optional[bytes] = ..., master_key: _Optional[bytes] = ..., flags: _Optional[int] = ..., term: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("entries", "lacs")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LACS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AddEntry]
    lacs: _containers.RepeatedCompositeFieldContainer[WriteLacRequest]
    def __init__(self, entries: _Optional[_Iterable[_Union[AddEntry, _Mapping]]] = ..., lacs: _Optional[_Iterable[_Union[WriteLacRequest, _Mapping]]] = ...) -> None: ...

class AddRequestFramed(_message.Message):
    __slots__ = ("entries", "lacs")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LACS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedScalarFieldContainer[bytes]
    lacs: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, entries: _Optional[_Iterable[bytes]] = ..., lacs: _Optional[_Iterable[bytes]] = ...) -> None: ...

class AddResult(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "status", "term", "message")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    status: StatusCode
    term: int
    message: str
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., status: _Optional[_Union[StatusCode, str]] = ..., term: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class AddOk(_message.Message):
    __slots__ = ("ledger_id", "entry_ids")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ledger_id: _Optional[int] = ..., entry_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("results", "ok")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AddResult]
    ok: _containers.RepeatedCompositeFieldContainer[AddOk]
    def __init__(self, results: _Optional[_Iterable[_Union[AddResult, _Mapping]]] = ..., ok: _Optional[_Iterable[_Union[AddOk, _Mapping]]] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "last_add_confirmed", "payload", "digest", "flags", "length", "term")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    payload: bytes
    digest: bytes
    flags: int
    length: int
    term: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., last_add_confirmed: _Optional[int] = ..., payload: _Optional[bytes] = ..., digest: _Optional[bytes] = ..., flags: _Optional[int] = ..., length: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "last_entry_id", "flags", "master_key", "term", "max_bytes")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    flags: int
    master_key: bytes
    term: int
    max_bytes: int
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ..., term: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class EntryResult(_message.Message):
    __slots__ = ("entry_id", "status", "entry", "message")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    status: StatusCode
    entry: Entry
    message: str
    def __init__(self, entry_id: _Optional[int] = ..., status: _Optional[_Union[StatusCode, str]] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("status", "results", "last_add_confirmed", "term", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    results: _containers.RepeatedCompositeFieldContainer[EntryResult]
    last_add_confirmed: int
    term: int
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., results: _Optional[_Iterable[_Union[EntryResult, _Mapping]]] = ..., last_add_confirmed: _Optional[int] = ..., term: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id", "flags", "master_key", "term", "previous_lac", "timeout_ms", "piggyback_entry", "piggyback_max_entries")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PIGGYBACK_ENTRY_FIELD_NUMBER: _ClassVar[int]
    PIGGYBACK_MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    flags: int
    master_key: bytes
    term: int
    previous_lac: int
    timeout_ms: int
    piggyback_entry: bool
    piggyback_max_entries: int
    def __init__(self, ledger_id: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ..., term: _Optional[int] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., piggyback_entry: _Optional[bool] = ..., piggyback_max_entries: _Optional[int] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "last_add_confirmed", "next_entry", "fenced", "term", "message", "more_entries")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    NEXT_ENTRY_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MORE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    last_add_confirmed: int
    next_entry: Entry
    fenced: bool
    term: int
    message: str
    more_entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., last_add_confirmed: _Optional[int] = ..., next_entry: _Optional[_Union[Entry, _Mapping]] = ..., fenced: _Optional[bool] = ..., term: _Optional[int] = ..., message: _Optional[str] = ..., more_entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class WriteLacRequest(_message.Message):
    __slots__ = ("ledger_id", "master_key", "last_add_confirmed", "term")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    master_key: bytes
    last_add_confirmed: int
    term: int
    def __init__(self, ledger_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., last_add_confirmed: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class ForceRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class ForceResponse(_message.Message):
    __slots__ = ("status", "last_add_confirmed", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    last_add_confirmed: int
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., last_add_confirmed: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class GetBookieInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetBookieInfoResponse(_message.Message):
    __slots__ = ("status", "bookie_id", "free_bytes", "total_bytes", "read_only", "message", "authenticated", "principal", "roles")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    bookie_id: str
    free_bytes: int
    total_bytes: int
    read_only: bool
    message: str
    authenticated: bool
    principal: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., bookie_id: _Optional[str] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., read_only: _Optional[bool] = ..., message: _Optional[str] = ..., authenticated: _Optional[bool] = ..., principal: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ...) -> None: ...

class FramedHello(_message.Message):
    __slots__ = ("version", "token")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    version: int
    token: str
    def __init__(self, version: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class FramedHelloResponse(_message.Message):
    __slots__ = ("status", "message", "version")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    message: str
    version: int
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., message: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...
