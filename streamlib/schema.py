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
"""

from __future__ import annotations

import abc
import dataclasses
import io
import json
import types
import typing
from typing import Any, Generic, TypeVar

import fastavro
import pydantic
from google.protobuf.message import Message as ProtobufMessage
from pydantic_core import PydanticUndefined

from streamlib.protocol.errors import BadRequestError, StreamlibError

T = TypeVar("T")


class IncompatibleSchemaError(StreamlibError):
    """A producer's schema cannot be used on the stream: another type, or a change that
    consumers of the stream's schema could not read."""


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
        try:
            self._parsed = fastavro.parse_schema(raw)
        except Exception as error:  # fastavro's SchemaParseException and friends
            raise BadRequestError(f"not an Avro schema: {error}") from None
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


SCHEMA_TYPE = "schema.type"
SCHEMA_DEFINITION = "schema.definition"


def check_against(schema: Schema[Any], properties: dict[str, str]) -> dict[str, str] | None:
    """The stream properties to store for a producer's schema (None: nothing to store),
    or IncompatibleSchemaError."""
    if isinstance(schema, BytesSchema):
        return None  # bytes write anywhere, as Pulsar's AUTO_PRODUCE_BYTES would not check
    stored_type = properties.get(SCHEMA_TYPE)
    if stored_type is None:
        return {SCHEMA_TYPE: schema.type_name, SCHEMA_DEFINITION: schema.definition()}
    if stored_type != schema.type_name:
        raise IncompatibleSchemaError(
            f"the stream's schema is {stored_type}; a {schema.type_name} producer may not write"
        )
    schema.check_compatible(properties.get(SCHEMA_DEFINITION, ""))
    if properties.get(SCHEMA_DEFINITION) == schema.definition():
        return None
    return {SCHEMA_TYPE: schema.type_name, SCHEMA_DEFINITION: schema.definition()}
