"""The bookie client's add stream alone, against an address where nothing listens: a
broken stream answers every add (None = unknown), even adds made while answering."""

import asyncio
import socket

from bookie.wire import bookie_pb2 as pb
from streamlib.ledger.bookie_client import AddHandler, BookieClient, BookieClientConfig


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when we return: nothing listens


async def test_an_add_made_while_a_broken_stream_is_answering_is_answered_too():
    # A long timeout: the sweeper must not be what answers.
    config = BookieClientConfig(add_timeout_s=600.0)
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
