"""Schemas as pulsar-client users know them, against real bookie processes: producers
send objects, consumers and readers get them back with message.value(), and the stream
keeps the schema so an incompatible producer is refused before it takes the stream."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

import streamlib
from metadata.schemas import LedgerConfig, Position
from streamlib.errors import BadRequestError
from streamlib.schema import (
    AvroSchema,
    BytesSchema,
    IncompatibleSchemaError,
    JsonSchema,
    ProtobufSchema,
    SchemaDecodeError,
    StringSchema,
)

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
