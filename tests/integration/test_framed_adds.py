"""The framed add port (bookie/framed.py) on real bookie processes: adds take it when a
bookie registers one and read back over gRPC; it authenticates and authorizes as the
gRPC port does, over the same TLS; junk, a huge frame or silence end only the
connection that sent it; a bookie without the port takes adds over gRPC."""

from __future__ import annotations

import asyncio
import re
import ssl

import pytest

from bookie.launcher import BookieProcess
from bookie.wire import bookie_pb2 as pb
from bookie.wire.framing import FRAMED_VERSION, FrameError, frame, read_frame
from streamlib.client import Client
from streamlib.errors import UnauthenticatedError, UnauthorizedError
from streamlib.ledger.bookie_client import AddHandler, BookieClient, BookieClientConfig
from streamlib.ledger.framed_stream import client_ssl_context
from streamlib.security import make_token
from tests.integration import test_auth
from tests.integration.conftest import FAST_CLIENT, LedgerCluster
from tests.integration.test_auth import Secure

pytestmark = pytest.mark.timeout(120)

KEY = b"k" * 20


def framed_streams(client: Client) -> tuple[int, int]:
    """(add streams opened on framed ports, fallbacks to gRPC) over the client's bookies."""
    clients = list(client.pool._clients.values())
    opened = sum(c.stats.extra.get("framed_streams", 0) for c in clients)
    fallbacks = sum(c.stats.extra.get("framed_fallbacks", 0) for c in clients)
    return opened, fallbacks


def framed_outcomes(bookie: BookieProcess, **auth: object) -> dict[str, float]:
    text = bookie.metrics_text(**auth)  # type: ignore[arg-type]
    found = re.findall(r'bookie_framed_connections_total\{outcome="(\w+)"\} (\S+)', text)
    return {outcome: float(n) for outcome, n in found}


async def test_adds_take_the_framed_port_and_read_back_over_grpc(cluster: LedgerCluster):
    bookies = cluster.start_bookies(3)
    assert all(b.framed_port for b in bookies)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 3, 2, password=b"pw")
    payloads = [b"entry-%d" % i * (i + 1) for i in range(200)]
    for i, data in enumerate(payloads):
        assert await writer.append(data) == i
    await writer.close()
    assert framed_streams(client) == (3, 0)
    for bookie in bookies:
        assert framed_outcomes(bookie)["ok"] == 1

    reader = await (await cluster.client()).ledgers.open(writer.ledger_id, password=b"pw")
    assert await reader.read(0, reader.last_entry_id) == payloads


async def test_a_bookie_without_a_framed_port_takes_adds_over_grpc(cluster: LedgerCluster):
    bookies = cluster.start_bookies(3, extra=["--framed-port", "-1"])
    assert not any(b.framed_port for b in bookies)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 3, 2, password=b"pw")
    assert [await writer.append(b"x%d" % i) for i in range(5)] == list(range(5))
    assert framed_streams(client) == (0, 0)
    handle = await client.ledgers.open(writer.ledger_id, password=b"pw")
    assert await handle.read(0, 4) == [b"x%d" % i for i in range(5)]


async def hello(
    port: int, token: str = "", ssl_context: ssl.SSLContext | None = None
) -> tuple[pb.FramedHelloResponse, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ssl_context)
    writer.write(frame(pb.FramedHello(version=FRAMED_VERSION, token=token).SerializeToString()))
    data = await read_frame(reader, 1 << 20)
    assert data is not None
    return pb.FramedHelloResponse.FromString(data), reader, writer


async def closed_by_bookie(reader: asyncio.StreamReader) -> bool:
    """Whether the bookie closes the connection (whatever it says first), bounded. A
    reset is a close too (TLS may end that way)."""
    async with asyncio.timeout(10):
        try:
            while await reader.read(1 << 16):
                pass
        except (ConnectionError, ssl.SSLError):
            pass
    return True


