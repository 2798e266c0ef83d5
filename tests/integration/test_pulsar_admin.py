"""The broker's Pulsar admin REST port (streamlib/broker/pulsar_admin.py) on real
processes, driven as pulsar-admin drives Pulsar's: topics and partitioned topics
created, listed and deleted, stats after producing, subscriptions created, reset and
deleted, deduplication and lookups -- and bad names, bad requests, HTTP junk, and
callers without credentials or roles, each answered with Pulsar's status code and a
{"reason": ...}, the broker serving on. The HTTP server's own bounds (slow clients,
too many connections) are checked in-process, with short limits."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import metadata
from metadata.services.brokers import BrokerRegistry
from streamlib.broker.http_server import HttpServer, Limits, Request, Response
from streamlib.broker.launcher import BrokerProcess
from streamlib.cli import _build_parser
from streamlib.security import write_private
from tests.integration.conftest import LedgerCluster
from tests.integration.test_auth import Secure, secure  # noqa: F401 - (the fixture)

pytestmark = pytest.mark.timeout(120)

ADMIN = ["--pulsar-admin-port", "0"]
V2 = "/admin/v2/persistent/public/default"


class Admin:
    """pulsar-admin's calls on one broker's admin port (urllib, off the event loop)."""

    def __init__(self, url: str, token: str | None = None, ca: Path | None = None) -> None:
        self.url = url
        self.token = token
        self.context = ssl.create_default_context(cafile=str(ca)) if ca else None

    def _call(self, method: str, path: str, body: Any = None, raw: bytes | None = None):
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        url = self.url + path
        for _ in range(3):  # (a 307 to the topic's owner is followed, as pulsar-admin does)
            request = urllib.request.Request(url, data=data, method=method)
            if data is not None:
                request.add_header("Content-Type", "application/json")
            if self.token is not None:
                request.add_header("Authorization", f"Bearer {self.token}")
            try:
                with urllib.request.urlopen(request, timeout=30, context=self.context) as answer:
                    return answer.status, _decoded(answer.read())
            except urllib.error.HTTPError as error:
                if error.code != 307:
                    return error.code, _decoded(error.read())
                url = error.headers["Location"]
        raise AssertionError(f"redirected too often: {method} {path}")

    async def __call__(self, method: str, path: str, body: Any = None, raw: bytes | None = None):
        return await asyncio.to_thread(self._call, method, path, body, raw)

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self(method, path, body)
        assert status in (200, 204), (method, path, status, answer)
        return answer

    async def refused(
        self, status: int, method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> str:
        got, answer = await self(method, path, body, raw)
        assert got == status, (method, path, got, answer)
        assert isinstance(answer, dict) and answer["reason"], answer  # (never a traceback)
        assert "Traceback" not in answer["reason"]
        return str(answer["reason"])


def _decoded(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return data.decode()


async def registered(cluster: LedgerCluster, broker: BrokerProcess) -> Any:
    """The broker's registration (its http_url: where its admin port is)."""
    async with await metadata.connect(cluster.metadata_uri) as store:
        return next(
            b for b in await BrokerRegistry(store).live() if b.broker_id == broker.broker_id
        )


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.05)


async def admin_of(cluster: LedgerCluster, broker: BrokerProcess, **options: Any) -> Admin:
    return Admin((await registered(cluster, broker)).http_url, **options)


