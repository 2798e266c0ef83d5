"""Who may read and change the metadata: ZooKeeper identities and ACLs, where the
credentials come from (never a command line), TLS to ZooKeeper, and the sqlite file's
permissions. Real servers and real files throughout."""

from __future__ import annotations

import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import metadata
from metadata import Create
from metadata.uri import credentials_in_uri, redact_uri
from streamlib.security import CertFiles, make_certs
from tests.metadata.zk_tls import TlsZooKeeperServer

ALICE = "auth=digest:alice:alice-secret"
BOB = "auth=digest:bob:bob-secret"
UNREACHABLE = "zk://127.0.0.1:1/x"
# A refused TLS connection must fail within the connect timeout, plus kazoo's stop.
REFUSED_WITHIN_S = 10.0


@pytest.fixture
def chroot_uri(zookeeper) -> str:
    return f"zk://{zookeeper.hosts}/security-{uuid.uuid4().hex[:12]}"


def mode_of(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- ACLs: the writer's identity changes, everyone reads -------------------------------


async def test_other_identities_read_a_writers_nodes_but_cannot_change_them(chroot_uri):
    async with await metadata.connect(f"{chroot_uri}?{ALICE}") as alice:
        await alice.create("/ledgers/00/0001", b"ledger 1", make_parents=True)
        await alice.transaction([Create("/streams"), Create("/streams/s1", b"cursor")])
        await alice.create("/bookies/b1", b"10.0.0.1:3181", ephemeral=True, make_parents=True)
        async with (
            await metadata.connect(f"{chroot_uri}?{BOB}") as bob,
            await metadata.connect(chroot_uri) as anonymous,
        ):
            for reader in (bob, anonymous):
                assert (await reader.get("/ledgers/00/0001")).data == b"ledger 1"
                assert await reader.children("/streams") == ["s1"]
                assert await reader.children("/bookies") == ["b1"]
                with pytest.raises(metadata.AuthFailedError):
                    await reader.set("/ledgers/00/0001", b"forged")
                with pytest.raises(metadata.AuthFailedError):
                    await reader.delete("/streams/s1")
                # Parents made by make_parents, and the chroot itself, are guarded too.
                with pytest.raises(metadata.AuthFailedError):
                    await reader.create("/ledgers/00/0002", b"planted")
                with pytest.raises(metadata.AuthFailedError):
                    await reader.create("/planted")
        assert await alice.set("/ledgers/00/0001", b"ledger 1 closed") == 1


async def test_a_private_node_is_readable_by_its_identity_alone(chroot_uri):
    async with await metadata.connect(f"{chroot_uri}?{ALICE}") as alice:
        await alice.create("/keys/k1", b"secret 1", make_parents=True, private=True)
        await alice.transaction(
            [Create("/keys/more/k2", b"secret 2", make_parents=True, private=True)]
        )
        async with (
            await metadata.connect(f"{chroot_uri}?{BOB}") as bob,
            await metadata.connect(chroot_uri) as anonymous,
        ):
            for reader in (bob, anonymous):
                for path in ("/keys/k1", "/keys/more/k2"):
                    with pytest.raises(metadata.AuthFailedError, match="STREAMLIB_ZK_AUTH"):
                        await reader.get(path)
                # The parents made for private nodes are ordinary, readable ones.
                assert await reader.children("/keys") == ["k1", "more"]
        assert (await alice.get("/keys/more/k2")).data == b"secret 2"


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_private_is_accepted_where_the_store_has_no_acls(backend, tmp_path):
    uri = "memory://private" if backend == "memory" else f"sqlite://{tmp_path}/meta.db"
    async with await metadata.connect(uri) as store:
        await store.create("/a/b", b"x", make_parents=True, private=True)
        await store.transaction([Create("/a/c", b"y", private=True)])
        assert (await store.get("/a/c")).data == b"y"


# -- credentials: from a file or the environment, never the command line ---------------


async def test_credentials_from_an_auth_file_make_the_identity(chroot_uri, tmp_path):
    auth_file = tmp_path / "zk.auth"
    auth_file.write_text("digest:alice:alice-secret\n")
    async with await metadata.connect(f"{chroot_uri}?auth_file={auth_file}") as store:
        await store.create("/n", b"mine")
    async with await metadata.connect(chroot_uri) as anonymous:
        with pytest.raises(metadata.AuthFailedError):
            await anonymous.set("/n", b"forged")
    async with await metadata.connect(f"{chroot_uri}?{ALICE}") as alice:
        assert await alice.set("/n", b"still mine") == 1


async def test_credentials_from_the_environment_when_the_uri_names_none(
    chroot_uri, tmp_path, monkeypatch
):
    monkeypatch.setenv("STREAMLIB_ZK_AUTH", "digest:bob:bob-secret")
    async with await metadata.connect(chroot_uri) as store:
        await store.create("/n", b"bob's")
    # A URI that names credentials wins over the environment.
    auth_file = tmp_path / "zk.auth"
    auth_file.write_text("digest:alice:alice-secret")
    async with await metadata.connect(f"{chroot_uri}-alice?auth_file={auth_file}") as store:
        await store.create("/n", b"alice's")
    monkeypatch.delenv("STREAMLIB_ZK_AUTH")
    async with await metadata.connect(f"{chroot_uri}?{ALICE}") as alice:
        with pytest.raises(metadata.AuthFailedError):
            await alice.set("/n", b"forged")
    async with await metadata.connect(f"{chroot_uri}?{BOB}") as bob:
        assert await bob.set("/n", b"ok") == 1
    async with await metadata.connect(f"{chroot_uri}-alice?{ALICE}") as alice:
        assert await alice.set("/n", b"ok") == 1


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"alice:alice-secret\n",
        b"digest:alice\n",
        b"sasl:alice:alice-secret\n",
        b"digest:alice:alice-secret\ndigest:bob:bob-secret\n",
        b"digest:alice:\xff\xfe-secret\n",
        b"digest:alice:" + b"x" * 5000,
    ],
    ids=["empty", "no-scheme", "no-password", "not-digest", "two-lines", "not-utf8", "huge"],
)
async def test_a_malformed_auth_file_is_refused_without_quoting_it(tmp_path, content):
    auth_file = tmp_path / "zk.auth"
    auth_file.write_bytes(content)
    with pytest.raises(metadata.InvalidURIError, match="malformed") as refused:
        await metadata.connect(f"{UNREACHABLE}?auth_file={auth_file}")
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize("name", ["missing", "a-directory"])
async def test_an_unreadable_auth_file_is_refused(tmp_path, name):
    (tmp_path / "a-directory").mkdir()
    with pytest.raises(metadata.InvalidURIError, match="cannot read it"):
        await metadata.connect(f"{UNREACHABLE}?auth_file={tmp_path / name}")