async def add_over(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    """n adds to a new ledger on an open framed stream, each answered OK."""
    ledger_id = 10_000 + n
    entries = [
        pb.AddEntry(ledger_id=ledger_id, entry_id=i, last_add_confirmed=i - 1, payload=b"p",
                    master_key=KEY, length=i + 1)
        for i in range(n)
    ]  # fmt: skip
    writer.write(frame(pb.AddRequest(entries=entries).SerializeToString()))
    answered: list[int] = []
    while len(answered) < n:
        data = await read_frame(reader, 1 << 20)
        assert data is not None
        response = pb.AddResponse.FromString(data)
        assert not response.results
        answered += [e for ok in response.ok for e in ok.entry_ids]
    assert sorted(answered) == list(range(n))


async def test_junk_a_huge_frame_or_no_hello_closes_that_connection_only(
    cluster: LedgerCluster,
):
    (bookie,) = cluster.start_bookies(1, extra=["--framed-hello-timeout", "0.5"])
    port = bookie.framed_port
    answer, good_reader, good_writer = await hello(port)
    assert answer.status == pb.OK and answer.version == FRAMED_VERSION

    # An HTTP request: its first four bytes read as a ~1.2 GB frame.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await closed_by_bookie(reader)
    # Bytes that are no FramedHello, in a frame of a sane size.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frame(b"\xff" * 40))
    assert await closed_by_bookie(reader)
    # A hello of another version is refused, and says so.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frame(pb.FramedHello(version=99).SerializeToString()))
    data = await read_frame(reader, 1 << 20)
    assert data is not None
    refused = pb.FramedHelloResponse.FromString(data)
    assert refused.status == pb.BAD_REQUEST and "version 99" in refused.message
    assert await closed_by_bookie(reader)
    # Silence: closed after the hello timeout.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await closed_by_bookie(reader)
    # After a good hello, a frame past the gRPC port's 64 MiB limit ends that stream.
    answer, reader, writer = await hello(port)
    assert answer.status == pb.OK
    writer.write((65 << 20).to_bytes(4, "big"))
    data = await read_frame(reader, 1 << 20)
    assert data is not None
    (result,) = pb.AddResponse.FromString(data).results
    assert result.status == pb.TOO_LARGE and "over the limit" in result.message
    assert await closed_by_bookie(reader)
    # A frame that is no AddRequest is answered BAD_REQUEST, as on gRPC; the stream goes on.
    writer = good_writer
    writer.write(frame(b"\xff\xff\xff"))
    data = await read_frame(good_reader, 1 << 20)
    assert data is not None
    (result,) = pb.AddResponse.FromString(data).results
    assert result.status == pb.BAD_REQUEST and "malformed AddRequest" in result.message

    # The first connection, opened before all that, still serves adds; so does a new one.
    await add_over(good_reader, good_writer, 3)
    _, reader, writer = await hello(port)
    await add_over(reader, writer, 4)
    outcomes = framed_outcomes(bookie)
    assert outcomes["bad_hello"] == 3 and outcomes["no_hello"] == 1
    assert outcomes["bad_frame"] == 1 and outcomes["ok"] == 3


secure = test_auth.secure  # (the fixture: TLS bookies that authenticate tokens, and roles)


def client_config(secure: Secure, principal: str | None) -> BookieClientConfig:
    """A bookie client's config with the secure cluster's CA and a token of principal."""
    token = secure.token(principal) if principal else None
    return BookieClientConfig(add_timeout_s=5.0, tls_ca=str(secure.certs.ca), token=token)


async def raw_adds(bookie: BookieProcess, config: BookieClientConfig) -> list[int | None]:
    """Statuses of two adds sent by a BookieClient with config, and that it used the
    framed port."""
    framed = f"127.0.0.1:{bookie.framed_port}"
    client = BookieClient(bookie.bookie_id, bookie.address, config, framed_address=framed)
    answered: asyncio.Future[list[tuple[int, int | None]]] = asyncio.Future()
    entries = [
        pb.AddEntry(ledger_id=77, entry_id=i, last_add_confirmed=i - 1, payload=b"p",
                    master_key=KEY, length=i + 1)
        for i in range(2)
    ]  # fmt: skip
    got: list[tuple[int, int | None]] = []

    def on_results(results: list[tuple[int, int | None]]) -> None:
        got.extend(results)
        if len(got) == 2 and not answered.done():
            answered.set_result(got)

    try:
        client.add(entries, AddHandler(on_results))
        async with asyncio.timeout(20):
            results = await answered
        assert client.stats.extra.get("framed_streams") == 1
        assert "framed_fallbacks" not in client.stats.extra
    finally:
        await client.close()
    return [status for _, status in sorted(results)]


async def test_the_framed_port_speaks_tls_and_refuses_who_grpc_refuses(secure: Secure):
    bookie = secure.cluster.bookies[0]
    ca = client_ssl_context(str(secure.certs.ca), None, None)
    # Over TLS, a writer's adds are stored; the hello names nobody's credentials wrongly.
    assert await raw_adds(bookie, client_config(secure, "writer")) == [pb.OK, pb.OK]
    # No token, a forged one, an expired one: refused at the hello, closed.
    for token, why in (
        ("", "no credentials"),
        (make_token(b"another cluster's secret key, 32+ bytes", "writer"), "signature"),
        (secure.token("writer", expires_in_s=-60), "expired at"),
    ):
        answer, reader, _ = await hello(bookie.framed_port, token, ca)
        assert answer.status == pb.UNAUTHENTICATED and why in answer.message
        assert await closed_by_bookie(reader)
    # The client answers each add with that refusal (the writer's typed error), as the
    # gRPC stream refuses each batch of an unauthenticated caller.
    assert await raw_adds(bookie, client_config(secure, None)) == [pb.UNAUTHENTICATED] * 2
    # A principal whose roles do not allow adds is refused per batch, as on gRPC.
    assert await raw_adds(bookie, client_config(secure, "reader")) == [pb.UNAUTHORIZED] * 2
    # Plaintext to the TLS port gets no hello answer (a TLS alert at most, no frame).
    with pytest.raises((OSError, asyncio.IncompleteReadError, AssertionError, FrameError)):
        await hello(bookie.framed_port)

    # Through the client API: the same typed errors as over gRPC, and a writer writes.
    writer_client = await secure.cluster.client(
        tls_ca=str(secure.certs.ca), token=secure.token("writer"), bookie_config=FAST_CLIENT
    )
    ledger = await writer_client.ledgers.create(3, 3, 2, password=b"pw")
    assert [await ledger.append(b"a"), await ledger.append(b"b")] == [0, 1]
    # (Two acks answer an add of E3/Qa2: the third bookie's TLS handshake may still run.)
    async with asyncio.timeout(30):
        while framed_streams(writer_client) != (3, 0):
            await asyncio.sleep(0.02)  # polling a condition, bounded by the timeout
    anonymous = await secure.cluster.client(tls_ca=str(secure.certs.ca))
    with pytest.raises(UnauthenticatedError, match="no credentials"):
        await anonymous.ledgers.create(3, 3, 2)
    reader_client = await secure.cluster.client(
        tls_ca=str(secure.certs.ca), token=secure.token("reader")
    )
    with pytest.raises(UnauthorizedError):
        await reader_client.ledgers.create(3, 3, 2, password=b"x")
