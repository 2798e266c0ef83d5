"""Authentication and roles at real bookie processes: tokens (HS256) and client
certificates name principals, the metadata store's principal map gives them roles, and
the bookie refuses what the roles do not allow -- without changing anything stored."""

from __future__ import annotations

import asyncio
import json
import urllib.error
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import metadata
from bookie.launcher import BookieProcess
from bookie.wire import bookie_pb2 as pb
from metadata.services.principals import PrincipalRoles
from streamlib.client import Client
from streamlib.errors import UnauthenticatedError, UnauthorizedError
from streamlib.ledger.bookie_client import BookieClient, BookieClientConfig
from streamlib.protocol.digest import master_key
from streamlib.security import CertFiles, make_certs, make_token, new_secret_key, write_private
from tests.integration.conftest import FAST_CLIENT, LedgerCluster

pytestmark = pytest.mark.timeout(120)


@dataclass
class Secure:
    cluster: LedgerCluster
    certs: CertFiles
    secret: bytes

    def token(self, principal: str, **kw: object) -> str:
        return make_token(self.secret, principal, **kw)  # type: ignore[arg-type]

    async def client(self, principal: str, **options: object) -> Client:
        return await self.cluster.client(
            tls_ca=str(self.certs.ca), token=self.token(principal), **options
        )

    async def set_roles(self, principal: str, roles: list[str]) -> None:
        async with await metadata.connect(self.cluster.metadata_uri) as store:
            principals = PrincipalRoles(store)
            await principals.revoke(principal)
            if roles:
                await principals.grant(principal, roles)


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    """Wait (bounded) until check() holds: bookies follow the principal map by a watch."""
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.05)


@pytest.fixture
async def secure(cluster: LedgerCluster, tmp_path: Path) -> Secure:
    """Three TLS bookies that authenticate tokens, and the roles of writer, reader, admin."""
    certs = make_certs(tmp_path / "certs")
    secret = new_secret_key()
    secret_file = write_private(tmp_path / "token.key", secret)
    s = Secure(cluster, certs, secret)
    for principal, roles in (("writer", ["write"]), ("reader", ["read"]), ("ops", ["admin"])):
        await s.set_roles(principal, roles)
    flags = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    flags += ["--tls-ca", str(certs.ca), "--auth-token-secret-file", str(secret_file)]
    cluster.start_bookies(3, extra=flags)
    return s


async def test_a_reader_reads_but_can_neither_add_nor_fence(secure: Secure):
    writer_client = await secure.client("writer")
    writer = await writer_client.ledgers.create(3, 3, 2, password=b"pw")
    assert await writer.append(b"a") == 0
    assert await writer.append(b"b") == 1  # carries LAC 0 to the bookies

    reader_client = await secure.client("reader")
    handle = await reader_client.ledgers.open(writer.ledger_id, password=b"pw", recover=False)
    assert handle.last_add_confirmed >= 0
    assert await handle.read(0, 0) == [b"a"]
    with pytest.raises(UnauthorizedError, match="'reader' may not recover ledger"):
        await reader_client.ledgers.open(writer.ledger_id, password=b"pw")  # would fence
    with pytest.raises(UnauthorizedError, match="'reader' may not create a ledger"):
        await reader_client.ledgers.create(3, 3, 2, password=b"x")
    assert (await writer_client.ledgers.metadata(writer.ledger_id)).state.name == "OPEN"
    # Past the client's own check, every bookie refuses a reader's fence, holding the key.
    key = master_key(writer.metadata.key_material(b"pw"))
    fence = pb.ReadLacRequest(ledger_id=writer.ledger_id, flags=pb.FENCE, master_key=key)
    for bookie in secure.cluster.bookies:
        config = BookieClientConfig(tls_ca=str(secure.certs.ca), token=secure.token("reader"))
        raw = BookieClient(bookie.bookie_id, bookie.address, config)
        try:
            answer = await raw.read_lac(fence)
        finally:
            await raw.close()
        assert answer.status == pb.UNAUTHORIZED and "may not fence" in answer.message

    # Nothing changed: the writer was not fenced and goes on; its entries are intact.
    assert await writer.append(b"c") == 2
    await writer.close()
    final = await writer_client.ledgers.open(writer.ledger_id, password=b"pw")
    assert await final.read(0, final.last_entry_id) == [b"a", b"b", b"c"]


