"""Debian's ZooKeeper (the `zookeeper` package; ./dev setup installs it and java), run in
a network-namespace host (streamlib.chaos.hosts) on that host's address: the metadata
store of `streamlib chaos --partitions` and of the multi-host tests. Its sessions then
really expire when a partition cuts a client off.

    python -m streamlib.chaos.zookeeper ADDRESS PORT [--timeout S]

waits (bounded) until the server at ADDRESS:PORT answers `srvr` as a standalone server;
run inside a host, since only hosts reach each other.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
import time
from pathlib import Path

from streamlib.chaos.hosts import Host, NetnsUnavailableError, Proc, WorkerError

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZK_PORT = 2181
WAIT_ZK = (sys.executable, "-m", "streamlib.chaos.zookeeper")


class ZooKeeper:
    """Debian's ZooKeeper in a host, on its address."""

    def __init__(self, host: Host, workdir: Path, port: int = ZK_PORT) -> None:
        self.host = host
        self.workdir = workdir
        self.port = port
        self.proc: Proc | None = None

    @property
    def hosts(self) -> str:
        return f"{self.host.address}:{self.port}"

    def uri(self, chroot: str) -> str:
        return f"zk://{self.hosts}/{chroot.strip('/')}"

    def start(self, timeout_s: float = 30.0) -> ZooKeeper:
        java = shutil.which("java")
        if java is None or not ZOOKEEPER_JAR.exists():
            raise NetnsUnavailableError("java or Debian's zookeeper is missing: run ./dev setup")
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    "tickTime=500",  # sessions down to 1 s, so expiries come fast
                    f"dataDir={data}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.host.address}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=srvr,ruok",
                    "maxSessionTimeout=60000",
                    "forceSync=no",  # ZooKeeper's own durability is not under test
                    "",
                ]
            )
        )
        argv = [java, "-Xmx256m", "-Djute.maxbuffer=4194304", "-cp", str(ZOOKEEPER_JAR)]
        argv += ["org.apache.zookeeper.server.quorum.QuorumPeerMain", str(config)]
        self.proc = self.host.popen(argv, label="zookeeper", cwd=self.workdir)
        wait = [self.host.address, str(self.port), "--timeout", str(timeout_s)]
        done = self.host.run([*WAIT_ZK, *wait], timeout_s=timeout_s + 10)
        if done.returncode != 0:
            raise WorkerError(f"ZooKeeper did not start: {done.stderr}{self.proc.tail()}")
        return self


def wait_zk(address: str, port: int, timeout_s: float) -> int:
    """0 once the server answers as a standalone server; 1 if not within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1.0) as sock:
                sock.sendall(b"srvr")
                answer = b"".join(iter(lambda: sock.recv(4096), b""))
            if b"Mode: standalone" in answer:
                return 0
        except OSError:
            pass
        time.sleep(0.05)  # bounded wait for the server socket; nothing to block on
    print(f"ZooKeeper at {address}:{port} did not answer in {timeout_s}s", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamlib.chaos.zookeeper")
    parser.add_argument("address")
    parser.add_argument("port", type=int)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    return wait_zk(args.address, args.port, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
