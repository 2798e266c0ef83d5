"""The broker acts for its caller: on real processes (TLS bookies and a TLS broker that
take the cluster's tokens), every operation is checked against the CALLER's roles and
grants (streamlib/protocol/service_access.py), never the broker's own.

A reader may look streams up, consume and read; it may not create a stream, take one
over (fencing a direct-mode writer), or seek or delete a subscription it was not
granted. Each refusal leaves everything stored as it was."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

import metadata
from metadata.services.principals import SubscriptionGrants
from streamlib.errors import NoSuchStreamError, UnauthorizedError
from streamlib.security import write_private
from streamlib.stream.positions import EARLIEST
from streamlib.wire import broker_pb2 as pb
from streamlib.wire import broker_pb2_grpc as pb_grpc
from tests.integration.test_auth import Secure, secure  # noqa: F401 - (the fixture)

pytestmark = pytest.mark.timeout(180)


def start_broker(secure: Secure, tmp_path: Path, *extra: str) -> None:  # noqa: F811
    """A TLS broker taking the cluster's tokens, writing to the bookies as "broker"."""
    certs = secure.certs
    token_file = write_private(tmp_path / "broker.token", secure.token("broker").encode())
    secure.cluster.start_brokers(1, extra=[
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-ca", str(certs.ca), "--auth-token-secret-file", str(tmp_path / "token.key"),
        "--token", f"file:{token_file}", *extra,
    ])  # fmt: skip


async def service(secure: Secure, principal: str) -> Any:  # noqa: F811
    return await secure.cluster.service_client(
        tls_ca=str(secure.certs.ca), token=secure.token(principal)
    )


async def grant(secure: Secure, principal: str, *grants: str) -> None:  # noqa: F811
    async with await metadata.connect(secure.cluster.metadata_uri) as store:
        await SubscriptionGrants(store).grant(principal, list(grants))


async def test_a_readers_lookup_and_subscription_fence_no_direct_mode_writer(
    secure: Secure,  # noqa: F811
    tmp_path: Path,
):
    """A stream a direct-mode producer is writing: a reader looks it up through the
    broker, subscribes and receives -- and the producer goes on writing, its ledger
    still OPEN (before, the lookup made the broker take the stream over)."""
    await secure.set_roles("broker", ["write"])
    start_broker(secure, tmp_path)
    writer = await secure.client("writer")
    producer = await writer.create_producer("orders")
    first = await producer.send(b"before")
    ledger_id = first.ledger_id

    reader = await service(secure, "reader")
    assert await reader.lookup("orders")
    consumer = await reader.subscribe("orders", "audit", "earliest")
    received = await consumer.receive(timeout=30)
    assert (received.message_id, received.data) == (first, b"before")

    after = await producer.send(b"after")  # not fenced
    assert after.ledger_id == ledger_id
    assert (await consumer.receive(timeout=30)).data == b"after"
    metadata_now = await writer.ledgers.metadata(ledger_id)
    assert metadata_now.state.name == "OPEN"


async def test_a_reader_creates_no_stream(secure: Secure, tmp_path: Path):  # noqa: F811
    """A reader's lookup or subscription of a name that does not exist makes nothing
    (before: a stream and an open ledger per name), even where auto-creation is on; a
    writer's makes the stream."""
    await secure.set_roles("broker", ["write"])
    start_broker(secure, tmp_path)
    reader = await service(secure, "reader")
    for i in range(20):
        with pytest.raises(NoSuchStreamError, match="'reader' may not create streams"):
            await reader.lookup(f"made-up-{i}", create=True)
    with pytest.raises(NoSuchStreamError):
        await reader.subscribe("made-up-x", "s", "earliest")
    direct = await secure.client("admin")
    assert await direct.streams.list() == []  # nothing was made
    writer = await service(secure, "writer")
    with pytest.raises(NoSuchStreamError):  # (a consumer's, or a reader's, lookup)
        await writer.lookup("wanted")
    await writer.lookup("wanted", create=True)  # (a producer's)
    assert await direct.streams.list() == ["wanted"]


async def test_auto_creation_is_the_clusters_policy(secure: Secure, tmp_path: Path):  # noqa: F811
    """With auto-creation off (the secure sandbox's policy), a writer's producer makes
    nothing either, until the stream is created."""
    await secure.set_roles("broker", ["write"])
    start_broker(secure, tmp_path, "--allow-auto-create", "false")
    writer = await service(secure, "writer")
    with pytest.raises(NoSuchStreamError, match="allow_auto_create is off"):
        await writer.create_producer("not-yet")
    direct = await secure.client("admin")
    assert await direct.streams.list() == []
    await direct.streams.create("not-yet")
    producer = await writer.create_producer("not-yet")
    assert (await producer.send(b"now")).entry_id >= 0


