"""Fixtures shared by every test directory.

- `zookeeper`: ONE real ZooKeeper server (Debian's `zookeeper` package) per test
  session, on 127.0.0.1 and a free port, started on first use and stopped at the end.
- `metadata_uri`: a fresh, isolated store URI, parameterised over the three backends
  (memory / sqlite / zk); `store` is a connected store on it; `connect_store` opens
  more stores on the same URI (other sessions) and closes them all at teardown.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

# Before anything imports grpc: no gRPC fork handlers in the test process. With them, a
# child forked while gRPC threads run (pyspark starting its Java gateway, Popen with a
# preexec_fn) can die between fork and exec -- CI saw the Java gateway "exit before
# sending its port number" that way. Nothing here forks to go on using gRPC in the child.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import metadata

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_START_TIMEOUT_S = 30.0
BACKENDS = ("memory", "sqlite", "zk")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def four_letter(port: int, command: bytes, timeout_s: float = 1.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(command)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


class ZooKeeperServer:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def config_lines(self) -> list[str]:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        return [
            "tickTime=500",  # minimum session timeout = 2 ticks = 1 s
            f"dataDir={data}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "maxSessionTimeout=60000",
            "forceSync=no",  # a test server: durability is not under test here
        ]

    def classpath(self) -> list[str]:
        return [str(ZOOKEEPER_JAR)]  # its manifest's Class-Path names the dependencies

    def start(self) -> None:
        config = self.workdir / "zoo.cfg"
        config.write_text("\n".join([*self.config_lines(), ""]))
        java = shutil.which("java")
        assert java, "java is missing: run ./dev setup"
        assert ZOOKEEPER_JAR.exists(), "Debian's zookeeper package is missing: run ./dev setup"
        log = (self.workdir / "zookeeper.log").open("wb")
        self.process = subprocess.Popen(
            [
                java,
                "-Xmx256m",
                # The metadata layer's values go up to 1 MiB; leave room for framing.
                "-Djute.maxbuffer=4194304",
                "-cp",
                ":".join(self.classpath()),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        deadline = time.monotonic() + ZOOKEEPER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited: see {self.workdir / 'zookeeper.log'}")
            try:
                if b"Mode: standalone" in four_letter(self.port, b"srvr"):
                    return
            except OSError:
                pass
            # Bounded wait for the server socket to come up; there is nothing to block on.
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not start in {ZOOKEEPER_START_TIMEOUT_S}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def make_metadata_uri(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    unique = uuid.uuid4().hex[:12]
    if backend == "memory":
        return f"memory://test-{unique}"
    if backend == "sqlite":
        return f"sqlite://{tmp_path / 'meta.db'}"
    server: ZooKeeperServer = request.getfixturevalue("zookeeper")
    return f"zk://{server.hosts}/test-{unique}"


@pytest.fixture(params=BACKENDS)
def metadata_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_metadata_uri(request.param, request, tmp_path)


@pytest.fixture
def backend(metadata_uri: str) -> str:
    return metadata_uri.split("://", 1)[0]


@pytest.fixture
async def connect_store(
    metadata_uri: str,
) -> AsyncIterator[Callable[..., Awaitable[metadata.MetadataStore]]]:
    opened: list[metadata.MetadataStore] = []

    async def connect(**options: object) -> metadata.MetadataStore:
        store = await metadata.connect(metadata_uri, **options)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield connect
    for store in opened:
        await store.close()


@pytest.fixture
async def store(
    connect_store: Callable[..., Awaitable[metadata.MetadataStore]],
) -> metadata.MetadataStore:
    return await connect_store()


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for helper processes: the repository importable."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(params=("sqlite", "zk"))
def shared_metadata_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URI that several processes can share (every backend but memory)."""
    return make_metadata_uri(request.param, request, tmp_path)
