"""Bind and advertised addresses: a bookie registers what clients dial, never a wildcard,
keeps its id when its address changes, and clients find it at the new address."""

from __future__ import annotations

import asyncio

import pytest

from bookie.addresses import AddressError, advertised_address, join_host_port, split_host_port
from metadata.services.bookies import BookieRegistry
from streamlib.errors import StreamlibError


@pytest.mark.parametrize(
    ("bind", "given", "registered"),
    [
        ("127.0.0.1", None, "127.0.0.1:3181"),  # a concrete bind is dialable as it is
        ("0.0.0.0", "10.1.2.3", "10.1.2.3:3181"),  # the bound port by default
        ("0.0.0.0", "bookie-7.example:4000", "bookie-7.example:4000"),
        ("::", "[fd00::7]:3181", "[fd00::7]:3181"),
        ("fd00::8", None, "[fd00::8]:3181"),
    ],
)
def test_the_registered_address(bind: str, given: str | None, registered: str) -> None:
    assert advertised_address(bind, 3181, given, None) == registered


@pytest.mark.parametrize("given", ["0.0.0.0", "0.0.0.0:3181", ":3181", "host:port", "h:99999"])
def test_an_advertised_address_no_one_can_dial_is_refused(given: str) -> None:
    with pytest.raises(AddressError):
        advertised_address("0.0.0.0", 3181, given, None)


def test_addresses_round_trip() -> None:
    for host, port in [("10.0.0.1", 1), ("name", 2), ("fd00::1", 3)]:
        assert split_host_port(join_host_port(host, port)) == (host, port)


def test_a_wildcard_bind_registers_a_dialable_address_or_refuses() -> None:
    try:
        address = advertised_address("0.0.0.0", 3181, None, "zk://127.0.0.1:2181/x")
    except AddressError as e:  # a host with no route at all: the message says what to do
        assert "--advertised-address" in str(e)
    else:
        host, port = split_host_port(address)
        assert port == 3181 and host not in ("0.0.0.0", "::", "")


async def test_a_bookie_on_a_wildcard_bind_registers_its_advertised_address(cluster) -> None:
    bookie = cluster.start_bookies(1)[0]
    bookie.stop()
    bookie.extra = [*bookie.extra, "--host", "0.0.0.0", "--advertised-address", "127.0.0.1"]
    bookie.start()
    client = await cluster.client()
    (info,) = await BookieRegistry(client.store).list()
    assert info.address == f"127.0.0.1:{bookie.port}"
    assert not info.metrics_address.startswith("0.0.0.0")
    writer = await client.ledgers.create(1, 1, 1)
    await writer.append(b"through the advertised address")
    await writer.close()


async def test_a_bookie_that_moved_keeps_its_id_and_clients_follow_it(cluster) -> None:
    bookies = cluster.start_bookies(3)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 3, 2)
    await writer.append_many([b"a", b"b", b"c"])
    await writer.close()
    reader = await client.ledgers.open(writer.ledger_id, recover=False)
    assert await reader.read(0, 2) == [b"a", b"b", b"c"]
    moved = bookies[0]
    old_id = moved.bookie_id
    moved.stop()
    # The same directories come back on another address (127.0.0.2 is this host too).
    moved.extra = [*moved.extra, "--host", "127.0.0.2"]
    moved.start()
    assert moved.bookie_id == old_id  # the cookie keeps the name
    info = await BookieRegistry(client.store).get(old_id)
    assert info is not None and info.address == f"127.0.0.2:{moved.port}"
    for other in bookies[1:]:
        other.stop()  # only the moved bookie can answer now
    pool_client = client.pool.get(old_id)
    assert pool_client.address != info.address  # the client still knows the old address
    for _ in range(50):  # bounded: each failed read makes the pool look the address up
        try:
            if await reader.read(0, 2) == [b"a", b"b", b"c"]:
                break
        except StreamlibError:  # unreachable at the old address until the pool looks again
            pass
        await asyncio.sleep(0.1)  # a retry interval, not synchronisation
    assert client.pool.get(old_id).address == info.address
    assert await reader.read(0, 2) == [b"a", b"b", b"c"]
