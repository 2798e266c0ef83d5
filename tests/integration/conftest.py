"""A cluster of real `bookie serve` processes on 127.0.0.1 over a real metadata store
(sqlite in the test's tmp dir, or the session's ZooKeeper), and clients of it. Every
process and client is stopped at the end of the test."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bookie.launcher import BookieProcess
from streamlib.broker.launcher import BrokerProcess
from streamlib.client import Client
from streamlib.ledger.bookie_client import BookieClientConfig
from streamlib.stream.admin import StreamManager
from streamlib.stream.positions import EARLIEST, MessageId
from tests.conftest import make_metadata_uri

# Short timeouts so a killed or stopped bookie is noticed quickly; a short session so
# its registration goes away soon after a SIGKILL.
BOOKIE_FLAGS = ["--session-timeout", "2", "--disk-check-interval", "0.5", "--gc-interval", "3600"]
FAST_CLIENT = BookieClientConfig(add_timeout_s=3.0, read_timeout_s=3.0)


class LedgerCluster:
    def __init__(self, root: Path, metadata_uri: str) -> None:
        self.root = root
        self.metadata_uri = metadata_uri
        self.bookies: list[BookieProcess] = []
        self.brokers: list[BrokerProcess] = []
        self.clients: list[Any] = []

    def start_bookies(self, count: int, extra: list[str] | None = None) -> list[BookieProcess]:
        """Start count bookies; extra: more `bookie serve` flags (e.g. --tls-cert ...)."""
        started = []
        for _ in range(count):
            b = BookieProcess(
                self.root / f"bookie{len(self.bookies)}",
                metadata_uri=self.metadata_uri,
                extra=BOOKIE_FLAGS + list(extra or []),
            )
            self.bookies.append(b)
            started.append(b.start())
        return started

    def start_brokers(
        self, count: int, extra: list[str] | None = None, pulsar: bool = False
    ) -> list[BrokerProcess]:
        """Start count brokers of the stream service (a 2 s metadata session); pulsar:
        with Pulsar's binary protocol on a port of its own each (`pulsar_url`)."""
        started = []
        for _ in range(count):
            b = BrokerProcess(
                self.root,
                self.metadata_uri,
                name=f"broker{len(self.brokers)}",
                extra=["--port", "0", "--session-timeout", "2", "--log-level", "INFO",
                       *(extra or [])],
                pulsar=pulsar,
            )  # fmt: skip
            self.brokers.append(b)
            started.append(b.start(port=0))
        return started

    @property
    def service_url(self) -> str:
        return "streamlib://" + ",".join(b.address for b in self.brokers if b.address)

    @property
    def pulsar_url(self) -> str:
        """The first broker's Pulsar URL (lookups there find any stream's owner)."""
        return next(b.pulsar_url for b in self.brokers if b.pulsar_url)

    async def service_client(self, **options: object) -> Any:
        """A client of the stream service (every broker started so far as a seed)."""
        client = await Client.connect(self.service_url, **options)
        self.clients.append(client)
        return client

    def by_id(self, bookie_id: str) -> BookieProcess:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    async def client(self, **options: object) -> Client:
        return await self.client_at(self.metadata_uri, **options)

    async def client_at(self, uri: str, **options: object) -> Client:
        """A client of this cluster's bookies through another URI of its store (another
        identity, say)."""
        options.setdefault("bookie_config", FAST_CLIENT)
        client = await Client.connect(uri, **options)
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        for broker in self.brokers:
            broker.kill()
        for b in self.bookies:
            b.kill()


async def _cluster(request: pytest.FixtureRequest, tmp_path: Path, backend: str):
    cluster = LedgerCluster(tmp_path, make_metadata_uri(backend, request, tmp_path))
    try:
        yield cluster
    finally:
        await cluster.close()


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LedgerCluster]:
    """On sqlite (the embedded default)."""
    async for c in _cluster(request, tmp_path, "sqlite"):
        yield c


@pytest.fixture(params=["direct", "service"])
async def client(request: pytest.FixtureRequest, cluster: LedgerCluster) -> AsyncIterator[Any]:
    """A client of 3 bookies, in each mode: direct, and through one broker (a module of
    its own `client` fixture has that one instead)."""
    cluster.start_bookies(3)
    if request.param == "direct":
        yield await cluster.client()
    else:
        cluster.start_brokers(1)
        yield await cluster.service_client()


@pytest.fixture(params=["sqlite", "zk"])
async def any_cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[LedgerCluster]:
    """On each real backend: sqlite and ZooKeeper."""
    async for c in _cluster(request, tmp_path, request.param):
        yield c


def reset_cursor_once_cursors_are_read(
    monkeypatch: pytest.MonkeyPatch, manager: StreamManager, subscription: str
) -> None:
    """The interleaving retention must survive: the first time it reads a stream's
    cursors, an admin resets `subscription` to EARLIEST right after (before its CAS)."""
    read_cursors = type(manager)._retention_cursors  # (what retention reads them with)

    async def cursors_then_reset(self: StreamManager, name: str) -> list[tuple[MessageId, bool]]:
        found = await read_cursors(self, name)
        if not getattr(self, "_reset_done", False):
            self._reset_done = True  # type: ignore[attr-defined]
            await manager.reset_cursor(name, subscription, EARLIEST)
        return found

    monkeypatch.setattr(type(manager), "_retention_cursors", cursors_then_reset)


@pytest.fixture
async def zk_cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[LedgerCluster]:
    """On ZooKeeper only (for what needs its sessions: expiring one on purpose)."""
    async for c in _cluster(request, tmp_path, "zk"):
        yield c


# SIGINT as a terminal's program has it, even when this run inherited it ignored (a
# background job of a shell without job control): Python then keeps ignoring it, and a script
# could not show what Ctrl-C does. Set by the script itself, not by a preexec_fn: Python code
# between fork and exec in this process, whose gRPC threads are running, can crash the child
# before exec (the child then vanished without a word, and the test read an empty line).
_SIGINT_AT_DEFAULT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


@contextlib.asynccontextmanager
async def script_process(
    script: str, *argv: str, ready: str
) -> AsyncIterator[subprocess.Popen[str]]:
    """Run `python -c script argv...` until it prints the line `ready`; killed at the end
    of the block if still running. (Its stdin stays open: a script may wait on it.)"""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGINT_AT_DEFAULT + script, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # Read the pipe off the event loop: the test's clients run on this loop.
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
        assert line.strip() == ready, line
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