async def test_topics_and_partitioned_topics_are_created_listed_and_deleted(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=ADMIN, pulsar=True)  # (lookups name its port)
    admin = await admin_of(cluster, broker)
    assert await admin.ok("GET", "/admin/v2/clusters") == ["streamlib"]
    assert await admin.ok("GET", "/admin/v2/tenants") == ["public"]
    assert await admin.ok("GET", "/admin/v2/namespaces/public") == ["public/default"]
    assert await admin.ok("GET", V2) == []

    assert await admin.ok("PUT", f"{V2}/plain") is None  # 204
    await admin.refused(409, "PUT", f"{V2}/plain")
    assert await admin.ok("GET", f"{V2}/plain/partitions") == {
        "partitions": 0, "properties": {}, "deleted": False}  # fmt: skip
    await admin.ok("PUT", f"{V2}/parts/partitions", 3)
    await admin.refused(409, "PUT", f"{V2}/parts/partitions", 2)
    assert (await admin.ok("GET", f"{V2}/parts/partitions"))["partitions"] == 3
    assert await admin.ok("GET", V2) == [
        "persistent://public/default/parts-partition-0",
        "persistent://public/default/parts-partition-1",
        "persistent://public/default/parts-partition-2",
        "persistent://public/default/plain",
    ]  # (as Pulsar lists them: partitions, not the partitioned topic's name)
    assert await admin.ok("GET", f"{V2}/partitioned") == ["persistent://public/default/parts"]
    assert await admin.ok("GET", "/admin/v2/namespaces/public/default/topics") == await admin.ok(
        "GET", V2)  # fmt: skip
    parts = await admin.ok("GET", f"{V2}/parts/partitioned-stats")
    assert parts["metadata"] == {"partitions": 3} and len(parts["partitions"]) == 3
    await admin.refused(404, "GET", f"{V2}/parts/stats")  # (its partitions have stats)
    await admin.ok("PUT", "/admin/v2/persistent/acme/orders/t1")
    assert await admin.ok("GET", "/admin/v2/tenants") == ["acme", "public"]
    assert await admin.ok("GET", "/admin/v2/namespaces/acme") == ["acme/orders"]
    assert await admin.ok("GET", "/admin/v2/persistent/acme/orders") == [
        "persistent://acme/orders/t1"]  # fmt: skip
    await admin.refused(404, "GET", "/admin/v2/persistent/acme/nothing")
    await admin.refused(404, "GET", "/admin/v2/namespaces/nobody")

    # Names, numbers and topics that are not there.
    await admin.refused(412, "PUT", f"{V2}/bad%20name")
    await admin.refused(412, "PUT", f"{V2}/x-partition-1/partitions", 2)
    await admin.refused(406, "PUT", f"{V2}/zero/partitions", 0)
    await admin.refused(400, "PUT", f"{V2}/junk/partitions", raw=b"{not json")
    await admin.refused(404, "GET", f"{V2}/missing/partitions")
    assert await admin.ok("GET", f"{V2}/missing/partitions?checkAllowAutoCreation=true") == {
        "partitions": 0, "properties": {}, "deleted": False}  # fmt: skip
    assert "cannot add partitions" in await admin.refused(405, "POST", f"{V2}/parts/partitions", 4)
    await admin.refused(405, "DELETE", f"{V2}/parts")  # (a partitioned one: .../partitions)
    await admin.refused(404, "DELETE", f"{V2}/plain/partitions")
    await admin.refused(404, "GET", "/admin/v2/no/such/thing")
    await admin.refused(405, "POST", "/admin/v2/clusters")

    # Deduplication is always on; compaction runs in the background (then its status).
    assert await admin.ok("GET", "/admin/v2/namespaces/public/default/deduplication") is True
    await admin.ok("POST", "/admin/v2/namespaces/public/default/deduplication", True)
    assert "always" in await admin.refused(
        412, "POST", "/admin/v2/namespaces/public/default/deduplication", False)  # fmt: skip
    assert (await admin.ok("GET", f"{V2}/plain/compaction"))["status"] == "NOT_RUN"
    await admin.ok("PUT", f"{V2}/plain/compaction")

    async def compacted() -> bool:
        return (await admin.ok("GET", f"{V2}/plain/compaction"))["status"] == "SUCCESS"

    await eventually(compacted)
    await admin.ok("PUT", f"{V2}/parts/compaction")  # (each partition)
    await admin.refused(404, "GET", f"{V2}/parts/compaction")  # (its partitions have one)
    await admin.refused(404, "PUT", f"{V2}/missing/compaction")

    assert await admin.ok("GET", f"{V2}/plain/deduplicationEnabled") is True
    assert await admin.ok("GET", "/admin/v2/brokers/health") == "ok"
    assert await admin.ok("GET", "/status.html") == "OK"

    # Lookups answer with the owner's URLs.
    me = await registered(cluster, broker)
    assert await admin.ok("GET", "/admin/v2/brokers/streamlib") == [
        me.http_url.removeprefix("http://")]  # fmt: skip
    found = await admin.ok("GET", "/lookup/v2/topic/persistent/public/default/plain")
    assert found["httpUrl"] == me.http_url and me.http_url.startswith("http://127.0.0.1:")
    assert found["brokerUrl"] == found["nativeUrl"] == me.pulsar_url == broker.pulsar_url
    for name in ("parts", "not-yet"):  # (a partitioned one's name; one to be created)
        found = await admin.ok("GET", f"/lookup/v2/topic/persistent/public/default/{name}")
        assert found["httpUrl"] == me.http_url

    # A partitioned topic's subscription is each partition's.
    await admin.ok("PUT", f"{V2}/parts/subscription/each")
    assert await admin.ok("GET", f"{V2}/parts/subscriptions") == ["each"]
    assert await admin.ok("GET", f"{V2}/parts-partition-1/subscriptions") == ["each"]
    await admin.ok("POST", f"{V2}/parts/subscription/each/resetcursor/0")
    await admin.refused(405, "POST", f"{V2}/parts/subscription/each/resetcursor",
                        {"ledgerId": -1, "entryId": -1})  # fmt: skip
    await admin.ok("DELETE", f"{V2}/parts/subscription/each")
    assert await admin.ok("GET", f"{V2}/parts-partition-2/subscriptions") == []

    await admin.ok("DELETE", f"{V2}/plain")
    await admin.refused(404, "DELETE", f"{V2}/plain")
    await admin.ok("DELETE", f"{V2}/parts/partitions")
    await admin.refused(404, "DELETE", f"{V2}/parts/partitions")
    assert await admin.ok("GET", V2) == []


