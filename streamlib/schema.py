"""Schemas as pulsar-client users know them: a producer encodes objects, consumers and
readers decode them (``message.value()``), and the stream keeps the schema so every
producer agrees.

    from streamlib.schema import JsonSchema
    producer = client.create_producer("orders", schema=JsonSchema(Order))  # a dataclass
    producer.send(Order(id=1, item="book"))              # or a pydantic model
    consumer = client.subscribe("orders", "billing", schema=JsonSchema(Order))
    order = consumer.receive().value()                   # an Order again

Types: BytesSchema (the default: no schema), StringSchema (UTF-8), JsonSchema (a
dataclass or a pydantic model; pydantic validates and converts), AvroSchema (fastavro:
a dataclass or pydantic model whose fields map to Avro types, or an Avro schema dict),
ProtobufSchema (a generated message class).

The stream's schema lives in its metadata (properties ``schema.type`` and
``schema.definition``). The first producer with a schema sets it; a later producer must
be compatible (Pulsar's default, BACKWARD: a consumer with the new schema reads what the
old one wrote) or gets IncompatibleSchemaError: the same type; for JSON, new fields only
with defaults and no field changing its type; for Avro the same schema (messages carry no
schema version yet, and Avro needs the writer's schema to read); for Protobuf the same
message type. A producer without a schema (bytes) may always write.

Nothing is stored unchecked: validate_definition refuses (InvalidSchemaError, naming
why) a definition that is not what its type says, and a stream's stored definition that
fails it (stored before that check) makes a typed producer IncompatibleSchemaError.
"""

from __future__ import annotations

import abc
import dataclasses
import io
import json
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import fastavro
import pydantic
from google.protobuf.message import Message as ProtobufMessage
from pydantic_core import PydanticUndefined

from streamlib.protocol.errors import BadRequestError, InvalidSchemaError, StreamlibError

T = TypeVar("T")


class IncompatibleSchemaError(StreamlibError):
    """A producer's schema cannot be used on the stream: another type, or a change that
    consumers of the stream's schema could not read."""

    retriable = False


class SchemaDecodeError(StreamlibError):
    """A message's bytes do not decode with the consumer's schema."""