async def test_malformed_credentials_in_the_environment_are_refused(monkeypatch):
    monkeypatch.setenv("STREAMLIB_ZK_AUTH", "alice:alice-secret")
    with pytest.raises(metadata.InvalidValueError, match="STREAMLIB_ZK_AUTH") as refused:
        await metadata.connect(UNREACHABLE)
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(
    "query",
    [
        f"{ALICE}&auth_file=/etc/zk.auth",
        "auth_file=relative/zk.auth",
        "tsl=true",
        "tls=yes",
        "connect_timeout_s=soon",
    ],
)
async def test_zk_uri_options_that_cannot_mean_what_was_meant_are_refused(query):
    with pytest.raises(metadata.InvalidURIError) as refused:
        await metadata.connect(f"{UNREACHABLE}?{query}")
    assert "alice-secret" not in str(refused.value)


@pytest.mark.parametrize(
    "uri, inline",
    [
        ("zk://h:2181/c?auth=digest:u:p", True),
        ("zk://h:2181/c?tls=true&auth=digest:u:", True),
        ("zk://h:2181/c?%61uth=digest:u:p", True),  # what parse_uri reads as auth
        ("zk://h:2181/c?auth_file=/etc/streamlib/zk.auth", False),
        ("zk://h:2181/c", False),
        ("zk://h:2181/c#auth=digest:u:p", False),  # a fragment is not an option
        ("sqlite:///var/lib/meta.db", False),
    ],
)
def test_credentials_in_uri_tells_a_cli_to_refuse_an_inline_password(uri, inline):
    assert credentials_in_uri(uri) is inline
    if inline:
        assert ":p" not in redact_uri(uri).partition("?")[2]


# -- TLS to a real ZooKeeper -------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    # The server certificate names localhost only, so that dialling 127.0.0.1 shows
    # whether the client checks the name.
    return make_certs(tmp_path_factory.mktemp("zk-certs"), server_hosts=("localhost",))


