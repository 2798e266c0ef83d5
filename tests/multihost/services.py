"""What runs in the hosts: Debian's ZooKeeper and bookies started with the README's
multi-host recipe (see hosts.py for the hosts themselves)."""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.multihost.hosts import WORKERS, Host, NetnsUnavailableError, Proc, WorkerError

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZK_PORT = 2181
BOOKIE_PORT = 3181


class ZooKeeper:
    """Debian's ZooKeeper (the `zookeeper` package), run in a host on its address."""

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
                    "forceSync=no",  # durability of ZooKeeper is not under test
                    "",
                ]
            )
        )
        argv = [java, "-Xmx256m", "-Djute.maxbuffer=4194304", "-cp", str(ZOOKEEPER_JAR)]
        argv += ["org.apache.zookeeper.server.quorum.QuorumPeerMain", str(config)]
        self.proc = self.host.popen(argv, label="zookeeper", cwd=self.workdir)
        wait = ["wait-zk", self.host.address, str(self.port), "--timeout", str(timeout_s)]
        done = self.host.run([*WORKERS, *wait], timeout_s=timeout_s + 10)
        if done.returncode != 0:
            raise WorkerError(f"ZooKeeper did not start: {done.stderr}{self.proc.tail()}")
        return self


# Flags every bookie of these tests gets: a short session, so a partitioned bookie's
# registration goes soon; no GC round during a test.
BOOKIE_FLAGS = ("--session-timeout", "2", "--disk-check-interval", "0.5", "--gc-interval", "3600")


README = Path(__file__).resolve().parents[2] / "README.md"


def readme_recipe() -> list[str]:
    """The `bookie serve` command of the README's multi-host section, as written there."""
    text = README.read_text()
    section = text[text.index("## Running across machines on ZooKeeper") :]
    block = re.search(r"```sh\n(bookie serve .*?)```", section, flags=re.S)
    if block is None:
        raise AssertionError("README: no `bookie serve` block in the multi-host section")
    return shlex.split(block.group(1).replace("\\\n", " "))


def bookie_serve_argv(
    host: Host, metadata_uri: str, data_dir: Path, extra: Iterable[str] = ()
) -> list[str]:
    """The README's multi-host recipe word for word, its placeholders filled in: the
    metadata URI, the data directory, this host's stable name and its address."""
    fill = {
        "zk://zk1:2181/streamlib": metadata_uri,
        "/var/lib/bookie": str(data_dir),
        "NAME": f"{host.name}:{BOOKIE_PORT}",
        "ADDR": host.address,
    }
    argv = [fill.get(word, word) for word in readme_recipe()]
    for placeholder in fill:
        assert placeholder in readme_recipe(), f"README recipe lost its {placeholder}"
    return [*argv, *BOOKIE_FLAGS, *extra]


_LISTENING = re.compile(r"^bookie (\S+) listening on (\S+):(\d+)")


class Bookie:
    """`bookie serve` in a host; started when its "listening" line is printed."""

    def __init__(
        self,
        host: Host,
        metadata_uri: str,
        data_dir: Path,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ):
        self.host = host
        self.metadata_uri = metadata_uri
        self.data_dir = data_dir
        self.extra = list(extra)
        # Added to its environment; its --autorecovery node inherits it (STREAMLIB_TOKEN
        # gives that node a principal where bookies authenticate tokens).
        self.env = env
        self.bookie_id = f"{host.name}:{BOOKIE_PORT}"
        self.proc: Proc | None = None

    def launch(self) -> Bookie:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = bookie_serve_argv(self.host, self.metadata_uri, self.data_dir, self.extra)
        self.proc = self.host.popen(argv, label=f"bookie-{self.host.name}", env=self.env)
        return self

    def wait_listening(self, timeout_s: float = 30.0) -> Bookie:
        assert self.proc is not None
        line = self.proc.wait_line(lambda x: _LISTENING.match(x) is not None, timeout_s)
        m = _LISTENING.match(line)
        assert m is not None and m.group(1) == self.bookie_id, line
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