async def test_no_forged_or_expired_token_and_no_anonymous_caller_gets_in(secure: Secure):
    bookie = secure.cluster.bookies[0]
    request = pb.ReadLacRequest(ledger_id=1, previous_lac=-1)

    async def ask(token: str | None) -> pb.ReadLacResponse:
        config = BookieClientConfig(tls_ca=str(secure.certs.ca), token=token)
        client = BookieClient(bookie.bookie_id, bookie.address, config)
        try:
            return await client.read_lac(request)
        finally:
            await client.close()

    anonymous = await ask(None)
    assert anonymous.status == pb.UNAUTHENTICATED and "no credentials" in anonymous.message
    forged = await ask(make_token(b"another cluster's secret key, 32+ bytes", "writer"))
    assert forged.status == pb.UNAUTHENTICATED and "signature is invalid" in forged.message
    expired = await ask(secure.token("writer", expires_in_s=-60))
    assert expired.status == pb.UNAUTHENTICATED and "expired at" in expired.message
    assert (await ask("not.a.jwt")).status == pb.UNAUTHENTICATED
    # The bookie stayed up and serves a good token (the ledger is unknown there).
    assert (await ask(secure.token("reader"))).status == pb.NO_SUCH_LEDGER
    assert 'bookie_auth_refusals_total{reason="unauthenticated"}' in bookie.metrics_text(
        token=secure.token("reader"), ca=secure.certs.ca
    )

    # A client refuses an expired token before it dials anyone, and says so.
    with pytest.raises(UnauthenticatedError, match="expired"):
        await secure.cluster.client(
            tls_ca=str(secure.certs.ca), token=secure.token("writer", expires_in_s=-1)
        )
    # A client with no token gets a typed refusal from the bookies.
    anonymous_client = await secure.cluster.client(tls_ca=str(secure.certs.ca))
    with pytest.raises(UnauthenticatedError, match="no credentials"):
        await anonymous_client.ledgers.create(3, 3, 2)


async def test_a_revoked_principal_is_refused_and_a_granted_one_let_in(secure: Secure):
    client = await secure.client("writer")
    writer = await client.ledgers.create(3, 3, 2, password=b"pw")
    await writer.append(b"before")
    await writer.close()

    await secure.set_roles("writer", [])

    async def refused() -> bool:
        try:
            await (await client.ledgers.create(3, 3, 2, password=b"pw")).append(b"after revoke")
        except UnauthorizedError:
            return True
        return False

    await eventually(refused)
    handle = await client.ledgers.open(writer.ledger_id, password=b"pw", recover=False)

    async def reads_refused() -> bool:  # every bookie follows the map on its own watch
        try:
            await handle.read(0, 0)
        except UnauthorizedError as e:
            assert "has none" in str(e)
            return True
        return False

    await eventually(reads_refused)

    await secure.set_roles("writer", ["read"])

    async def reads() -> bool:
        try:
            return await handle.read(0, 0) == [b"before"]
        except UnauthorizedError:
            return False

    await eventually(reads)


