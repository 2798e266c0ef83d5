"""Security across hosts: bookies b1..b4 serve TLS only and authenticate tokens, the
metadata store's principal map gives the principals their roles, and clients on c1 / c2
hold only what their environment gives them (STREAMLIB_TLS_CA, STREAMLIB_TOKEN).

Figures are printed: run with -s to see them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from streamlib.security import CertFiles, make_certs, make_token, new_secret_key, write_private
from tests.multihost.conftest import BOOKIE_HOSTS, Cluster
from tests.multihost.hosts import Worker
from tests.multihost.test_partitions import (
    POLL_S,
    current_ensemble,
    ensembles,
    figure,
    host_of,
    pairs,
)

ROLES = {"writer": ["write"], "reader": ["read"], "bookie": ["bookie"]}


@dataclass
class Credentials:
    """The cluster's CA and token secret (files under the test's workdir)."""

    certs: CertFiles
    secret: bytes

    def env(self, principal: str, *, tls: bool = True) -> dict[str, str]:
        """A client's environment: its token, and the CA unless it dials in plaintext."""
        env = {"STREAMLIB_TOKEN": make_token(self.secret, principal)}
        if tls:
            env["STREAMLIB_TLS_CA"] = str(self.certs.ca)
        return env


def start_secure_bookies(cluster: Cluster, extra: list[str] | None = None) -> Credentials:
    """Certificates naming the four bookie hosts' addresses, a token secret, the roles
    granted with the CLI from host ob (before the bookies start: they read the principal
    map at start), then the README's recipe with TLS and token authentication."""
    addresses = tuple(cluster.net[name].address for name in BOOKIE_HOSTS)
    certs = make_certs(cluster.workdir / "certs", server_hosts=addresses)
    secret = new_secret_key()
    secret_file = write_private(cluster.workdir / "token.key", secret)
    for principal, roles in ROLES.items():
        grant = ["streamlib", "admin", "principals", "grant", principal, *roles]
        done = cluster.net["ob"].run([*grant, "--metadata", cluster.uri], timeout_s=30)
        assert done.returncode == 0, done.stderr
    credentials = Credentials(certs, secret)
    flags = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    flags += ["--tls-ca", str(certs.ca), "--auth-token-secret-file", str(secret_file)]
    # The recipe runs --autorecovery: its node inherits the bookie's environment, so
    # the token of the "bookie" principal (and the CA, which the bookie passes on).
    cluster.start_bookies(
        extra=[*flags, *(extra or [])], env={"STREAMLIB_TOKEN": make_token(secret, "bookie")}
    )
    return credentials


def refused_producer(
    cluster: Cluster, host: str, stream: str, label: str, env: dict[str, str]
) -> tuple[dict[str, Any], float]:
    """Start a producer that must not get the stream: its "takeover_failed" event (the
    worker reports only typed errors so: StreamlibError / MetadataError) and how long
    the refusal took."""
    worker = cluster.start_producer(host, stream, label, env)
    started = time.monotonic()
    outcome = worker.wait_for(lambda e: e["event"] in ("ready", "takeover_failed"), 60)
    assert outcome["event"] == "takeover_failed", f"{label} took the stream over{worker.tail()}"
    assert worker.wait(30) == 1, worker.tail()
    return outcome, outcome["t"] - started


def sent_all(producer: Worker, count: int, prefix: str) -> None:
    sent = producer.request("send", count=count, prefix=prefix, timeout_s=120)
    assert sent == {**sent, "acked": count, "failed": 0}, producer.tail()


def test_tls_and_tokens_work_across_hosts(cluster: Cluster) -> None:
    credentials = start_secure_bookies(cluster)
    cluster.create_stream("payroll", ensemble=3, write_quorum=2, ack_quorum=2)
    writer = cluster.producer("c1", "payroll", "writer", env=credentials.env("writer"))
    sent_all(writer, 100, "pay")
    acks = writer.of("ack")
    figure("TLS + token: 100 sends from c1, one at a time", acks[-1]["t"] - acks[0]["t"], "s")
    # The writer stays open: its explicit LAC shows the reader everything acknowledged.
    received = cluster.consume("c2", "payroll", "audit", 100, env=credentials.env("reader"))
    assert pairs(received) == pairs(acks)  # nothing lost, nothing twice, in order
    stored = cluster.ledgers("payroll")

    # A reader's token on c2 may read, not write: the bookies refuse its takeover before
    # it touches the stream's metadata.
    as_reader, took = refused_producer(
        cluster, "c2", "payroll", "reader-as-writer", credentials.env("reader")
    )
    assert as_reader["error"] == "UnauthorizedError", as_reader
    assert "principal 'reader' may not" in as_reader["message"], as_reader
    assert cluster.ledgers("payroll") == stored
    figure("a reader's takeover from c2 refused in", took, "s")
    # The writer's token without the CA: plaintext to TLS-only bookies gets nowhere.
    plaintext, took = refused_producer(
        cluster, "c2", "payroll", "plaintext-writer", credentials.env("writer", tls=False)
    )
    figure(f"a plaintext takeover from c2 refused ({plaintext['error']}) in", took, "s")
    # ... and changed nothing: its recovery never marked the live writer's ledger (it
    # did, before a recovery needed one bookie's answer first).
    assert cluster.ledgers("payroll") == stored

    # The writer on c1 was not fenced by either: its next send is acknowledged, and it
    # closes its ledger, so a reader sees all 101 acknowledged messages.
    sent_all(writer, 1, "after-the-refusals")
    writer.request("close")
    everything = cluster.consume("c2", "payroll", "all", 101, env=credentials.env("reader"))
    assert pairs(everything) == pairs(writer.of("ack"))


LOST_BOOKIE_DELAY_S = 2.0
FAST_AUTORECOVERY = [
    f"--autorecovery-option=--lost-bookie-delay={LOST_BOOKIE_DELAY_S}",
    "--autorecovery-option=--grace-period=2",
    "--autorecovery-option=--session-timeout=2",
]


def test_a_bookie_cut_off_during_tls_writes_is_written_around_and_re_replicated(
    cluster: Cluster,
) -> None:
    credentials = start_secure_bookies(cluster, extra=FAST_AUTORECOVERY)
    cluster.create_stream("ledger", ensemble=3, write_quorum=2, ack_quorum=2)
    writer = cluster.producer("c1", "ledger", "writer", env=credentials.env("writer"))
    sending = writer.ask("send", count=200, prefix="line", interval_s=0.01)
    writer.wait_for(lambda e: e.get("data") == "line-29", 30)
    victim = current_ensemble(writer)[0]
    cut = cluster.net[host_of(victim)]

    cut.partition()
    cut_at = time.monotonic()
    sent = writer.answer(sending, timeout_s=120)
    assert sent == {**sent, "acked": 200, "failed": 0}, writer.tail()
    writer.request("close")
    acks = writer.of("ack")
    figure(
        "TLS: messages acknowledged while a bookie was cut off",
        sum(e["t"] > cut_at for e in acks),
    )
    # The auto-recovery nodes (the "bookie" principal, over TLS) copy the victim's
    # fragments to the bookies still reachable.
    deadline = time.monotonic() + 60
    while any(victim in bookies for bookies in ensembles(cluster, "ledger")):
        assert time.monotonic() < deadline, f"still on {victim}: {ensembles(cluster, 'ledger')}"
        time.sleep(POLL_S)  # bounded polling of the metadata
    figure("TLS: re-replicated off the cut-off bookie after", time.monotonic() - cut_at, "s")
    assert pairs(cluster.read("c2", "ledger", env=credentials.env("reader"))) == pairs(acks)
