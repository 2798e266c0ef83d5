"""What a stream may keep as its schema (pure): a definition that is not what its type
says -- not JSON, not an object, nested too deep, too large, an Avro schema fastavro
refuses, an unknown type -- is refused with InvalidSchemaError naming why, before it is
stored; and a garbage one stored before definitions were checked makes a typed producer
IncompatibleSchemaError, naming why, not a crash in the compatibility check."""

from __future__ import annotations

import dataclasses
import json

import pytest

from metadata.schemas import LedgerConfig
from streamlib.errors import BadRequestError, InvalidSchemaError
from streamlib.schema import (
    MAX_DEFINITION_BYTES,
    MAX_DEFINITION_NESTING,
    SCHEMA_DEFINITION,
    SCHEMA_TYPE,
    AvroSchema,
    IncompatibleSchemaError,
    JsonSchema,
    ProtobufSchema,
    Schema,
    StringSchema,
    check_against,
    validate_definition,
)
from streamlib.wire import broker_pb2 as pb
from streamlib.wire.convert import error_from_pb, error_pb


@dataclasses.dataclass
class Order:
    id: int
    item: str


def nested_arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


UNKNOWN_AVRO_TYPE = json.dumps(
    {"type": "record", "name": "X", "fields": [{"name": "a", "type": "wat"}]}
)
OVERSIZE_JSON = json.dumps({"description": "x" * MAX_DEFINITION_BYTES})
TOO_DEEP = f"deeper than {MAX_DEFINITION_NESTING}"

BAD_DEFINITIONS = [
    ("json", "[]", "not a JSON object"),
    ("json", '"x"', "not a JSON object"),
    ("json", "{{{", "not JSON"),
    ("json", "", "not JSON"),
    ("json", '{"a": ' + nested_arrays(MAX_DEFINITION_NESTING) + "}", TOO_DEEP),
    ("json", nested_objects(MAX_DEFINITION_NESTING + 1), TOO_DEEP),
    ("json", nested_arrays(100_000), TOO_DEEP),  # (deeper than json.loads can recurse)
    ("json", nested_objects(40_000), TOO_DEEP),
    ("json", nested_arrays(300_000), "larger than"),  # (600 kB: over the byte limit)
    ("json", nested_objects(300_000), "larger than"),
    ("json", OVERSIZE_JSON, "larger than"),
    ("json", '{"properties": {"id": 5}}', "properties"),
    ("json", '{"properties": []}', "properties"),
    ("json", '{"required": 5}', "required"),
    ("avro", "[]", "not a JSON object"),
    ("avro", "{{{", "not JSON"),
    ("avro", '{"type": "nope"}', "fastavro refuses"),
    ("avro", UNKNOWN_AVRO_TYPE, "fastavro refuses"),
    ("avro", nested_arrays(300_000), "larger than"),
    ("protobuf", "", "full name"),
    ("protobuf", "{{{", "full name"),
    ("protobuf", "metadata.v1.", "full name"),
    ("string", "x", "no definition"),
    ("xml", "<order/>", "unknown schema type"),
    ("bytes", "", "unknown schema type"),
    ("", "", "unknown schema type"),
]


@pytest.mark.parametrize(
    ("type_name", "definition", "why"),
    BAD_DEFINITIONS,
    ids=[f"{t or 'no-type'}-{d[:12]!r}-{len(d)}" for t, d, _ in BAD_DEFINITIONS],
)
def test_a_bad_definition_is_refused_naming_why(type_name, definition, why):
    with pytest.raises(InvalidSchemaError, match=why) as refused:
        validate_definition(type_name, definition)
    assert isinstance(refused.value, BadRequestError)  # a bad request: nothing to retry
    assert len(str(refused.value)) < 400  # (names it; does not echo a megabyte back)


@pytest.mark.parametrize(
    "schema",
    [JsonSchema(Order), AvroSchema(Order), ProtobufSchema(LedgerConfig), StringSchema()],
    ids=repr,
)
def test_what_the_schema_types_produce_is_valid(schema):
    validate_definition(schema.type_name, schema.definition())


def test_a_plain_json_object_and_nesting_up_to_the_limit_are_valid():
    validate_definition("json", "{}")
    validate_definition(
        "json", json.dumps({"x": json.loads(nested_arrays(MAX_DEFINITION_NESTING - 1))})
    )


GARBAGE_STORED = [
    ("[]", "not a JSON object"),  # (AttributeError: 'list' has no .get)
    ("{{{", "not JSON"),  # (JSONDecodeError)
    ("", "not JSON"),
    (nested_arrays(300_000), "larger than"),  # (RecursionError)
    (nested_objects(100), TOO_DEEP),
    ('{"properties": {"id": 5}}', "properties"),  # (AttributeError: 'int' has no .get)
    ('{"required": 5}', "required"),  # (TypeError: 'int' is not iterable)
]


@pytest.mark.parametrize(
    ("stored", "why"), GARBAGE_STORED, ids=[f"{d[:12]!r}-{len(d)}" for d, _ in GARBAGE_STORED]
)
def test_a_garbage_stored_schema_is_incompatible_naming_why(stored, why):
    properties = {SCHEMA_TYPE: "json", SCHEMA_DEFINITION: stored}
    with pytest.raises(IncompatibleSchemaError, match=f"stream's json schema is unusable.*{why}"):
        check_against(JsonSchema(Order), properties)
    with pytest.raises(IncompatibleSchemaError, match="unusable"):
        check_against(AvroSchema(Order), {SCHEMA_TYPE: "avro", SCHEMA_DEFINITION: stored})


def test_a_stored_schema_type_without_a_definition_is_incompatible():
    with pytest.raises(IncompatibleSchemaError, match=r"unusable.*not JSON"):
        check_against(JsonSchema(Order), {SCHEMA_TYPE: "json"})


class HandMadeJson(Schema[bytes]):
    """A schema class of the user's own, whose definition is whatever it was given."""

    type_name = "json"

    def __init__(self, definition: str) -> None:
        self._definition = definition

    def encode(self, value: bytes) -> bytes:
        return value

    def decode(self, data: bytes) -> bytes:
        return data

    def definition(self) -> str:
        return self._definition


def test_a_producer_schema_with_a_garbage_definition_is_never_stored():
    with pytest.raises(InvalidSchemaError, match="not JSON"):
        check_against(HandMadeJson("{{{"), {})  # the stream has none: it would be the first
    with pytest.raises(InvalidSchemaError, match="not JSON"):
        check_against(HandMadeJson("{{{"), {SCHEMA_TYPE: "json", SCHEMA_DEFINITION: "{}"})


def test_the_refusal_crosses_the_wire_as_itself():
    """The broker answers the class name as the code; the client raises that class."""
    answer = error_pb(InvalidSchemaError("a JSON schema is not JSON"))
    assert answer.code == "InvalidSchemaError"
    again = error_from_pb(pb.Error(code=answer.code, message=answer.message))
    assert type(again) is InvalidSchemaError and str(again) == "a JSON schema is not JSON"
