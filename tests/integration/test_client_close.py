"""A bookie client closed under a call in flight (the pool replaces it when the bookie
moved) fails that call as an unreachable bookie, never as a cancellation of the caller."""

from __future__ import annotations

import asyncio

import pytest

from bookie.wire import bookie_pb2 as pb
from streamlib.errors import BookieUnavailableError
from streamlib.ledger.bookie_client import BookieClient
from tests.integration.conftest import FAST_CLIENT, LedgerCluster


async def test_a_call_in_flight_when_its_client_closes_fails_as_unavailable(
    cluster: LedgerCluster,
):
    (bookie,) = cluster.start_bookies(1)
    client = await cluster.client()
    writer = await client.ledgers.create(1, 1, 1)
    await writer.append(b"x")
    raw = BookieClient(bookie.bookie_id, bookie.address, FAST_CLIENT)
    # A long poll for an entry nobody writes: in flight until the close.
    poll = pb.ReadLacRequest(ledger_id=writer.ledger_id, previous_lac=5, timeout_ms=20_000)
    assert await raw._connected(5.0)
    call = asyncio.ensure_future(raw.read_lac(poll))
    done, _ = await asyncio.wait({call}, timeout=0.5)  # bounded: it cannot end by itself
    assert not done
    await raw.close()
    with pytest.raises(BookieUnavailableError, match="client was closed"):
        await asyncio.wait_for(call, 10)