class Schema(abc.ABC, Generic[T]):
    """How objects become message bytes and back."""

    type_name: str = ""

    @abc.abstractmethod
    def encode(self, value: T) -> bytes: ...

    @abc.abstractmethod
    def decode(self, data: bytes) -> T: ...

    def definition(self) -> str:
        """What the stream keeps (compared on producer creation)."""
        return ""

    def check_compatible(self, stored_definition: str) -> None:
        """IncompatibleSchemaError unless data written with the stored definition reads
        with this schema (the stream has this schema's type)."""
        if stored_definition != self.definition():
            raise IncompatibleSchemaError(f"{self.type_name} schema changed")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BytesSchema(Schema[bytes]):
    type_name = "bytes"

    def encode(self, value: bytes) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise BadRequestError(f"a bytes schema sends bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return data


class StringSchema(Schema[str]):
    type_name = "string"

    def encode(self, value: str) -> bytes:
        if not isinstance(value, str):
            raise BadRequestError(f"a string schema sends str, got {type(value).__name__}")
        return value.encode()

    def decode(self, data: bytes) -> str:
        try:
            return data.decode()
        except UnicodeDecodeError as error:
            raise SchemaDecodeError(f"not UTF-8: {error}") from None


def _adapter(record: type[Any]) -> pydantic.TypeAdapter[Any]:
    if not (dataclasses.is_dataclass(record) or issubclass(record, pydantic.BaseModel)):
        raise BadRequestError(f"a record type is a dataclass or a pydantic model, not {record!r}")
    return pydantic.TypeAdapter(record)


class JsonSchema(Schema[T]):
    """JSON of a dataclass or pydantic model (its JSON Schema is what the stream keeps)."""

    type_name = "json"

    def __init__(self, record: type[T]) -> None:
        self.record = record
        self._adapter = _adapter(record)
        self._definition = json.dumps(self._adapter.json_schema(), sort_keys=True)

    def encode(self, value: T) -> bytes:
        try:
            return self._adapter.dump_json(self._adapter.validate_python(value))
        except pydantic.ValidationError as error:
            raise BadRequestError(f"not a valid {self.record.__name__}: {error}") from None

    def decode(self, data: bytes) -> T:
        try:
            return self._adapter.validate_json(data)  # type: ignore[no-any-return]
        except pydantic.ValidationError as error:
            raise SchemaDecodeError(f"not a {self.record.__name__}: {error}") from None

    def definition(self) -> str:
        return self._definition

    def check_compatible(self, stored_definition: str) -> None:
        """BACKWARD: every field this schema requires was in the stored one (new fields
        have defaults), and the fields both have keep their JSON types."""
        old = json.loads(stored_definition)
        new = json.loads(self._definition)
        old_props, new_props = old.get("properties", {}), new.get("properties", {})
        added = set(new.get("required", [])) - set(old_props)
        if added:
            raise IncompatibleSchemaError(
                f"JSON schema adds required fields {sorted(added)}: give them defaults"
            )
        for name in set(old_props) & set(new_props):
            if old_props[name].get("type") != new_props[name].get("type"):
                raise IncompatibleSchemaError(f"JSON schema changes the type of field {name!r}")


_AVRO_TYPES: dict[Any, str] = {
    bool: "boolean",
    int: "long",
    float: "double",
    str: "string",
    bytes: "bytes",
}


def _avro_of_record(record: type[Any]) -> dict[str, Any]:
    """An Avro record schema for a dataclass or pydantic model of plain fields."""
    if issubclass(record, pydantic.BaseModel):
        fields = [(n, f.annotation, f.default) for n, f in record.model_fields.items()]
    elif dataclasses.is_dataclass(record):
        hints = typing.get_type_hints(record)
        fields = [(f.name, hints[f.name], f.default) for f in dataclasses.fields(record)]
    else:
        raise BadRequestError(
            f"AvroSchema takes a dataclass, a pydantic model or a dict: {record!r}"
        )
    out = []
    for name, annotation, default in fields:
        optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and (
            type(None) in typing.get_args(annotation)
        )
        base = (
            [a for a in typing.get_args(annotation) if a is not type(None)]
            if optional
            else [annotation]
        )
        if len(base) != 1 or base[0] not in _AVRO_TYPES:
            raise BadRequestError(f"field {name!r}: {annotation!r} has no Avro type here")
        avro: Any = _AVRO_TYPES[base[0]]
        field: dict[str, Any] = {"name": name, "type": ["null", avro] if optional else avro}
        if default is not dataclasses.MISSING and default is not PydanticUndefined:
            field["default"] = default
        out.append(field)
    return {"type": "record", "name": record.__name__, "fields": out}


class AvroSchema(Schema[T]):
    """Avro (fastavro, schemaless binary) of a dataclass or pydantic model, or of dicts
    with an Avro schema given as a dict."""

    type_name = "avro"

    def __init__(self, record: type[T] | dict[str, Any]) -> None:
        if isinstance(record, dict):
            self.record: type[Any] | None = None
            raw = record
        else:
            self.record = record
            raw = _avro_of_record(record)
        self._parsed = _parsed_avro(raw)
        self._definition = json.dumps(raw, sort_keys=True)

    def encode(self, value: T) -> bytes:
        record: Any = value
        if isinstance(value, pydantic.BaseModel):
            record = value.model_dump()
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            record = dataclasses.asdict(value)
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, self._parsed, record)
        except (ValueError, TypeError, KeyError) as error:
            raise BadRequestError(f"does not fit the Avro schema: {error}") from None
        return out.getvalue()

    def decode(self, data: bytes) -> T:
        try:
            found = fastavro.schemaless_reader(io.BytesIO(data), self._parsed, self._parsed)
        except Exception as error:  # fastavro raises plain exceptions for bad bytes
            raise SchemaDecodeError(f"not Avro of this schema: {error}") from None
        if self.record is None:
            return found  # type: ignore[return-value]
        return self.record(**found)  # type: ignore[no-any-return, arg-type]

    def definition(self) -> str:
        return self._definition

    def check_compatible(self, stored_definition: str) -> None:
        """The same Avro schema only: Avro's binary needs the writer's schema to read,
        and messages do not carry a schema version yet, so no evolution."""
        if json.loads(stored_definition) != json.loads(self._definition):
            raise IncompatibleSchemaError(
                "the stream's Avro schema differs: Avro schemas cannot evolve on a stream "
                "yet (messages carry no schema version); use JSON, or a new stream"
            )