async def test_a_reader_can_neither_seek_nor_unsubscribe_anothers_subscription(
    secure: Secure,  # noqa: F811
    tmp_path: Path,
):
    """The billing application's subscription: a reader may consume from it (its role
    allows consuming), but its seek to the end and its unsubscribe are refused, and the
    billing application then receives every message, none skipped or lost."""
    await secure.set_roles("broker", ["write"])
    await secure.set_roles("billing", [])  # no role at all: only its grant
    await grant(secure, "billing", "invoices/billing")
    start_broker(secure, tmp_path)
    writer = await service(secure, "writer")
    producer = await writer.create_producer("invoices")
    sent = [await producer.send(b"%d" % i) for i in range(10)]

    billing = await service(secure, "billing")
    owner = await billing.subscribe("invoices", "billing", "earliest", consumer_type="shared",
                                    receiver_queue_size=1)  # fmt: skip
    intruder_client = await service(secure, "reader")
    intruder = await intruder_client.subscribe(
        "invoices", "billing", consumer_type="shared", receiver_queue_size=1
    )
    with pytest.raises(UnauthorizedError, match="'reader' may not seek"):
        await intruder.seek(sent[-1])
    with pytest.raises(UnauthorizedError, match="'reader' may not seek, reset, skip or unsub"):
        await intruder.unsubscribe()
    await intruder.close()

    got = set()
    while len(got) < 10:
        message = await owner.receive(timeout=30)
        got.add(message.message_id)
        owner.acknowledge(message)
    assert got == set(sent)

    # The grant lets billing manage its own subscription, and nothing else.
    await owner.seek(EARLIEST)
    assert (await owner.receive(timeout=30)).message_id == sent[0]
    with pytest.raises(UnauthorizedError, match="'billing' may not consume"):
        await billing.subscribe("invoices", "audit", "earliest")
    with pytest.raises(UnauthorizedError, match="'billing' may not produce"):
        await billing.create_producer("invoices")
    # ... nor read the stream's other subscriptions' positions, or administer it.
    assert await billing.streams.partitions("invoices") == 0
    with pytest.raises(UnauthorizedError, match="'billing' may not read"):
        await billing.streams.cursors("invoices")
    with pytest.raises(UnauthorizedError, match="'billing' may not administer"):
        await billing.streams.delete("invoices")


async def test_the_bookie_role_may_do_nothing_through_the_broker(
    secure: Secure,  # noqa: F811
    tmp_path: Path,
):
    await secure.set_roles("broker", ["write"])
    await secure.set_roles("replicator", ["bookie"])
    start_broker(secure, tmp_path)
    writer = await service(secure, "writer")
    await (await writer.create_producer("logs")).send(b"x")
    replicator = await service(secure, "replicator")
    with pytest.raises(UnauthorizedError, match="'replicator' may not look"):
        await replicator.lookup("logs")
    with pytest.raises(UnauthorizedError, match="'replicator' may not"):
        await replicator.subscribe("logs", "s", "earliest")
    with pytest.raises(UnauthorizedError, match="'replicator' may not"):
        await replicator.create_reader("logs", EARLIEST)


async def test_only_its_own_principal_may_resume_a_producer_or_consumer(
    secure: Secure,  # noqa: F811
    tmp_path: Path,
):
    """A producer's name is no secret (every consumer sees it): another principal that
    opens a producer of that name with resume set must not take its place -- its
    sequence ids, its exclusivity -- nor a consumer's of the same name."""
    await secure.set_roles("broker", ["write"])
    await secure.set_roles("mallory", ["write"])
    start_broker(secure, tmp_path)
    writer = await service(secure, "writer")
    producer = await writer.create_producer("ledger", producer_name="A", access_mode="exclusive")
    first = [await producer.send(b"%d" % i) for i in range(3)]
    consumer = await writer.subscribe("ledger", "books", "earliest", consumer_name="clerk")

    broker = secure.cluster.brokers[0]
    token = (("authorization", f"Bearer {secure.token('mallory')}"),)
    credentials = grpc.ssl_channel_credentials(secure.certs.ca.read_bytes())
    async with grpc.aio.secure_channel(broker.address, credentials) as channel:
        stub = pb_grpc.BrokerStub(channel)
        hijack = stub.Produce(metadata=token)
        await hijack.write(pb.ProduceRequest(open=pb.ProducerOpen(
            stream="ledger", producer_name="A", access_mode="shared", resume=True)))  # fmt: skip
        answer = await hijack.read()
        assert answer.WhichOneof("kind") == "error", answer
        assert answer.error.code == "ProducerBusyError"
        steal = stub.Consume(metadata=token)
        await steal.write(pb.ConsumeRequest(open=pb.ConsumerOpen(
            stream="ledger", subscription="books", consumer_type="exclusive",
            consumer_name="clerk", resume=True, protocol_version=2)))  # fmt: skip
        answer = await steal.read()
        assert answer.WhichOneof("kind") == "error", answer
        assert answer.error.code == "ConsumerBusyError"

    later = await producer.send(b"3")  # still its, and stored (not taken for a duplicate)
    assert later > first[-1]
    got = [await consumer.receive(timeout=30) for _ in range(4)]
    assert [m.data for m in got] == [b"0", b"1", b"2", b"3"]


async def test_a_revoked_grant_applies_to_a_session_already_open(
    secure: Secure,  # noqa: F811
    tmp_path: Path,
):
    """A seek is checked against the caller's grants as they are when it asks, not as
    they were when its consumer opened."""
    await secure.set_roles("broker", ["write"])
    await secure.set_roles("billing", [])
    await grant(secure, "billing", "invoices/billing")
    start_broker(secure, tmp_path)
    writer = await service(secure, "writer")
    sent = await (await writer.create_producer("invoices")).send(b"x")
    billing = await service(secure, "billing")
    consumer = await billing.subscribe("invoices", "billing", "earliest")
    async with await metadata.connect(secure.cluster.metadata_uri) as store:
        await SubscriptionGrants(store).revoke("billing")
    async with asyncio.timeout(20):  # (the broker follows the grants by a watch)
        while True:
            try:
                await billing.lookup("invoices")
            except UnauthorizedError:
                break  # the broker knows
            await asyncio.sleep(0.1)
    with pytest.raises(UnauthorizedError, match="'billing' may not seek"):
        await consumer.seek(sent)  # on the session opened while it was granted