async def test_stats_subscriptions_and_cursor_resets_after_producing(cluster):
    cluster.start_bookies(3)
    first, second = cluster.start_brokers(2, extra=ADMIN)
    client = await cluster.service_client()
    producer = await client.create_producer("orders", producer_name="shop",
                                            batching_max_messages=1)  # fmt: skip
    sent = [await producer.send(b"%d" % i) for i in range(10)]
    consumer = await client.subscribe("orders", "audit", "earliest")
    assert (await consumer.receive(timeout=30)).message_id == sent[0]
    async with await metadata.connect(cluster.metadata_uri) as store:
        owner_id = (await BrokerRegistry(store).owner("orders")).broker_id
    owner, other = (first, second) if owner_id == first.broker_id else (second, first)
    admin = await admin_of(cluster, other)  # (redirected to the owner, and followed)

    stats = await admin.ok("GET", f"{V2}/orders/stats")
    assert [p["producerName"] for p in stats["publishers"]] == ["shop"]
    assert stats["ownerBroker"] == owner.broker_id
    assert stats["storageSize"] >= 0 and stats["msgRateIn"] == 0.0
    audit = stats["subscriptions"]["audit"]
    assert audit["type"] == "Exclusive" and len(audit["consumers"]) == 1
    assert audit["msgBacklog"] == 10  # (nothing acknowledged yet)
    internal = await admin.ok("GET", f"{V2}/orders/internalStats")
    assert internal["numberOfEntries"] == 10 and internal["ledgers"]
    assert set(internal["cursors"]) == {"audit"}
    await admin.refused(412, "DELETE", f"{V2}/orders/subscription/audit")  # (connected)
    await admin.refused(412, "DELETE", f"{V2}/orders")  # (a producer, a consumer)

    # Subscriptions: created at the end (or a position), listed, reset, deleted.
    await admin.ok("PUT", f"{V2}/orders/subscription/late")
    await admin.refused(409, "PUT", f"{V2}/orders/subscription/late")
    await admin.ok("PUT", f"{V2}/orders/subscription/from-5",
                   {"ledgerId": sent[5].ledger_id, "entryId": sent[5].entry_id})  # fmt: skip
    assert await admin.ok("GET", f"{V2}/orders/subscriptions") == ["audit", "from-5", "late"]

    async def backlog(sub: str) -> int:
        stats = await admin.ok("GET", f"{V2}/orders/stats")
        return int(stats["subscriptions"][sub]["msgBacklog"])

    assert (await backlog("late"), await backlog("from-5")) == (0, 5)
    await admin.ok("POST", f"{V2}/orders/subscription/late/resetcursor",
                   {"ledgerId": -1, "entryId": -1})  # fmt: skip
    assert await backlog("late") == 10
    await admin.ok("POST", f"{V2}/orders/subscription/late/resetcursor/{2**62}")
    assert await backlog("late") == 0
    await admin.ok("POST", f"{V2}/orders/subscription/late/resetcursor/0")
    assert await backlog("late") == 10
    await admin.refused(404, "POST", f"{V2}/orders/subscription/none/resetcursor/0")
    await admin.refused(400, "POST", f"{V2}/orders/subscription/late/resetcursor", {"x": 1})
    await admin.ok("DELETE", f"{V2}/orders/subscription/late")
    await admin.refused(404, "DELETE", f"{V2}/orders/subscription/late")

    # A subscription with a consumer is reset by its owner (the consumer, disconnected,
    # resumes from there).
    await admin.ok("POST", f"{V2}/orders/subscription/audit/resetcursor",
                   {"ledgerId": sent[7].ledger_id, "entryId": sent[7].entry_id})  # fmt: skip
    assert await backlog("audit") == 3
    await consumer.close()

    async def unsubscribed() -> bool:
        status, _ = await admin("DELETE", f"{V2}/orders/subscription/audit")
        return status == 204

    await eventually(unsubscribed)  # (the owner lets its subscription go after the close)
    await producer.close()
    await admin.ok("DELETE", f"{V2}/orders?force=true")
    await admin.refused(404, "GET", f"{V2}/orders/stats")


