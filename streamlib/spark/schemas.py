"""The Spark side of streamlib.schema: the columns a JSON-schema stream's values hold.

    from pyspark.sql.functions import col, from_json
    from streamlib.spark import value_schema
    df.select(from_json(col("value").cast("string"), value_schema(uri, "orders")).alias("v"))

The stream's JSON Schema (as its first producer's JsonSchema stored it) becomes a Spark
StructType: integer -> long, number -> double, string -> string, boolean -> boolean,
arrays, nested models ($defs), and nullable fields (anyOf with null). Avro and Protobuf
streams are refused with a clear error: Spark reads those with spark-avro /
spark-protobuf from the `value` bytes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from streamlib.protocol.errors import BadRequestError
from streamlib.schema import SCHEMA_DEFINITION, SCHEMA_TYPE

_SCALARS: dict[str, DataType] = {
    "integer": LongType(),
    "number": DoubleType(),
    "string": StringType(),
    "boolean": BooleanType(),
}


def spark_type(node: dict[str, Any], defs: dict[str, Any]) -> tuple[DataType, bool]:
    """(the Spark type of a JSON Schema node, whether it may be null)."""
    if "$ref" in node:
        return spark_type(defs[node["$ref"].rsplit("/", 1)[1]], defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise BadRequestError(f"no Spark type for the union {node['anyOf']!r}")
        found, _ = spark_type(options[0], defs)
        return found, len(options) != len(node["anyOf"])
    kind = node.get("type")
    if kind in _SCALARS:
        return _SCALARS[kind], False
    if kind == "array":
        items, nullable = spark_type(node.get("items", {}), defs)
        return ArrayType(items, nullable), False
    if kind == "object":
        return struct_of(node, defs), False
    raise BadRequestError(f"no Spark type for JSON Schema {node!r}")


def struct_of(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> StructType:
    defs = {**(defs or {}), **schema.get("$defs", {})}
    required = set(schema.get("required", []))
    fields = []
    for name, node in schema.get("properties", {}).items():
        found, nullable = spark_type(node, defs)
        fields.append(StructField(name, found, nullable or name not in required))
    return StructType(fields)


def value_schema(metadata: str, stream: str, **client_options: Any) -> StructType:
    """The StructType of a JSON-schema stream's values (see the module doc)."""
    from streamlib.client import Client

    async def read() -> dict[str, str]:
        client = await Client.connect(metadata, **client_options)
        try:
            md, _ = await client.streams.read(stream)
            return dict(md.properties)
        finally:
            await client.close()

    properties = asyncio.run(read())
    kind = properties.get(SCHEMA_TYPE)
    if kind != "json":
        raise BadRequestError(
            f"stream {stream!r} has {'no' if kind is None else 'a ' + kind} schema: only "
            f"JSON-schema streams map to Spark columns here"
        )
    return struct_of(json.loads(properties[SCHEMA_DEFINITION]))
