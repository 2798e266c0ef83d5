"""Real bookie processes, real auto-recovery daemon processes (``python -m
streamlib.autorecovery``) over a real sqlite metadata store, and helpers that check a
ledger's replication byte for byte. Everything started is stopped at teardown."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from bookie.launcher import BookieProcess
from bookie.wire import bookie_pb2 as pb
from metadata.services.auditor import AuditorElection
from metadata.services.underreplication import UnderReplicationManager
from streamlib.client import Client
from streamlib.protocol import LedgerMetadata
from tests.conftest import make_metadata_uri
from tests.integration.conftest import LedgerCluster

WAIT_S = 60.0
# A short metadata session, so a SIGKILLed daemon's locks and candidacy go soon.
SESSION_S = "2"


async def wait_for(
    condition: Callable[[], Awaitable[object]], what: str, timeout_s: float = WAIT_S
) -> object:
    """Poll condition() until it is truthy; fail the test naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.1)  # poll period of a bounded wait, not a synchronisation


async def is_empty(result: Awaitable[object]) -> bool:
    return not await result


async def equals(result: Awaitable[object], value: object) -> bool:
    return await result == value


class Daemon:
    """One ``python -m streamlib.autorecovery`` process."""

    def __init__(self, root: Path, metadata_uri: str, identifier: str, flags: list[str]) -> None:
        self.identifier = identifier
        self.log_path = root / f"autorecovery-{identifier}.log"
        self.command = [
            sys.executable,
            "-m",
            "streamlib.autorecovery",
            "--metadata",
            metadata_uri,
            "--id",
            identifier,
            "--session-timeout",
            SESSION_S,
            "--log-level",
            "INFO",
            *flags,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=subprocess.PIPE,
                stderr=log,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line.startswith(f"autorecovery {self.identifier} running"), line + self.log_text()
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self._close()

    def stop(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout_s)
        self._close()
        return rc

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


class RecoveryCluster(LedgerCluster):
    def __init__(self, root: Path, metadata_uri: str) -> None:
        super().__init__(root, metadata_uri)
        self.daemons: list[Daemon] = []
        self._client: Client | None = None

    def start_daemon(self, identifier: str, *flags: str) -> Daemon:
        daemon = Daemon(self.root, self.metadata_uri, identifier, list(flags))
        self.daemons.append(daemon)
        return daemon.start()

    async def admin_client(self) -> Client:
        if self._client is None:
            self._client = await self.client()
        return self._client

    async def ledgers_naming(self, bookie_id: str) -> list[int]:
        client = await self.admin_client()
        found = []
        for ledger_id in await client.ledgers.list():
            if bookie_id in (await client.ledgers.metadata(ledger_id)).bookies():
                found.append(ledger_id)
        return found

    async def marks(self) -> list[int]:
        client = await self.admin_client()
        return [r.ledger_id for r in await UnderReplicationManager(client.store).list()]

    async def auditor(self) -> str | None:
        client = await self.admin_client()
        return await AuditorElection(client.store, "test-observer").leader()

    async def close(self) -> None:
        for daemon in self.daemons:
            daemon.kill()
        await super().close()


async def _cluster(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> AsyncIterator[RecoveryCluster]:
    cluster = RecoveryCluster(tmp_path, make_metadata_uri(backend, request, tmp_path))
    try:
        yield cluster
    finally:
        await cluster.close()


@pytest.fixture
async def rcluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RecoveryCluster]:
    """On sqlite (the embedded default)."""
    async for cluster in _cluster(request, tmp_path, "sqlite"):
        yield cluster


@pytest.fixture(params=["sqlite", "zk"])
async def any_rcluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RecoveryCluster]:
    """On each real backend: sqlite, and ZooKeeper (kazoo's Election and Lock)."""
    async for cluster in _cluster(request, tmp_path, request.param):
        yield cluster


async def assert_fully_replicated(
    client: Client, md: LedgerMetadata, expected: dict[int, bytes]
) -> None:
    """Every entry of the CLOSED ledger is on every bookie of its write set, with the
    same bytes everywhere (payload, digest, LAC, length), and the payloads are what the
    writer had acknowledged."""
    assert md.is_closed, md
    assert md.last_entry_id >= max(expected, default=-1)
    await client.pool.prepare(md.bookies())
    for entry_id in range(md.last_entry_id + 1):
        copies = []
        for bookie in md.write_set_bookies(entry_id):
            response = await client.pool.get(bookie).read(
                pb.ReadRequest(
                    ledger_id=md.ledger_id, first_entry_id=entry_id, last_entry_id=entry_id
                )
            )
            assert response.status == pb.OK, (bookie, entry_id, response, md.fragments)
            (result,) = response.results
            assert result.status == pb.OK, (bookie, entry_id, result)
            e = result.entry
            # Byte for byte, flags included: the bookie stores the entry without the
            # request-only RECOVERY_ADD bit it was copied with.
            copies.append((e.payload, e.digest, e.last_add_confirmed, e.length, e.flags))
        assert len(set(copies)) == 1, f"ledger {md.ledger_id} entry {entry_id}: {copies}"
        if entry_id in expected:
            assert copies[0][0] == expected[entry_id]


def make_read_only(bookie: BookieProcess) -> None:
    state = bookie.admin("POST", "/admin/disk-thresholds?threshold=0.00001&lwm=0.000005")
    assert state["read_only"] is True
