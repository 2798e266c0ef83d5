"""Key material: a stream's ledgers have random secrets kept in private metadata nodes,
the public metadata no longer leads to a master key, and what a bookie or the embedded
store writes is readable by its own user only."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest

import metadata
from bookie.wire import bookie_pb2 as pb
from metadata.services.ledgers import LedgerMetadataManager
from streamlib.errors import UnauthorizedError
from streamlib.ledger.bookie_client import BookieClient
from streamlib.protocol.digest import master_key, password_hash
from streamlib.security import write_private
from tests.integration.conftest import FAST_CLIENT, LedgerCluster

OTHER = "auth=digest:analytics:other-secret"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_stream_ledgers_get_random_secrets_the_metadata_does_not_reveal(
    cluster: LedgerCluster,
):
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("orders", 3, 3, 2, rollover={"max_entries": 2})
    producer = await client.create_producer("orders", batching_max_messages=1)
    for i in range(5):
        await producer.send(b"order %d" % i)
    await producer.close()
    ledgers = [info.ledger_id for info in (await client.streams.registry.read("orders"))[0].ledgers]
    assert len(ledgers) >= 2

    secrets = []
    for ledger_id in ledgers:
        md = await client.ledgers.metadata(ledger_id)
        secret = await client.context.ledgers.read_secret(ledger_id)
        assert md.key_version == 1 and secret is not None and len(secret) == 32
        assert md.password_hash == password_hash(secret) != password_hash(b"")
        secrets.append(secret)
    assert len(set(secrets)) == len(secrets)  # each ledger its own

    # Whoever reads the public metadata cannot derive the key the bookies hold: a fence
    # with the key the old scheme derived from it is refused.
    md = await client.ledgers.metadata(ledgers[0])  # its entries are on every bookie
    bookie = md.last_fragment.ensemble[0]
    forged = pb.ReadLacRequest(
        ledger_id=md.ledger_id, flags=pb.FENCE, master_key=master_key(md.password_hash)
    )
    raw = BookieClient(bookie, cluster.by_id(bookie).address, FAST_CLIENT)
    try:
        assert (await raw.read_lac(forged)).status == pb.UNAUTHORIZED
    finally:
        await raw.close()

    # Readers need no secret; a reader's messages are the producer's.
    reader = await client.create_reader("orders", start="earliest")
    assert [(await reader.read_next(timeout=10)).data for _ in range(5)] == [
        b"order %d" % i for i in range(5)
    ]
    await reader.close()


async def test_another_zookeeper_identity_reads_a_stream_but_not_its_secrets(
    zookeeper, tmp_path: Path
):
    base = f"zk://{zookeeper.hosts}/keys-{uuid.uuid4().hex[:12]}"
    # The writers' identity from a file: bookies refuse a password on their command line.
    auth_file = write_private(tmp_path / "writer.auth", b"digest:streams:writer-secret\n")
    cluster = LedgerCluster(tmp_path, f"{base}?auth_file={auth_file}")
    try:
        cluster.start_bookies(3)
        writer = await cluster.client()
        producer = await writer.create_producer("payments")
        await producer.send(b"paid")
        ledger_id = (await writer.streams.registry.read("payments"))[0].ledgers[-1].ledger_id
        assert await writer.context.ledgers.read_secret(ledger_id) is not None

        async with await metadata.connect(f"{base}?{OTHER}") as other:
            ledgers = LedgerMetadataManager(other)
            await ledgers.read(ledger_id)  # the public metadata: readable
            with pytest.raises(metadata.AuthFailedError):
                await ledgers.read_secret(ledger_id)

        outsider = await cluster.client_at(f"{base}?{OTHER}")
        reader = await outsider.create_reader("payments", start="earliest")
        assert (await reader.read_next(timeout=10)).data == b"paid"
        await reader.close()
        # Without the secret it cannot take the stream over: the live producer goes on.
        with pytest.raises(UnauthorizedError, match="may not read ledger"):
            await outsider.ledgers.open(ledger_id, password=None, recover=True)
        assert (await producer.send(b"still mine")).ledger_id == ledger_id
        await producer.close()
    finally:
        await cluster.close()


async def test_bookie_and_embedded_store_files_are_private(cluster: LedgerCluster):
    (bookie,) = cluster.start_bookies(1)
    client = await cluster.client()
    writer = await client.ledgers.create(1, 1, 1, password=b"pw")
    await writer.append_many([b"x" * 1000] * 10)
    await writer.close()
    bookie.stop()  # flushed: entry logs, index and ledger state are on disk

    db = Path(cluster.metadata_uri.removeprefix("sqlite://"))
    assert mode_of(db) == 0o600
    found = 0
    for root, dirs, files in os.walk(bookie.data_dir):
        for d in dirs:
            assert mode_of(Path(root) / d) == 0o700, Path(root) / d
        for f in files:
            assert mode_of(Path(root) / f) & 0o077 == 0, Path(root) / f
            found += 1
    assert mode_of(bookie.data_dir) == 0o700 and found >= 3
