"""Fixtures of the multi-host tests.

- `network` (per module): hosts zk, b1..b4 (bookies), c1 and c2 (clients) and ob (an
  observer that no fault touches), on one switch; torn down even when tests fail.
- `zk` (per module): Debian's ZooKeeper inside host zk, on its address.
- `cluster` (per test): a fresh chroot on that ZooKeeper, bookies started on demand,
  and client workers; at the end every fault is healed and every process it started
  is killed, so the next test starts on a whole network.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.multihost.hosts import Network, Worker, running_network
from tests.multihost.services import Bookie, ZooKeeper

BOOKIE_HOSTS = ("b1", "b2", "b3", "b4")
HOSTS = ("zk", *BOOKIE_HOSTS, "c1", "c2", "ob")


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with running_network(HOSTS, tmp_path_factory.mktemp("multihost")) as net:
        yield net


@pytest.fixture(scope="module")
def zk(network: Network) -> ZooKeeper:
    workdir = network.workdir / "zookeeper"
    workdir.mkdir()
    return ZooKeeper(network["zk"], workdir).start()


class Cluster:
    """One test's cluster: its own chroot, its bookies, its client workers."""

    def __init__(self, network: Network, zk: ZooKeeper, workdir: Path) -> None:
        self.net = network
        self.zk = zk
        self.workdir = workdir
        self.uri = zk.uri(f"t-{uuid.uuid4().hex[:10]}")
        self.bookies: dict[str, Bookie] = {}
        self._observer: Worker | None = None

    def start_bookies(
        self,
        names: Iterable[str] = BOOKIE_HOSTS,
        extra: Iterable[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """Start bookies on these hosts together (they start in parallel) and wait
        until each serves (env: added to their environment)."""
        started = [
            Bookie(
                self.net[name], self.uri, self.workdir / f"bookie-{name}", list(extra), env
            ).launch()
            for name in names
        ]
        for bookie in started:
            self.bookies[bookie.host.name] = bookie.wait_listening()

    @property
    def observer(self) -> Worker:
        """The observer worker on host ob (started on first use)."""
        if self._observer is None:
            self._observer = self.net["ob"].worker(
                "observer", "--metadata", self.uri, label="observer"
            )
            self._observer.wait_event("bookies", 30)
        return self._observer

    def registered(self) -> list[str]:
        """The bookies registered now, as the observer last saw them."""
        return list(self.observer.of("bookies")[-1]["present"])

    def wait_registration(self, bookie_id: str, present: bool, timeout_s: float) -> dict[str, Any]:
        """The observer's first report from now on in which bookie_id is (or is not)
        registered, also if that is already so."""
        obs = self.observer
        since = len(obs.events)
        last = obs.of("bookies")[-1]
        if (bookie_id in last["present"]) == present:
            return last
        return obs.wait_for(
            lambda e: e.get("event") == "bookies" and (bookie_id in e["present"]) == present,
            timeout_s,
            since,
        )

    def create_stream(self, name: str, ensemble: int, write_quorum: int, ack_quorum: int) -> None:
        self.observer.request(
            "create_stream",
            name=name,
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
        )

    def ledgers(self, stream: str) -> list[dict[str, Any]]:
        ledgers: list[dict[str, Any]] = self.observer.request("stream", name=stream)["ledgers"]
        return ledgers

    def start_producer(
        self, host: str, stream: str, label: str, env: dict[str, str] | None = None
    ) -> Worker:
        """A producer worker on host, not waited for (it reports "ready" once it has
        taken the stream over, "takeover_failed" if it could not)."""
        return self.net[host].worker(
            "producer", "--metadata", self.uri, "--stream", stream, label=label, env=env
        )

    def producer(
        self,
        host: str,
        stream: str,
        label: str,
        timeout_s: float = 60,
        env: dict[str, str] | None = None,
    ) -> Worker:
        """A producer worker on host, once it has taken the stream over."""
        worker = self.start_producer(host, stream, label, env)
        worker.wait_event("ready", timeout_s)
        return worker

    def consume(
        self,
        host: str,
        stream: str,
        subscription: str,
        n: int,
        env: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        args = f"--stream {stream} --subscription {subscription} -n {n} --timeout 20".split()
        worker = self.net[host].worker(
            "consume", "--metadata", self.uri, *args, label=f"consume-{subscription}", env=env
        )
        return self._messages(worker)

    def read(
        self, host: str, stream: str, label: str = "reader", env: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        worker = self.net[host].worker(
            "read",
            *("--metadata", self.uri, "--stream", stream, "--timeout", "20"),
            label=label,
            env=env,
        )
        return self._messages(worker)

    @staticmethod
    def _messages(worker: Worker) -> list[dict[str, Any]]:
        """The messages a consume / read worker got, once it ended well."""
        end = worker.wait_for(lambda e: e["event"] in ("end", "close_hung", "read_failed"), 180)
        if end["event"] == "close_hung":
            pytest.fail(
                f"{worker.name}: close() did not return within {end['seconds']}s "
                f"after {len(worker.of('message'))} messages{worker.tail(6000)}"
            )
        assert end["event"] == "end", worker.tail()
        assert worker.wait(30) == 0, worker.tail()
        return worker.of("message")


@pytest.fixture
def cluster(network: Network, zk: ZooKeeper, tmp_path: Path) -> Iterator[Cluster]:
    first = len(network.procs)
    try:
        yield Cluster(network, zk, tmp_path)
    finally:
        network.heal_all()
        network.kill_processes(since=first)