async def test_pulsar_client_with_an_http_service_url_finds_the_broker_through_the_port(cluster):
    """pulsar-client given http://: partitions and lookups over this port, then Pulsar's
    binary protocol to the broker the lookup names."""
    import pulsar

    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=ADMIN, pulsar=True)
    url = (await registered(cluster, broker)).http_url

    def produce_and_consume() -> bytes:
        client = pulsar.Client(url, operation_timeout_seconds=30)
        try:
            topic = "persistent://public/default/over-http"
            consumer = client.subscribe(
                topic, "s", initial_position=pulsar.InitialPosition.Earliest
            )
            client.create_producer(topic).send(b"found over http")
            return bytes(consumer.receive(30_000).data())
        finally:
            client.close()

    assert await asyncio.to_thread(produce_and_consume) == b"found over http"


async def test_bad_requests_are_answered_and_the_broker_serves_on(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=ADMIN)
    admin = await admin_of(cluster, broker)
    host, port = admin.url.removeprefix("http://").rsplit(":", 1)
    huge = b"1" * (2 << 20)
    assert (await admin("PUT", f"{V2}/big/partitions", raw=huge))[0] == 413

    def raw(data: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            return b"".join(iter(lambda: sock.recv(65536), b""))

    for junk in (b"\x16\x03\x01\x00\xa5garbage\r\n\r\n", b"GET\r\n\r\n", b"GET / FTP/9\r\n\r\n",
                 b"GET /admin/v2/clusters HTTP/1.1\r\nno colon here\r\n\r\n",
                 b"PUT /x HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                 b"GET /admin/v2/clusters HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
                 b"GET /admin/v2/clusters HTTP/1.1\r\nX: " + b"a" * 40000 + b"\r\n\r\n"):  # fmt: skip
        answer = await asyncio.to_thread(raw, junk)
        status = int(answer.split(b" ", 2)[1])
        assert status in (400, 431), (junk[:40], answer[:200])
        assert b"Traceback" not in answer
    # Chunked bodies, as some HTTP clients send them, are read.
    chunked = (b"PUT " + V2.encode() + b"/chunky/partitions HTTP/1.1\r\nHost: x\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n1\r\n2\r\n0\r\n\r\n")  # fmt: skip
    assert (await asyncio.to_thread(raw, chunked)).startswith(b"HTTP/1.1 204")
    assert (await admin.ok("GET", f"{V2}/chunky/partitions"))["partitions"] == 2
    assert await admin.ok("GET", "/admin/v2/clusters") == ["streamlib"]  # still serving


async def test_callers_are_authenticated_and_authorized_as_on_the_grpc_port(
    secure: Secure,  # noqa: F811
    tmp_path: Path,
):
    """A TLS broker taking the cluster's tokens serves HTTPS: no token is 401, a reader
    may look but not create or delete (403), the admin role may."""
    await secure.set_roles("broker", ["write"])
    certs = secure.certs
    token_file = write_private(tmp_path / "broker.token", secure.token("broker").encode())
    [broker] = secure.cluster.start_brokers(1, extra=[
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-ca", str(certs.ca), "--auth-token-secret-file", str(tmp_path / "token.key"),
        "--token", f"file:{token_file}", *ADMIN,
    ])  # fmt: skip
    url = (await registered(secure.cluster, broker)).http_url
    assert url.startswith("https://")

    def admin(principal: str | None, **claims: Any) -> Admin:
        token = None if principal is None else secure.token(principal, **claims)
        return Admin(url, token=token, ca=certs.ca)

    assert "no credentials" in await admin(None).refused(401, "GET", "/admin/v2/clusters")
    await admin("writer", expires_in_s=-60).refused(401, "GET", V2)
    await admin("ops").ok("PUT", f"{V2}/guarded")
    reader = admin("reader")
    assert await reader.ok("GET", V2) == ["persistent://public/default/guarded"]
    assert await reader.ok("GET", f"{V2}/guarded/stats")
    for method, path in (("PUT", f"{V2}/other"), ("DELETE", f"{V2}/guarded"),
                         ("PUT", f"{V2}/guarded/compaction")):  # fmt: skip
        assert "may not administer" in await reader.refused(403, method, path)
    await admin("writer").refused(403, "DELETE", f"{V2}/guarded")
    await admin("writer").ok("PUT", f"{V2}/guarded/subscription/mine")
    await reader.refused(403, "DELETE", f"{V2}/guarded/subscription/mine")
    await admin("bookie-only").refused(403, "GET", V2)  # (no role at all)
    # A reader's lookup of a topic that is not there: it may not have it created.
    await reader.refused(404, "GET", "/lookup/v2/topic/persistent/public/default/nothing")
    assert (await admin("writer").ok("GET", "/lookup/v2/topic/persistent/public/default/"
                                     "nothing"))["httpUrl"] == url  # fmt: skip
    assert await reader.ok("GET", f"{V2}/guarded/subscriptions") == ["mine"]  # unchanged
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # HTTP on the HTTPS port
        Admin(url.replace("https://", "http://"), token=secure.token("ops"))._call("GET", V2)


def test_the_bare_flag_means_pulsars_port_and_the_broker_prints_where_it_serves(cluster):
    parse = _build_parser().parse_args
    assert parse(["broker", "--metadata", "x", "--pulsar-admin-port"]).pulsar_admin_port == 8080
    assert parse(["broker", "--metadata", "x"]).pulsar_admin_port is None
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlib", "broker", "--metadata", cluster.metadata_uri,
         "--port", "0", "--exit-with-stdin", *ADMIN],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("broker ")
        line = proc.stdout.readline().strip()
        assert line.startswith("pulsar admin listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1]
        assert Admin(url)._call("GET", "/admin/v2/clusters") == (200, ["streamlib"])
    finally:
        proc.kill()
        proc.wait()


async def test_slow_clients_time_out_and_connections_are_bounded():
    async def handler(request: Request) -> Response:
        return Response(200, b'"ok"')

    server = HttpServer(handler, limits=Limits(max_connections=2, head_timeout_s=0.5))
    port = await server.bind("127.0.0.1", 0)
    await server.serve()
    try:
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        idle[0][1].write(b"GET / HTTP/1.1\r\n")  # (and nothing more)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        async with asyncio.timeout(10):
            assert (await reader.read()).startswith(b"HTTP/1.1 503")  # (a third: refused)
            for slow_reader, slow_writer in idle:  # the slow ones: answered 408
                assert (await slow_reader.read()).startswith(b"HTTP/1.1 408")
                slow_writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        async with asyncio.timeout(10):
            assert (await reader.read()).endswith(b'\r\n\r\n"ok"')  # (room again)
        writer.close()
    finally:
        await server.close()
