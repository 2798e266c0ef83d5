"""The schemas Pulsar's producers declare, kept with their stream for Pulsar's clients.

Pulsar's broker keeps a registry of each topic's schemas and checks a producer's against
it. streamlib keeps one Pulsar schema per stream, in the stream's properties (written by
CAS, as streamlib's own schema): the first producer with a schema sets it; a producer
whose schema differs is refused IncompatibleSchema (Pulsar's strictest compatibility:
evolving a schema means a new stream here); a producer without one (bytes) is taken, as
Pulsar takes it. Its version, in every ProducerSuccess and GetSchemaResponse, is 0.

streamlib's own schemas (streamlib.schema) are checked by its clients and kept under
other properties: a stream may have both. The bytes are the same either way -- a
pulsar-client StringSchema message is UTF-8 text to streamlib's readers.
"""

from __future__ import annotations

import base64
import json

from streamlib.protocol.errors import StreamlibError
from streamlib.pulsar import PulsarApi_pb2 as api
from streamlib.retry import retry_cas

PROPERTY = "pulsar.schema"
VERSION = (0).to_bytes(8, "big")
MAX_SCHEMA_BYTES = 64 * 1024


class IncompatibleSchemaError(StreamlibError):
    """A producer's schema is not the one its stream keeps."""


def is_bytes(schema: api.Schema) -> bool:
    """A schema that says nothing (pulsar-client's BytesSchema sends none, or None)."""
    return schema.type == api.Schema.Type.Value("None") and not schema.schema_data


def encode(schema: api.Schema) -> str:
    return json.dumps(
        {
            "type": int(schema.type),
            "data": base64.b64encode(schema.schema_data).decode(),
            "properties": {p.key: p.value for p in schema.properties},  # type: ignore[attr-defined]
        },
        sort_keys=True,
    )


def decode(text: str, name: str) -> api.Schema:
    raw = json.loads(text)
    schema = api.Schema(name=name, type=raw["type"], schema_data=base64.b64decode(raw["data"]))
    for key, value in raw["properties"].items():
        schema.properties.add(key=key, value=value)
    return schema


async def offer(streams: object, stream: str, schema: api.Schema) -> bytes:
    """The version of `schema` once its stream keeps it (it kept none, or the same);
    IncompatibleSchemaError if the stream keeps another."""
    wanted = encode(schema)
    if len(wanted) > MAX_SCHEMA_BYTES:  # (its data and properties: kept in the metadata)
        raise IncompatibleSchemaError(
            f"a schema, its properties included, is at most {MAX_SCHEMA_BYTES} bytes"
        )

    async def attempt() -> None:
        md, version = await streams.read(stream)  # type: ignore[attr-defined]
        stored = md.properties.get(PROPERTY)
        if stored == wanted:
            return
        if stored is not None:
            kept = api.Schema.Type.Name(json.loads(stored)["type"])
            raise IncompatibleSchemaError(
                f"stream {stream!r} keeps another {kept} schema: a producer's schema must "
                "be the one its stream keeps"
            )
        md.properties[PROPERTY] = wanted
        await streams.registry.write(stream, md, version)  # type: ignore[attr-defined]

    await retry_cas(f"stream {stream!r}: Pulsar schema", attempt)
    return VERSION


async def kept(streams: object, stream: str) -> api.Schema | None:
    """The Pulsar schema a stream keeps (None: none)."""
    md, _ = await streams.read(stream)  # type: ignore[attr-defined]
    text = md.properties.get(PROPERTY)
    return None if text is None else decode(text, stream)