class ProtobufSchema(Schema[T]):
    """A generated protobuf message class (the stream keeps its full name)."""

    type_name = "protobuf"

    def __init__(self, message: type[T]) -> None:
        if not (isinstance(message, type) and issubclass(message, ProtobufMessage)):
            raise BadRequestError(
                f"ProtobufSchema takes a generated message class, not {message!r}"
            )
        self.message = message

    def encode(self, value: T) -> bytes:
        if not isinstance(value, self.message):
            raise BadRequestError(f"expected a {self.message.__name__}, got {type(value).__name__}")
        return value.SerializeToString()  # type: ignore[attr-defined, no-any-return]

    def decode(self, data: bytes) -> T:
        try:
            return self.message.FromString(data)  # type: ignore[attr-defined, no-any-return]
        except Exception as error:  # google.protobuf.message.DecodeError
            raise SchemaDecodeError(f"not a {self.message.__name__}: {error}") from None

    def definition(self) -> str:
        return self.message.DESCRIPTOR.full_name  # type: ignore[attr-defined, no-any-return]

    def check_compatible(self, stored_definition: str) -> None:
        if stored_definition != self.definition():
            raise IncompatibleSchemaError(
                f"the stream carries protobuf {stored_definition}, not {self.definition()}"
            )


# -- what a stream may keep ------------------------------------------------------------

# The definition lives in the stream's metadata record, which the metadata store caps at
# 1 MiB (metadata.MAX_VALUE_BYTES) together with the stream's ledger list: a quarter of
# it, so a schema never crowds the ledgers out. What the schema types produce is far
# smaller (JsonSchema's definition refers to nested models through $defs).
MAX_DEFINITION_BYTES = 256 * 1024
# Deep enough for any record a schema describes; shallow enough that nothing walking a
# definition recursively (fastavro, the compatibility checks) nears Python's stack limit.
MAX_DEFINITION_NESTING = 64
# A protobuf definition is the message's full name (ProtobufSchema.definition).
_PROTOBUF_FULL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _nesting(value: Any) -> int:
    """How deep arrays and objects nest in a parsed JSON value (1: a flat object),
    walked without recursion, stopping once past MAX_DEFINITION_NESTING."""
    deepest = 0
    stack = [(value, 1)]
    while stack and deepest <= MAX_DEFINITION_NESTING:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _json_object(definition: str, kind: str) -> dict[str, Any]:
    too_deep = f"{kind} schema nests deeper than {MAX_DEFINITION_NESTING} levels"
    try:
        parsed = json.loads(definition)
    except RecursionError:  # (json.loads recurses; far past the limit, it gives up)
        raise InvalidSchemaError(too_deep) from None
    except ValueError as error:  # json.JSONDecodeError
        raise InvalidSchemaError(f"{kind} schema is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise InvalidSchemaError(
            f"{kind} schema is not a JSON object: it is a JSON {type(parsed).__name__}"
        )
    if _nesting(parsed) > MAX_DEFINITION_NESTING:
        raise InvalidSchemaError(too_deep)
    return parsed


def _parsed_avro(schema: Any) -> Any:
    try:
        return fastavro.parse_schema(schema)
    except Exception as error:  # SchemaParseException, UnknownType, KeyError, TypeError...
        raise InvalidSchemaError(
            f"an Avro schema fastavro refuses: {type(error).__name__}: {str(error)[:200]}"
        ) from None


def _check_json(definition: str) -> None:
    """A JSON Schema object whose fields JsonSchema.check_compatible can compare."""
    schema = _json_object(definition, "a JSON")
    properties = schema.get("properties", {})
    if not (isinstance(properties, dict) and all(isinstance(p, dict) for p in properties.values())):
        raise InvalidSchemaError(
            "a JSON schema's properties must be an object of field schemas (objects)"
        )
    required = schema.get("required", [])
    if not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise InvalidSchemaError("a JSON schema's required must be a list of field names")


