"""Readers that share a client with the ledger's writer learn its acknowledged entries from
it (streamlib/ledger/local.py), on real bookies; and go back to the bookies whenever that
writer stops being the ledger's writer."""

from __future__ import annotations

import asyncio

import pytest

from streamlib.errors import InvalidTermError, StreamlibError

pytestmark = pytest.mark.timeout(120)


async def collect(reader, count: int, out: list[tuple[int, bytes]]) -> None:  # type: ignore[no-untyped-def]
    async for entry_id, payload in reader.tail(0, poll_timeout_s=1.0):
        out.append((entry_id, payload))
        if len(out) == count:
            return


async def caught_up(reader, got: list, sent: list) -> None:  # type: ignore[no-untyped-def]
    """Wait (bounded) until the tail has read what was sent and waits on the local writer."""
    for _ in range(500):
        if len(got) == len(sent) and reader.local_waits:
            break
        await asyncio.sleep(0.01)
    assert got == sent and reader.local_waits


async def test_a_reader_of_the_writers_client_tails_without_long_polls(cluster) -> None:
    cluster.start_bookies(3)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 3, 2)
    reader = await client.ledgers.open(writer.ledger_id, recover=False)
    got: list[tuple[int, bytes]] = []
    tailing = asyncio.ensure_future(collect(reader, 30, got))
    sent = []
    for i in range(30):
        data = b"entry-%d" % i
        sent.append((await writer.append(data), data))
    await asyncio.wait_for(tailing, 30)
    assert got == sent  # the acknowledged bytes, in order
    assert reader.long_polls == 0 and reader.local_waits > 0
    # The other way round too: a reader of another client long-polls the bookies.
    other = await cluster.client()
    remote = await other.ledgers.open(writer.ledger_id, recover=False)
    got_remote: list[tuple[int, bytes]] = []
    tailing = asyncio.ensure_future(collect(remote, 31, got_remote))
    sent.append((await writer.append(b"last"), b"last"))
    await asyncio.wait_for(tailing, 30)
    assert got_remote == sent and remote.long_polls > 0 and remote.local_waits == 0
    await writer.close()


async def test_the_tail_ends_when_another_client_recovers_the_ledger(cluster) -> None:
    cluster.start_bookies(3)
    client, other = await cluster.client(), await cluster.client()
    writer = await client.ledgers.create(3, 3, 2)
    sent = [(await writer.append(b"e%d" % i), b"e%d" % i) for i in range(5)]
    reader = await client.ledgers.open(writer.ledger_id, recover=False)
    got: list[tuple[int, bytes]] = []
    tailing = asyncio.ensure_future(collect(reader, 1000, got))
    await caught_up(reader, got, sent)
    recovered = await other.ledgers.open(writer.ledger_id)  # fences and closes it
    assert recovered.is_closed and recovered.last_entry_id == 4
    await asyncio.wait_for(tailing, 30)  # the closed ledger ends the tail: no hang
    assert got == sent
    with pytest.raises(StreamlibError):
        await writer.append(b"fenced")


async def test_a_reader_follows_the_new_term_when_another_client_takes_over(cluster) -> None:
    cluster.start_bookies(3)
    client, other = await cluster.client(), await cluster.client()
    writer = await client.ledgers.create(3, 3, 2, password=b"pw", unbounded=True)
    sent = [(await writer.append(b"t1-%d" % i), b"t1-%d" % i) for i in range(5)]
    reader = await client.ledgers.open(writer.ledger_id, password=b"pw", recover=False)
    got: list[tuple[int, bytes]] = []
    tailing = asyncio.ensure_future(collect(reader, 1000, got))
    await caught_up(reader, got, sent)
    # Another client's writer takes over (term 2): our writer is deposed but does not
    # know yet -- it is idle -- and its tail is still open. The reader must not wait on it.
    successor = await other.ledgers.take_over(writer.ledger_id, password=b"pw")
    more = [(await successor.append(b"t2-%d" % i), b"t2-%d" % i) for i in range(5)]
    for _ in range(3000):  # bounded: the new term's entries come by long poll
        if [p for _, p in got][-1:] == [b"t2-4"]:
            break
        await asyncio.sleep(0.01)
    data = [p for _, p in got]
    assert data[:5] == [p for _, p in sent] and data[-5:] == [p for _, p in more]
    assert reader.long_polls > 0
    with pytest.raises(InvalidTermError):
        await writer.append(b"from the old term")
    tailing.cancel()
    await asyncio.gather(tailing, return_exceptions=True)
    await successor.release()


async def test_a_reader_of_the_writers_client_reads_what_it_had_acknowledged(cluster) -> None:
    """Read-your-writes within a client: the bookies have not heard the last entry's LAC
    (no explicit LAC, no later entry), but this client's writer has it acknowledged."""
    cluster.start_bookies(3)
    client, other = await cluster.client(), await cluster.client()
    writer = await client.ledgers.create(3, 3, 2)
    writer._explicit_lac_interval_s = 0  # the bookies learn LACs only from later entries
    last = None
    for i in range(4):
        last = await writer.append(b"w%d" % i)
    reader = await client.ledgers.open(writer.ledger_id, recover=False)
    assert reader.last_add_confirmed == last
    assert await reader.read(last, last) == [b"w3"]
    remote = await other.ledgers.open(writer.ledger_id, recover=False)
    assert remote.last_add_confirmed == last - 1  # what the bookies know
    await writer.close()
    await reader.refresh_metadata()
    assert reader._local_lac() == -1  # the writer is gone: nothing local any more
