"""Pulsar's wire, byte by byte, against a real broker's Pulsar port: what no well-behaved
client sends (pulsar-client always computes its checksums right) is answered as Pulsar's
broker answers it -- a SEND whose CRC32C does not match is ChecksumError and stored
nowhere; a SEND whose metadata is no MessageMetadata is refused alone -- and the
connection, and the producer on it, go on."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from streamlib.pulsar import PulsarApi_pb2 as api
from streamlib.pulsar import frames
from streamlib.stream.positions import EARLIEST

pytestmark = pytest.mark.timeout(120)
Type = api.BaseCommand.Type


class RawClient:
    """A client of frames.py over a socket: commands out, commands (and payloads) in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = frames.FrameDecoder()
        self.pending: list[frames.Frame] = []

    @classmethod
    async def connect(cls, url: str) -> RawClient:
        host, port = url.split("://", 1)[1].rsplit(":", 1)
        client = cls(*await asyncio.open_connection(host, int(port)))
        client.send(frames.wrap(api.CommandConnect(client_version="raw", protocol_version=20)))
        assert (await client.next()).command.type == Type.CONNECTED
        return client

    def send(self, command: api.BaseCommand, block: bytes | None = None) -> None:
        if block is None:
            self.writer.write(frames.encode_command(command))
        else:
            self.writer.write(frames.encode_with_headers(command, block))

    async def next(self) -> frames.Frame:
        async with asyncio.timeout(20):
            while not self.pending:
                data = await self.reader.read(1 << 16)
                assert data, "the broker closed the connection"
                self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def send_command(sequence_id: int) -> api.BaseCommand:
    return frames.wrap(api.CommandSend(producer_id=1, sequence_id=sequence_id, num_messages=1))


def one_message(sequence_id: int, data: bytes) -> bytes:
    metadata = api.MessageMetadata(producer_name="raw-1", sequence_id=sequence_id, publish_time=1)
    return frames.headers_and_payload(metadata, data)


async def test_a_bad_checksum_is_refused_and_stores_nothing(cluster: Any) -> None:
    cluster.start_bookies(3)
    (broker,) = cluster.start_brokers(1, pulsar=True)
    raw = await RawClient.connect(broker.pulsar_url)
    try:
        raw.send(frames.wrap(api.CommandProducer(
            topic="persistent://public/default/checked", producer_id=1, request_id=1,
            producer_name="raw-1", user_provided_producer_name=True)))  # fmt: skip
        ready = await raw.next()
        assert ready.command.type == Type.PRODUCER_SUCCESS, ready.command
        good = one_message(0, b"the first")
        damaged = bytearray(one_message(1, b"the second"))
        damaged[-1] ^= 0xFF  # (after the checksum was computed)
        raw.send(send_command(0), good)
        raw.send(send_command(1), bytes(damaged))
        raw.send(send_command(2), frames.headers_and_payload(b"\xff" * 7, b"junk"))
        raw.send(send_command(3), one_message(3, b"the last"))
        answers = [(await raw.next()).command for _ in range(4)]
    finally:
        await raw.close()
    assert [a.type for a in answers] == [
        Type.SEND_RECEIPT, Type.SEND_ERROR, Type.SEND_ERROR, Type.SEND_RECEIPT
    ]  # fmt: skip
    assert answers[1].send_error.sequence_id == 1
    assert answers[1].send_error.error == api.ChecksumError
    assert answers[2].send_error.sequence_id == 2
    assert answers[3].send_receipt.sequence_id == 3
    client = await cluster.client()
    reader = await client.create_reader("checked", EARLIEST)
    stored = [await reader.read_next(timeout=10) for _ in range(2)]
    assert [m.data for m in stored] == [b"the first", b"the last"]
    assert not await reader.has_message_available()
    await reader.close()


def test_the_bare_flag_is_pulsars_port_which_the_grpc_port_must_leave_to_it(tmp_path) -> None:
    from streamlib.cli import _build_parser

    parse = _build_parser().parse_args
    assert parse(["broker", "--metadata", "x", "--pulsar-port"]).pulsar_port == 6650
    assert parse(["broker", "--metadata", "x"]).pulsar_port is None
    refused = subprocess.run(
        [sys.executable, "-m", "streamlib", "broker", "--metadata",
         f"sqlite:///{tmp_path / 'meta.db'}", "--pulsar-port"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 1
    assert "--pulsar-port 6650 is the gRPC port (--port)" in refused.stderr