def _check_avro(definition: str) -> None:
    """An Avro schema as AvroSchema keeps one: a JSON object fastavro parses."""
    _parsed_avro(_json_object(definition, "an Avro"))


def _check_protobuf(definition: str) -> None:
    if not _PROTOBUF_FULL_NAME.fullmatch(definition):
        raise InvalidSchemaError(
            f"a protobuf schema is a message's full name (package.Message), not {definition[:80]!r}"
        )


def _check_string(definition: str) -> None:
    if definition:
        raise InvalidSchemaError(
            f"a string schema has no definition (it is UTF-8 text), got {definition[:80]!r}"
        )


# The types a stream keeps (a bytes producer has no schema, so nothing is stored for it).
_CHECKS = {
    JsonSchema.type_name: _check_json,
    AvroSchema.type_name: _check_avro,
    ProtobufSchema.type_name: _check_protobuf,
    StringSchema.type_name: _check_string,
}


def validate_definition(type_name: str, definition: str) -> None:
    """InvalidSchemaError, naming why, unless a stream may keep this schema: a type it
    keeps (json, avro, protobuf, string), a definition of at most MAX_DEFINITION_BYTES,
    and what that type's schema class would produce -- JSON: a JSON Schema object
    (properties an object of objects, required a list of names); Avro: a JSON object
    that fastavro parses; protobuf: a message's full name; string: none. JSON nests at
    most MAX_DEFINITION_NESTING levels, checked without recursing over it."""
    check = _CHECKS.get(type_name)
    if check is None:
        raise InvalidSchemaError(
            f"unknown schema type {type_name[:40]!r}: a stream keeps one of "
            f"{', '.join(_CHECKS)} (a bytes producer has no schema to keep)"
        )
    if not isinstance(definition, str):
        raise InvalidSchemaError(f"a schema definition is a str, not {type(definition).__name__}")
    try:
        size = len(definition.encode())
    except UnicodeEncodeError as error:  # (lone surrogates: no store keeps those)
        raise InvalidSchemaError(f"the {type_name} schema is not UTF-8 text: {error}") from None
    if size > MAX_DEFINITION_BYTES:
        raise InvalidSchemaError(
            f"the {type_name} schema is larger than {MAX_DEFINITION_BYTES} bytes ({size})"
        )
    check(definition)


SCHEMA_TYPE = "schema.type"
SCHEMA_DEFINITION = "schema.definition"


def validate_schema_properties(properties: Mapping[str, str]) -> None:
    """InvalidSchemaError unless the schema properties about to be stored (a stream's,
    or a stream's to be) are none or a schema a stream may keep."""
    if SCHEMA_TYPE in properties or SCHEMA_DEFINITION in properties:
        validate_definition(properties.get(SCHEMA_TYPE, ""), properties.get(SCHEMA_DEFINITION, ""))


def check_against(schema: Schema[Any], properties: dict[str, str]) -> dict[str, str] | None:
    """The stream properties to store for a producer's schema (None: nothing to store),
    InvalidSchemaError if the producer's definition is none a stream may keep, or
    IncompatibleSchemaError (also when the stream's is: stored before that was checked)."""
    if isinstance(schema, BytesSchema):
        return None  # bytes write anywhere, as Pulsar's AUTO_PRODUCE_BYTES would not check
    validate_definition(schema.type_name, schema.definition())
    stored_type = properties.get(SCHEMA_TYPE)
    if stored_type is None:
        return {SCHEMA_TYPE: schema.type_name, SCHEMA_DEFINITION: schema.definition()}
    if stored_type != schema.type_name:
        raise IncompatibleSchemaError(
            f"the stream's schema is {stored_type}; a {schema.type_name} producer may not write"
        )
    try:
        validate_definition(stored_type, properties.get(SCHEMA_DEFINITION, ""))
    except InvalidSchemaError as error:
        raise IncompatibleSchemaError(
            f"the stream's {stored_type} schema is unusable: {error}; no {stored_type} "
            f"producer can be checked against it (a producer without a schema may still write)"
        ) from None
    schema.check_compatible(properties.get(SCHEMA_DEFINITION, ""))
    if properties.get(SCHEMA_DEFINITION) == schema.definition():
        return None
    return {SCHEMA_TYPE: schema.type_name, SCHEMA_DEFINITION: schema.definition()}
