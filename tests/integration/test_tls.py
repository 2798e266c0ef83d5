"""TLS on the bookie's gRPC port, and mutual TLS (bookie serve --tls-*; the client's
tls_ca / tls_cert / tls_key). Certificates come from tests/tls_certs.py."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

import metadata
from bookie.cli import main as bookie_main
from bookie.launcher import BookieProcess
from bookie.server import BookieConfig
from metadata.services.principals import PrincipalRoles
from streamlib.client import Client
from streamlib.errors import BookieUnavailableError, TlsError
from streamlib.ledger.bookie_client import BookieClientConfig
from streamlib.security import CertFiles, make_certs
from tests.integration.conftest import FAST_CLIENT, LedgerCluster


@pytest.fixture
def certs(tmp_path: Path) -> CertFiles:
    return make_certs(tmp_path / "certs")


def tls_flags(certs: CertFiles, *, client_auth: bool = False) -> list[str]:
    flags = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    if client_auth:
        flags += ["--tls-ca", str(certs.ca), "--tls-client-auth"]
    return flags


async def closed_ledger(client: Client) -> int:
    """A ledger of three entries on the one bookie, written and closed by client."""
    writer = await client.ledgers.create(ensemble=1, write_quorum=1, ack_quorum=1)
    await writer.append_many([b"a", b"b", b"c"])
    await writer.close()
    return writer.ledger_id


async def assert_told(client: Client, ledger_id: int, *fragments: str) -> None:
    """client can neither create a ledger on the one bookie nor read the closed ledger
    ledger_id, and both say why in TLS words: a TlsError (still a BookieUnavailableError,
    as for one bookie another may do) whose message holds fragments."""
    with pytest.raises(TlsError) as created:
        await client.ledgers.create(ensemble=1, write_quorum=1, ack_quorum=1)
    reader = await client.ledgers.open(ledger_id)  # closed: its metadata is enough
    with pytest.raises(TlsError) as read:
        await reader.read(0, 2)
    for error in (created.value, read.value):
        assert isinstance(error, BookieUnavailableError)
        for fragment in fragments:
            assert fragment in str(error), error


async def test_client_trusting_the_ca_writes_and_reads_over_tls(cluster: LedgerCluster, certs):
    cluster.start_bookies(1, extra=tls_flags(certs))
    client = await cluster.client(tls_ca=str(certs.ca))
    writer = await client.ledgers.create(ensemble=1, write_quorum=1, ack_quorum=1)
    assert await writer.append_many([b"a", b"b", b"c"]) == [0, 1, 2]
    await writer.close()
    reader = await client.ledgers.open(writer.ledger_id)
    assert await reader.read(0, 2) == [b"a", b"b", b"c"]


@pytest.mark.timeout(60)
async def test_a_plaintext_client_is_told_the_bookie_speaks_tls(cluster: LedgerCluster, certs):
    [bookie] = cluster.start_bookies(1, extra=tls_flags(certs))
    trusted = await cluster.client(tls_ca=str(certs.ca))
    ledger_id = await closed_ledger(trusted)
    plaintext = await cluster.client()
    await assert_told(plaintext, ledger_id, f"{bookie.address} speaks TLS", "tls_ca=")
    # Recovering a live writer's ledger says so too, before it marks anything.
    live = await trusted.ledgers.create(ensemble=1, write_quorum=1, ack_quorum=1)
    with pytest.raises(TlsError, match="speaks TLS"):
        await plaintext.ledgers.open(live.ledger_id)
    assert (await trusted.ledgers.metadata(live.ledger_id)).state.name == "OPEN"
    assert await live.append(b"still the writer's") == 0


@pytest.mark.timeout(60)
async def test_a_client_trusting_another_ca_is_told_the_certificate_is_not_trusted(
    cluster: LedgerCluster, certs, tmp_path
):
    [bookie] = cluster.start_bookies(1, extra=tls_flags(certs))
    ledger_id = await closed_ledger(await cluster.client(tls_ca=str(certs.ca)))
    other = make_certs(tmp_path / "other", ca_name="another CA")
    client = await cluster.client(tls_ca=str(other.ca))
    await assert_told(
        client, ledger_id, f"TLS handshake with bookie {bookie.bookie_id} at {bookie.address}",
        f"not trusted by tls_ca={other.ca}",
    )  # fmt: skip


@pytest.mark.timeout(60)
async def test_a_tls_client_is_told_the_bookie_does_not_speak_tls(cluster: LedgerCluster, certs):
    [bookie] = cluster.start_bookies(1)
    ledger_id = await closed_ledger(await cluster.client())
    client = await cluster.client(tls_ca=str(certs.ca))
    await assert_told(client, ledger_id, f"{bookie.address} does not speak TLS")


@pytest.mark.timeout(60)
async def test_mutual_tls_needs_a_client_certificate(cluster: LedgerCluster, certs):
    # Under mutual TLS the certificate's common name is the principal (test_auth.py).
    async with await metadata.connect(cluster.metadata_uri) as store:
        await PrincipalRoles(store).grant("streamlib client", ["write"])
    cluster.start_bookies(1, extra=tls_flags(certs, client_auth=True))
    client = await cluster.client(
        tls_ca=str(certs.ca), tls_cert=str(certs.client_cert), tls_key=str(certs.client_key)
    )
    ledger_id = await closed_ledger(client)
    assert await (await client.ledgers.open(ledger_id)).read(0, 0) == [b"a"]
    anonymous = await cluster.client(tls_ca=str(certs.ca))
    await assert_told(anonymous, ledger_id, "client certificate (tls_cert / tls_key)")


@pytest.mark.timeout(60)
async def test_clients_of_a_tls_broker_are_told_what_is_wrong(
    cluster: LedgerCluster, certs, tmp_path
):
    [broker] = cluster.start_brokers(1, extra=tls_flags(certs))
    with pytest.raises(TlsError, match=f"broker at {broker.address} speaks TLS.*tls_ca="):
        await cluster.service_client()
    other = make_certs(tmp_path / "other", ca_name="another CA")
    with pytest.raises(TlsError, match=f"TLS handshake with the broker at {broker.address}"
                       f" failed: its certificate is not trusted by tls_ca={other.ca}"):  # fmt: skip
        await cluster.service_client(tls_ca=str(other.ca))
    await cluster.service_client(tls_ca=str(certs.ca))  # trusting its CA: in


def test_tls_files_default_to_the_environment(monkeypatch, certs):
    from streamlib.security import client_config

    monkeypatch.setenv("STREAMLIB_TLS_CA", str(certs.ca))
    monkeypatch.setenv("STREAMLIB_TLS_CERT", str(certs.client_cert))
    monkeypatch.setenv("STREAMLIB_TLS_KEY", str(certs.client_key))
    config = client_config(FAST_CLIENT)
    assert (config.tls_ca, config.tls_cert, config.tls_key) == (
        str(certs.ca),
        str(certs.client_cert),
        str(certs.client_key),
    )
    assert config.add_timeout_s == FAST_CLIENT.add_timeout_s
    # An argument wins over the environment.
    assert client_config(None, tls_ca=str(certs.server_cert)).tls_ca == str(certs.server_cert)


def test_client_tls_settings_are_all_or_nothing(tmp_path):
    with pytest.raises(ValueError, match="tls_key"):
        BookieClientConfig(tls_ca="ca.pem", tls_cert="client.pem")
    with pytest.raises(ValueError, match="tls_ca"):
        BookieClientConfig(tls_cert="client.pem", tls_key="client.key")
    with pytest.raises(ValueError, match="cannot read"):
        BookieClientConfig(tls_ca=str(tmp_path / "missing.pem")).channel_credentials()


def test_bookie_tls_settings_are_all_or_nothing(tmp_path):
    d = tmp_path / "data"
    with pytest.raises(ValueError, match="--tls-key"):
        BookieConfig(data_dir=d, tls_cert=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="--tls-ca"):
        BookieConfig(
            data_dir=d, tls_cert=tmp_path / "c", tls_key=tmp_path / "k", tls_client_auth=True
        )


def test_bookie_with_an_unreadable_key_exits_with_a_clear_error(tmp_path, certs, capsys):
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--port", "0"]
    argv += ["--tls-cert", str(certs.server_cert), "--tls-key", str(tmp_path / "missing.key")]
    assert bookie_main(argv) == 1
    assert "cannot read the TLS key" in capsys.readouterr().err


@pytest.mark.timeout(60)
async def test_expired_certificates_are_refused_and_say_so(cluster: LedgerCluster, certs):
    # A bookie refuses to start with an expired certificate; one it re-reads (as when a
    # certificate expires under a running bookie) is served, and clients say why not.
    cluster.start_bookies(1, extra=tls_flags(certs))
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    expired = make_certs(certs.ca.parent, not_before=long_ago, valid_days=1)  # same files
    client = await cluster.client(tls_ca=str(expired.ca))
    with pytest.raises(TlsError, match=r"TLS handshake.*failed: its certificate has expired"):
        await client.ledgers.create(ensemble=1, write_quorum=1, ack_quorum=1)
    assert cluster.bookies[0].proc is not None and cluster.bookies[0].proc.poll() is None
    # (logged before it served the new certificate's first handshake)
    assert f"{expired.server_cert} expired at" in cluster.bookies[0].stderr_tail()


def certs_outside_their_validity(tmp_path: Path, when: str) -> CertFiles:
    """Certificates that expired a month ago, or become valid tomorrow."""
    now = datetime.datetime.now(datetime.UTC)
    start = now - datetime.timedelta(days=30) if when == "expired" else now + datetime.timedelta(1)
    return make_certs(tmp_path / when, not_before=start, valid_days=1)


def assert_names_the_certificate_and_its_dates(stderr: str, certs: CertFiles, when: str) -> None:
    cert = x509.load_pem_x509_certificate(certs.server_cert.read_bytes())
    utc = "%Y-%m-%d %H:%M:%S UTC"
    assert str(certs.server_cert) in stderr, stderr
    assert cert.not_valid_before_utc.strftime(utc) in stderr, stderr
    assert cert.not_valid_after_utc.strftime(utc) in stderr, stderr
    assert ("expired" if when == "expired" else "not valid yet") in stderr, stderr


@pytest.mark.parametrize("when", ["expired", "not_yet_valid"])
def test_a_bookie_refuses_to_start_with_a_certificate_outside_its_validity(tmp_path, when):
    certs = certs_outside_their_validity(tmp_path, when)
    bookie = BookieProcess(tmp_path / "data", extra=tls_flags(certs))
    code, stderr = bookie.run_to_exit(timeout_s=30)  # (it used to serve: a timeout)
    assert code == 1
    assert_names_the_certificate_and_its_dates(stderr, certs, when)


@pytest.mark.parametrize("when", ["expired", "not_yet_valid"])
def test_a_broker_refuses_to_start_with_a_certificate_outside_its_validity(tmp_path, when):
    certs = certs_outside_their_validity(tmp_path, when)
    broker = subprocess.run(
        [sys.executable, "-m", "streamlib", "broker", "--metadata",
         f"sqlite://{tmp_path / 'meta.db'}", "--port", "0", *tls_flags(certs)],
        capture_output=True, text=True, timeout=30,  # (it used to serve: a timeout)
    )  # fmt: skip
    assert broker.returncode == 1
    assert_names_the_certificate_and_its_dates(broker.stderr, certs, when)
