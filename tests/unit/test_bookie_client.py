"""The bookie client's add stream alone, against an address where nothing listens: a
broken stream answers every add (None = unknown), even adds made while answering."""

import asyncio
import socket

import grpc
import pytest

from bookie.wire import bookie_pb2 as pb
from bookie.wire import bookie_pb2_grpc as pb_grpc
from streamlib.ledger.bookie_client import (
    CHANNEL_OPTIONS,
    AddHandler,
    BookieClient,
    BookieClientConfig,
)
from streamlib.protocol.errors import BookieUnavailableError


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when we return: nothing listens


async def test_an_add_made_while_a_broken_stream_is_answering_is_answered_too():
    # A long timeout: the sweeper must not be what answers (a short wait for the
    # connection: the stream gives up on the dead address soon).
    config = BookieClientConfig(add_timeout_s=600.0, connect_timeout_s=0.2)
    client = BookieClient("b1", f"127.0.0.1:{closed_port()}", config)
    answers: list[list[tuple[int, int | None]]] = []
    second = asyncio.get_running_loop().create_future()

    def on_results(results: list[tuple[int, int | None]]) -> None:
        answers.append(results)
        if len(answers) == 1:  # a recovery retrying at once, from inside the answer
            client.add([pb.AddEntry(ledger_id=1, entry_id=0, payload=b"x")], handler)
        elif not second.done():
            second.set_result(None)

    handler = AddHandler(on_results)
    try:
        client.add([pb.AddEntry(ledger_id=1, entry_id=0, payload=b"x")], handler)
        await asyncio.wait_for(second, 30)
        assert answers == [[(0, None)], [(0, None)]]
    finally:
        await client.close()


class _AnsweringBookie(pb_grpc.BookieServicer):
    """Just enough of a bookie to answer LAC reads."""

    async def ReadLac(self, request, context):
        return pb.ReadLacResponse(status=pb.OK, last_add_confirmed=7)


def test_reconnect_backoff_is_capped_at_about_a_second():
    # gRPC's defaults (1 s growing to 120 s) lock a client out of bookies that are back.
    options = dict(CHANNEL_OPTIONS)
    assert options["grpc.initial_reconnect_backoff_ms"] <= 1000
    assert options["grpc.max_reconnect_backoff_ms"] <= 1000
    assert BookieClientConfig().connect_timeout_s > options["grpc.max_reconnect_backoff_ms"] / 1000


async def test_a_fencing_read_reaches_a_bookie_that_came_back_after_a_failed_call():
    port = closed_port()
    client = BookieClient("b1", f"127.0.0.1:{port}", BookieClientConfig(read_timeout_s=30.0))
    server = grpc.aio.server()
    try:
        with pytest.raises(BookieUnavailableError):  # nothing listens: the channel backs off
            await client.read_lac(pb.ReadLacRequest(ledger_id=1))
        pb_grpc.add_BookieServicer_to_server(_AnsweringBookie(), server)
        assert server.add_insecure_port(f"127.0.0.1:{port}") == port
        await server.start()
        # A fencing read waits out the (short) backoff instead of failing on it at once.
        fence = pb.ReadLacRequest(ledger_id=1, flags=pb.FENCE)
        response = await asyncio.wait_for(client.read_lac(fence), 10)
        assert response.last_add_confirmed == 7
    finally:
        await client.close()
        await server.stop(None)


async def test_fencing_reads_of_a_dead_bookie_fail_within_the_connect_timeout():
    # They wait for a connection, but not for their whole (here very long) deadline.
    config = BookieClientConfig(read_timeout_s=600.0, connect_timeout_s=0.5)
    client = BookieClient("b1", f"127.0.0.1:{closed_port()}", config)
    try:
        async with asyncio.timeout(10):
            with pytest.raises(BookieUnavailableError):
                await client.read_lac(pb.ReadLacRequest(ledger_id=1, flags=pb.FENCE))
            with pytest.raises(BookieUnavailableError):  # a takeover's read: its term fences
                await client.read(
                    pb.ReadRequest(ledger_id=1, first_entry_id=0, last_entry_id=0, term=2)
                )
    finally:
        await client.close()
