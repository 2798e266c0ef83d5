"""A client process that lives through a restart of the whole cluster: every bookie
SIGKILLed, then started again on the same data and ports (issue item 6).

The client's connections break under it, and what it tries during the outage fails, as
it must: an unreachable bookie is an Unknown, and Unknowns abort a recovery rather than
close the ledger. Once the bookies are back the SAME client must recover, take over and
write again, instead of staying locked out by a reconnect backoff grown during the outage.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from functools import partial

import pytest

from streamlib.client import Client
from streamlib.errors import RecoveryAbortedError
from streamlib.ledger.handles import WriteHandle
from streamlib.protocol import LedgerState
from tests.integration.conftest import LedgerCluster

PASSWORD = b"pw"
BOUND_S = 60.0  # for every wait on a condition in these tests
# How many connection attempts of the client each dead bookie's port must see: with
# gRPC's default backoff (1 s, x1.6 each time) the 4th comes about 5 s into the outage
# and the 5th about 4 s after it, far longer than the bookies take to come back.
ATTEMPTS_DURING_OUTAGE = 4


class RefusingPorts:
    """Stand-ins on the dead bookies' ports for the length of the outage: each closes
    every connection at once (to the client, as good as a refused one) and counts them,
    so the test can wait until the client has kept trying through the outage, as a
    long-lived client would, rather than guess how long that takes."""

    def __init__(self, ports: list[int]) -> None:
        self.attempts = dict.fromkeys(ports, 0)
        self._counted = asyncio.Event()
        self._servers: list[asyncio.Server] = []

    async def __aenter__(self) -> RefusingPorts:
        for port in self.attempts:
            self._servers.append(
                await asyncio.start_server(partial(self._refuse, port), "127.0.0.1", port)
            )
        return self

    async def _refuse(
        self, port: int, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.attempts[port] += 1
        self._counted.set()
        # A reset, not a FIN: no TIME_WAIT left behind on the port the bookie takes back.
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.close()

    async def each_attempted(self, times: int) -> None:
        async with asyncio.timeout(BOUND_S):
            while min(self.attempts.values()) < times:
                self._counted.clear()
                await self._counted.wait()

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()


async def written_ledger(
    client: Client, *, unbounded: bool = False
) -> tuple[WriteHandle, list[bytes]]:
    """A ledger on all three bookies with 30 acknowledged entries, left OPEN. With E=3,
    Qw=2 entry e goes to bookies e%3 and (e+1)%3: every bookie took adds from this
    client, so each of its connections was up when the bookies died."""
    writer = await client.ledgers.create(3, 2, 2, password=PASSWORD, unbounded=unbounded)
    datas = [b"before the restart %02d" % i for i in range(30)]
    assert await writer.append_many(datas) == list(range(30))
    assert writer.last_add_confirmed == 29
    return writer, datas


def kill_every_bookie(cluster: LedgerCluster) -> float:
    """SIGKILL them all; when (epoch ms) the outage began."""
    killed_ms = time.time() * 1000
    for bookie in cluster.bookies:
        bookie.kill()
    return killed_ms


async def start_every_bookie_again(cluster: LedgerCluster, client: Client, killed_ms: float):
    """Start every bookie on its data dir and port, and wait until the client's registry
    lists each one registered again by its new process."""
    registry = client.pool.registry
    ids = {b.bookie_id for b in cluster.bookies}
    async with registry.watch() as changes:
        # In threads: each start waits for its old session to be reaped, all at once.
        await asyncio.gather(*(asyncio.to_thread(b.start) for b in cluster.bookies))
        assert {b.bookie_id for b in cluster.bookies} == ids  # same ids, same ports
        async with asyncio.timeout(BOUND_S):
            while {
                info.bookie_id for info in await registry.list() if info.registered_ms >= killed_ms
            } != ids:
                await changes.next(BOUND_S)


async def test_the_same_client_recovers_its_ledger_after_a_full_cluster_restart(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    writer, datas = await written_ledger(client)

    killed_ms = kill_every_bookie(cluster)
    async with RefusingPorts([b.port for b in cluster.bookies]) as outage:
        with pytest.raises(RecoveryAbortedError) as during_outage:
            await client.ledgers.open(writer.ledger_id, PASSWORD, attempts=2)
        await outage.each_attempted(ATTEMPTS_DURING_OUTAGE)
    # Aborted, never closed on Unknowns (that could truncate the ledger); with no bookie
    # answering at all, not even marked IN_RECOVERY (manager.check_may_write).
    assert (await client.ledgers.metadata(writer.ledger_id)).state is LedgerState.OPEN
    await start_every_bookie_again(cluster, client, killed_ms)

    reader = await client.ledgers.open(writer.ledger_id, PASSWORD, recover=True)
    assert reader.is_closed and reader.last_entry_id == 29
    assert await reader.read(0, 29) == datas
    assert "gave up after 2 attempts" in str(during_outage.value)


async def test_the_same_client_takes_over_an_unbounded_ledger_after_a_full_cluster_restart(
    cluster,
):
    cluster.start_bookies(3)
    client = await cluster.client()
    writer, datas = await written_ledger(client, unbounded=True)

    killed_ms = kill_every_bookie(cluster)
    async with RefusingPorts([b.port for b in cluster.bookies]) as outage:
        with pytest.raises(RecoveryAbortedError) as during_outage:
            await client.ledgers.take_over(writer.ledger_id, PASSWORD, attempts=1)
        await outage.each_attempted(ATTEMPTS_DURING_OUTAGE)
    await start_every_bookie_again(cluster, client, killed_ms)

    successor = await client.ledgers.take_over(writer.ledger_id, PASSWORD)
    assert successor.last_add_confirmed >= 29  # then the old terms' TRUNCATE no-ops
    entry_id = await successor.append(b"after the restart")
    await successor.release()
    reader = await client.ledgers.open(writer.ledger_id, PASSWORD, recover=False)
    assert await reader.read(0, entry_id) == [*datas, b"after the restart"]
    assert "takeover gave up after 1 attempt in" in str(during_outage.value)


async def test_the_same_client_writes_a_new_ledger_after_a_full_cluster_restart(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    old, _ = await written_ledger(client)

    killed_ms = kill_every_bookie(cluster)
    async with RefusingPorts([b.port for b in cluster.bookies]) as outage:
        with pytest.raises(RecoveryAbortedError):
            await client.ledgers.open(old.ledger_id, PASSWORD, attempts=1)
        await outage.each_attempted(ATTEMPTS_DURING_OUTAGE)
    await start_every_bookie_again(cluster, client, killed_ms)

    # A new ledger on the same three bookies (there are no others): its first adds go
    # out on the add streams at once, with no recovery before them to warm anything up.
    writer = await client.ledgers.create(3, 3, 2, password=PASSWORD)
    datas = [b"after the restart %02d" % i for i in range(10)]
    assert await writer.append_many(datas) == list(range(10))
    closed = await writer.close()
    assert closed.last_entry_id == 9 and len(closed.fragments) == 1  # no bookie replaced
    reader = await client.ledgers.open(writer.ledger_id, PASSWORD)
    assert await reader.read(0, 9) == datas
