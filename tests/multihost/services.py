"""What runs in the hosts: Debian's ZooKeeper (streamlib.chaos.zookeeper) and bookies
started with the README's multi-host recipe (see hosts.py for the hosts themselves)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from streamlib.chaos.zookeeper import ZK_PORT, ZOOKEEPER_JAR, ZooKeeper  # noqa: F401 (moved)
from tests.multihost.hosts import Host, Proc

BOOKIE_PORT = 3181


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