@pytest.fixture(scope="module")
def tls_zookeeper(
    tmp_path_factory: pytest.TempPathFactory, tls_certs: CertFiles
) -> Iterator[TlsZooKeeperServer]:
    server = TlsZooKeeperServer(tmp_path_factory.mktemp("zookeeper-tls"), tls_certs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def tls_options(certs: CertFiles) -> dict[str, object]:
    return {
        "tls_ca": str(certs.ca),
        "tls_cert": str(certs.client_cert),
        "tls_key": str(certs.client_key),
        "connect_timeout_s": 1.5,
    }


async def test_a_store_speaks_mutual_tls_to_zookeeper(tls_zookeeper, tls_certs, monkeypatch):
    chroot = f"/tls-{uuid.uuid4().hex[:12]}"
    uri = f"zk://{tls_zookeeper.secure_hosts}{chroot}?tls=true&{ALICE}"
    async with await metadata.connect(uri, **tls_options(tls_certs)) as alice:
        await alice.create("/ledgers/1", b"over TLS", make_parents=True)
        # The files from the environment this time.
        monkeypatch.setenv("STREAMLIB_ZK_TLS_CA", str(tls_certs.ca))
        monkeypatch.setenv("STREAMLIB_ZK_TLS_CERT", str(tls_certs.client_cert))
        monkeypatch.setenv("STREAMLIB_ZK_TLS_KEY", str(tls_certs.client_key))
        anonymous_uri = f"zk://{tls_zookeeper.secure_hosts}{chroot}?tls=true"
        async with await metadata.connect(anonymous_uri) as anonymous:
            assert (await anonymous.get("/ledgers/1")).data == b"over TLS"
            with pytest.raises(metadata.AuthFailedError):
                await anonymous.set("/ledgers/1", b"forged")


async def refused(uri: str, **options: object) -> str:
    started = time.monotonic()
    with pytest.raises(metadata.ConnectionLossError) as failure:
        await metadata.connect(uri, **options)  # type: ignore[arg-type]
    assert time.monotonic() - started < REFUSED_WITHIN_S
    return str(failure.value)


async def test_a_server_our_ca_did_not_sign_is_refused(tls_zookeeper, tmp_path):
    strangers = make_certs(tmp_path / "other-ca", ca_name="some other CA")
    uri = f"zk://{tls_zookeeper.secure_hosts}/x?tls=true"
    assert "tls_ca" in await refused(uri, **tls_options(strangers))


async def test_a_certificate_that_does_not_name_the_dialled_host_is_refused(
    tls_zookeeper, tls_certs
):
    # Same server, same trusted CA; its certificate names localhost, not 127.0.0.1.
    uri = f"zk://127.0.0.1:{tls_zookeeper.secure_port}/x?tls=true"
    await refused(uri, **tls_options(tls_certs))


async def test_a_client_without_a_certificate_is_refused_by_mutual_tls(tls_zookeeper, tls_certs):
    uri = f"zk://{tls_zookeeper.secure_hosts}/x?tls=true"
    await refused(uri, tls_ca=str(tls_certs.ca), connect_timeout_s=1.5)


async def test_tls_against_a_plaintext_port_fails_cleanly(tls_zookeeper, tls_certs):
    message = await refused(f"zk://{tls_zookeeper.hosts}/x?tls=true", **tls_options(tls_certs))
    assert "secureClientPort" in message


async def test_plaintext_against_the_tls_port_fails_cleanly(tls_zookeeper):
    await refused(f"zk://{tls_zookeeper.secure_hosts}/x", connect_timeout_s=1.5)


async def test_unusable_tls_settings_are_typed_errors_before_connecting(tls_certs, tmp_path):
    tls_uri = f"{UNREACHABLE}?tls=true"
    with pytest.raises(metadata.InvalidValueError, match="tls_ca"):
        await metadata.connect(tls_uri, tls_ca=str(tmp_path / "missing.pem"))
    with pytest.raises(metadata.InvalidValueError, match="together"):
        await metadata.connect(tls_uri, tls_cert=str(tls_certs.client_cert))
    with pytest.raises(metadata.InvalidValueError, match="tls_key"):
        await metadata.connect(
            tls_uri, tls_cert=str(tls_certs.client_cert), tls_key=str(tls_certs.server_key)
        )
    with pytest.raises(metadata.InvalidValueError, match="tls=true"):
        await metadata.connect(UNREACHABLE, tls_ca=str(tls_certs.ca))


# -- sqlite: the database file is its owner's alone ---------------------------------------


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """umask 0: a file made without an explicit mode would come out 0666."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


async def test_sqlite_files_are_created_for_their_owner_only(tmp_path, permissive_umask):
    db = tmp_path / "meta.db"
    async with await metadata.connect(f"sqlite://{db}") as store:
        await store.create("/ledgers/1", b"metadata", make_parents=True)
        for path in (db, f"{db}-wal", f"{db}-shm"):
            assert mode_of(path) == 0o600, path


async def test_an_existing_sqlite_store_open_to_others_is_narrowed(tmp_path):
    db = tmp_path / "meta.db"
    async with await metadata.connect(f"sqlite://{db}") as first:
        await first.create("/n", b"kept")
        for path in (db, f"{db}-wal", f"{db}-shm"):
            os.chmod(path, 0o644)  # as an older version left them, under umask 022
        async with await metadata.connect(f"sqlite://{db}") as second:
            assert (await second.get("/n")).data == b"kept"
            for path in (db, f"{db}-wal", f"{db}-shm"):
                assert mode_of(path) == 0o600, path