async def test_the_admin_port_refuses_anonymous_and_non_admin_callers(secure: Secure):
    bookie: BookieProcess = secure.cluster.bookies[0]
    ca = secure.certs.ca
    post = "/admin/disk-thresholds?threshold=0.01&lwm=0.01"  # would turn it read-only
    for token, code in ((None, 401), (secure.token("reader"), 403), (secure.token("writer"), 403)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            bookie.admin("POST", post, token=token, ca=ca)
        assert refused.value.code == code
        assert "error" in json.loads(refused.value.read())
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        bookie.metrics_text(ca=ca)
    assert anonymous.value.code == 401
    state = bookie.admin("GET", "/admin/state", token=secure.token("ops"), ca=ca)
    assert state["read_only"] is False  # nothing the refused calls asked for happened
    # Plain HTTP on the TLS port gets nowhere.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        bookie.admin("GET", "/admin/state", token=secure.token("ops"))


async def test_client_certificates_name_principals_under_mutual_tls(
    cluster: LedgerCluster, tmp_path: Path
):
    certs = make_certs(tmp_path / "certs", client_name="billing")
    flags = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    flags += ["--tls-ca", str(certs.ca), "--tls-client-auth"]
    async with await metadata.connect(cluster.metadata_uri) as store:
        await PrincipalRoles(store).grant("billing", ["read"])
    cluster.start_bookies(3, extra=flags)
    tls = {"tls_ca": str(certs.ca), "tls_cert": str(certs.client_cert)}
    client = await cluster.client(tls_key=str(certs.client_key), **tls)
    with pytest.raises(UnauthorizedError, match="'billing' may not create a ledger"):
        await client.ledgers.create(3, 3, 2)

    async with await metadata.connect(cluster.metadata_uri) as store:
        await PrincipalRoles(store).grant("billing", ["write"])

    async def writes() -> bool:
        try:
            return await (await client.ledgers.create(3, 3, 2)).append(b"x") == 0
        except UnauthorizedError:
            return False

    await eventually(writes)


def test_the_client_config_never_shows_its_token():
    config = BookieClientConfig(token="eyJhbGciOi.secret.part")
    assert "secret" not in repr(config) and FAST_CLIENT.token is None


async def test_a_bookie_principal_may_recover_but_never_take_a_stream_over(secure: Secure):
    await secure.set_roles("copier", ["bookie"])
    writer_client = await secure.client("writer")
    producer = await writer_client.create_producer("payroll")
    first = await producer.send(b"paid")
    copier = await secure.client("copier")
    with pytest.raises(UnauthorizedError, match="'copier' may not produce to stream"):
        await copier.create_producer("payroll")
    # Refused before anything was fenced: the live producer goes on in its ledger.
    assert (await writer_client.ledgers.metadata(first.ledger_id)).state.name == "OPEN"
    assert (await producer.send(b"still mine")).ledger_id == first.ledger_id


async def test_a_reader_cannot_raise_the_lac_on_an_add_stream(secure: Secure):
    writer_client = await secure.client("writer")
    writer = await writer_client.ledgers.create(3, 3, 2, password=b"pw")
    await writer.append(b"a")
    bookie = secure.cluster.bookies[0]
    config = BookieClientConfig(tls_ca=str(secure.certs.ca), token=secure.token("reader"))
    raw = BookieClient(bookie.bookie_id, bookie.address, config)
    key = master_key(writer.metadata.key_material(b"pw"))
    try:
        raw.send_lac(pb.WriteLacRequest(ledger_id=writer.ledger_id, master_key=key,
                                        last_add_confirmed=0))  # fmt: skip
        # Refused (counted, never answered): the LAC is the writer's own.
        metric = 'bookie_stream_lac_errors_total{status="UNAUTHORIZED"} 1.0'

        async def counted() -> bool:
            text = bookie.metrics_text(token=secure.token("reader"), ca=secure.certs.ca)
            return metric in text

        await eventually(counted)
        probe = pb.ReadLacRequest(ledger_id=writer.ledger_id, previous_lac=-1)
        assert (await raw.read_lac(probe)).last_add_confirmed <= 0  # only the writer's own
    finally:
        await raw.close()


async def test_the_broker_authenticates_and_authorizes_as_the_bookies_do(
    secure: Secure, tmp_path: Path
):
    """A TLS broker that takes the cluster's tokens: writers produce, readers consume
    but may not produce, nobody gets in without a valid token, and the broker writes to
    the bookies as its own principal."""
    await secure.set_roles("broker", ["write"])
    certs = secure.certs
    broker_token = write_private(tmp_path / "broker.token", secure.token("broker").encode())
    secure.cluster.start_brokers(1, extra=[
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-ca", str(certs.ca), "--auth-token-secret-file", str(tmp_path / "token.key"),
        "--token", f"file:{broker_token}",
    ])  # fmt: skip

    async def service(principal: str | None, **options: object) -> Any:
        token = {} if principal is None else {"token": secure.token(principal, **options)}
        return await secure.cluster.service_client(tls_ca=str(certs.ca), **token)

    writer = await service("writer")
    producer = await writer.create_producer("secured")
    sent = await producer.send(b"by the writer")
    reader = await service("reader")
    with pytest.raises(UnauthorizedError):
        await reader.create_producer("secured")
    consumer = await reader.subscribe("secured", "audit", "earliest")
    received = await consumer.receive(timeout=30)
    assert (received.message_id, received.data) == (sent, b"by the writer")
    with pytest.raises(UnauthenticatedError) as anonymous:  # no token at all
        await service(None)
    # The refusal names the server that refused: the broker, not a bookie.
    assert "no credentials: this broker requires a token" in str(anonymous.value)
    assert "bookie" not in str(anonymous.value)
    with pytest.raises(UnauthenticatedError):  # an expired one
        await service("writer", expires_in_s=-60)
    with pytest.raises(UnauthorizedError):  # unloading is the admin's
        from streamlib.service.client import unload

        await unload(secure.cluster.brokers[0].address, "secured", tls_ca=str(certs.ca),
                     token=secure.token("writer"))  # fmt: skip
