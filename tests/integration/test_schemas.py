"""Schemas as pulsar-client users know them, against real bookie processes: producers
send objects, consumers and readers get them back with message.value(), and the stream
keeps the schema so an incompatible producer is refused before it takes the stream."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pydantic
import pytest

import streamlib
from metadata.schemas import LedgerConfig, Position
from streamlib.errors import BadRequestError, InvalidSchemaError, NoSuchStreamError
from streamlib.schema import (
    SCHEMA_DEFINITION,
    SCHEMA_TYPE,
    AvroSchema,
    BytesSchema,
    IncompatibleSchemaError,
    JsonSchema,
    ProtobufSchema,
    SchemaDecodeError,
    StringSchema,
)
from streamlib.service.connection import FIRST_CONNECT_S
from streamlib.wire import broker_pb2 as pb
from streamlib.wire import broker_pb2_grpc as pb_grpc
from tests.unit.test_schema_definitions import HandMadeJson

pytestmark = pytest.mark.timeout(120)


@dataclasses.dataclass
class Order:
    id: int
    item: str


@dataclasses.dataclass
class OrderV2:  # a compatible change: a new field with a default
    id: int
    item: str
    gift: bool = False


@dataclasses.dataclass
class OrderRenamed:  # an incompatible one: a new required field
    id: int
    item: str
    customer: str


class Payment(pydantic.BaseModel):
    amount: float
    note: str | None = None


def test_json_schemas_of_dataclasses_and_models_round_trip_and_evolve(cluster):
    cluster.start_bookies(3)
    with streamlib.connect(cluster.metadata_uri) as client:
        with client.create_producer("orders", schema=JsonSchema(Order)) as producer:
            producer.send(Order(1, "book"))
            with pytest.raises(BadRequestError, match="not a valid Order"):
                producer.send({"id": "not a number"})
        with client.create_producer("orders", schema=JsonSchema(OrderV2)) as newer:
            newer.send(OrderV2(2, "pen", gift=True))
        with pytest.raises(IncompatibleSchemaError, match="adds required fields"):
            client.create_producer("orders", schema=JsonSchema(OrderRenamed))
        with pytest.raises(IncompatibleSchemaError, match="schema is json"):
            client.create_producer("orders", schema=StringSchema())
        # Consumers decode with their own schema: old messages fill in defaults.
        with client.subscribe("orders", "sub", "earliest", schema=JsonSchema(OrderV2)) as c:
            assert [c.receive(timeout=30).value() for _ in range(2)] == [
                OrderV2(1, "book", False),
                OrderV2(2, "pen", True),
            ]
        shown = client.streams.read("orders")[0].properties
        assert shown["schema.type"] == "json" and "gift" in shown["schema.definition"]

        with client.create_producer("payments", schema=JsonSchema(Payment)) as payments:
            payments.send(Payment(amount=9.5))
        with client.create_reader("payments", schema=JsonSchema(Payment)) as reader:
            assert reader.read_next(timeout=30).value() == Payment(amount=9.5, note=None)
        with (
            client.create_reader("payments", schema=JsonSchema(Order)) as wrong,
            pytest.raises(SchemaDecodeError, match="not a Order"),
        ):
            wrong.read_next(timeout=30).value()


def test_avro_protobuf_string_and_bytes(cluster):
    cluster.start_bookies(3)
    with streamlib.connect(cluster.metadata_uri) as client:
        with client.create_producer("avro", schema=AvroSchema(Order)) as producer:
            producer.send(Order(3, "cup"))
        with pytest.raises(IncompatibleSchemaError, match="cannot evolve"):
            client.create_producer("avro", schema=AvroSchema(OrderV2))
        with client.create_reader("avro", schema=AvroSchema(Order)) as reader:
            message = reader.read_next(timeout=30)
            assert message.value() == Order(3, "cup")
            assert len(message.data) < len(b'{"id":3,"item":"cup"}')  # Avro's binary

        with client.create_producer("proto", schema=ProtobufSchema(LedgerConfig)) as producer:
            producer.send(LedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2))
        with pytest.raises(IncompatibleSchemaError, match=r"metadata\.v1\.LedgerConfig"):
            client.create_producer("proto", schema=ProtobufSchema(Position))
        with client.create_reader("proto", schema=ProtobufSchema(LedgerConfig)) as reader:
            assert reader.read_next(timeout=30).value().write_quorum == 2

        with client.create_producer("text", schema=StringSchema()) as producer:
            producer.send("grüße")
        with client.create_producer("text", schema=BytesSchema()) as raw:  # bytes: anywhere
            raw.send(b"\xff")
        with client.create_reader("text", schema=StringSchema()) as reader:
            assert reader.read_next(timeout=30).value() == "grüße"
            with pytest.raises(SchemaDecodeError, match="not UTF-8"):
                reader.read_next(timeout=30).value()
        with client.create_reader("text") as plain:  # no schema: the bytes
            assert plain.read_next(timeout=30).value() == "grüße".encode()


# -- definitions a stream may not keep ------------------------------------------------

GARBAGE_FIRST_SCHEMAS = [
    ("json", "{{{", "not JSON"),
    ("json", "[]", "not a JSON object"),
    ("json", "[" * 100_000 + "]" * 100_000, "deeper than 64"),
    ("json", "[" * 300_000 + "]" * 300_000, "larger than"),
    ("avro", '{"type": "nope"}', "fastavro refuses"),
    ("bytes", "", "unknown schema type"),
]


async def stored_schema(cluster, stream: str) -> tuple[str | None, str | None]:
    properties = (await (await cluster.client()).streams.read(stream))[0].properties
    return properties.get(SCHEMA_TYPE), properties.get(SCHEMA_DEFINITION)


async def store_unchecked(cluster, stream: str, type_name: str, definition: str) -> None:
    """A schema stored as streams were before definitions were checked (the stream's
    metadata written as it is, past the rule)."""
    streams = (await cluster.client()).streams
    md, version = await streams.read(stream)
    md.properties[SCHEMA_TYPE] = type_name
    md.properties[SCHEMA_DEFINITION] = definition
    await streams.registry.write(stream, md, version)


async def test_the_service_stores_no_garbage_first_schema(cluster):
    """A Produce open offering a first schema that is not what its type says is refused
    with InvalidSchemaError, naming why, and the stream keeps no schema; a garbage one
    stored before this check makes a typed producer IncompatibleSchemaError, not a
    crash of its compatibility check."""
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        for type_name, definition, why in GARBAGE_FIRST_SCHEMAS:
            call = stub.Produce()
            opened = pb.ProducerOpen(
                stream="raw", schema_type=type_name, schema_definition=definition
            )
            await call.write(pb.ProduceRequest(open=opened))
            answer = await call.read()
            assert answer.WhichOneof("kind") == "error", (type_name, definition[:12])
            assert answer.error.code == "InvalidSchemaError"
            assert why in answer.error.message
            call.cancel()
            assert await stored_schema(cluster, "raw") == (None, None)

    client = await cluster.service_client()
    async with asyncio.timeout(FIRST_CONNECT_S / 2):  # refused at once: nothing to retry
        with pytest.raises(InvalidSchemaError, match="not a JSON object"):
            await client.create_producer("raw", schema=HandMadeJson("[]"))
    producer = await client.create_producer("raw", schema=JsonSchema(Order))
    await producer.send(Order(1, "book"))
    assert (await stored_schema(cluster, "raw"))[0] == "json"

    await (await cluster.client()).streams.create("old")
    await store_unchecked(cluster, "old", "json", "[]")
    with pytest.raises(
        IncompatibleSchemaError, match=r"json schema is unusable: .*not a JSON object"
    ):
        await client.create_producer("old", schema=JsonSchema(Order))
    plain = await client.create_producer("old")  # bytes: no schema to check
    await plain.send(b"still writable")


async def test_direct_mode_stores_no_garbage_first_schema(cluster):
    """The same rule without the service: a producer's hand-made schema, and a stream
    created with schema properties, are checked before they are stored."""
    cluster.start_bookies(3)
    client = await cluster.client()
    with pytest.raises(InvalidSchemaError, match="not a JSON object"):
        await client.create_producer("direct", schema=HandMadeJson("[]"))
    assert await stored_schema(cluster, "direct") == (None, None)
    with pytest.raises(InvalidSchemaError, match="not JSON"):
        await client.streams.create(
            "created", properties={SCHEMA_TYPE: "json", SCHEMA_DEFINITION: "{{{"}
        )
    with pytest.raises(NoSuchStreamError):
        await client.streams.read("created")
    producer = await client.create_producer("direct", schema=JsonSchema(Order))
    await producer.send(Order(1, "book"))
    assert (await stored_schema(cluster, "direct"))[0] == "json"

    await client.streams.create("old")
    await store_unchecked(cluster, "old", "avro", "{{{")
    with pytest.raises(IncompatibleSchemaError, match=r"avro schema is unusable: .*not JSON"):
        await client.create_producer("old", schema=AvroSchema(Order))
