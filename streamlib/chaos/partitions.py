"""`streamlib chaos --partitions`: the run's processes on network-namespace hosts
(streamlib.chaos.hosts), and network partitions among them beside the mode's faults.

Hosts: `zk` runs Debian's ZooKeeper (the metadata store, zk://zk:2181/chaos: sessions
really expire across a partition), b1..bN one bookie each (bookie id `bI:3181`, the
README's multi-host recipe), k1..kM one broker each (broker mode), and c1, c2 the
workers: in direct mode the producers (and a seal) on c1, the consumers and readers on
c2; in broker mode P0 and C0 on c1, P1 and C1 on c2; the final scan on c2. The harness
itself stays in the root namespace and reaches the cluster only through processes in
the hosts (stream creation runs on c1).

The partitions (streamlib.chaos.partition_plan) are carried out by the switch: a cable
pulled (Host.partition), packets dropped both ways or one way (Host.block). The mode's
own faults (kills, stops, duels) go on as without --partitions; the heal also restores
the network. Everything -- processes, namespaces, links, nftables tables, /etc/netns
entries -- goes when the run ends, however it ends (Network.close).

    python -m streamlib.chaos.partitions create-streams URL SPECS_JSON --bookies N

(run in a host by the harness) waits until N bookies are registered, then creates the
streams (each [args, kwargs] of client.streams.create) through the client at URL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bookie.launcher import BookieProcess
from streamlib.broker.launcher import BrokerProcess
from streamlib.chaos.direct import DirectRun
from streamlib.chaos.hosts import Host, Network, WorkerError, harness_env
from streamlib.chaos.partition_plan import (
    CLIENT_HOSTS,
    HEAL,
    KINDS,
    ZK_HOST,
    bookie_host,
    broker_host,
    cut_bookies,
    hosts,
    plan_partitions,
    with_heals,
)
from streamlib.chaos.plan import Fault, last_end_s
from streamlib.chaos.run import ChaosRun, create_streams
from streamlib.chaos.service import ServiceRun
from streamlib.chaos.zookeeper import ZooKeeper
from streamlib.sandbox import wait_for_bookies

BOOKIE_PORT = 3181
BROKER_PORT = 6650
CHROOT = "chaos"
SETUP_TIMEOUT_S = 60.0


def in_host(host: Host, argv: list[str]) -> list[str]:
    """argv run in host, importing this streamlib (the PYTHONPATH of harness_env)."""
    return host.argv(["env", f"PYTHONPATH={harness_env()['PYTHONPATH']}", *argv])


class HostBookie(BookieProcess):
    """A bookie on its own host: bound to the wildcard on BOOKIE_PORT, registered as
    `bI:3181` at the host's address (the README's multi-host recipe)."""

    def __init__(self, host: Host, data_dir: Path, metadata_uri: str, extra: list[str]) -> None:
        flags = ["--bookie-id", f"{host.name}:{BOOKIE_PORT}", "--host", "0.0.0.0",
                 "--advertised-address", host.address]  # fmt: skip
        super().__init__(data_dir, metadata_uri=metadata_uri, extra=[*flags, *extra])
        self.host = host

    @property
    def address(self) -> str:
        return f"{self.host.address}:{self.port}"

    def command(self, port: int = 0) -> list[str]:
        return in_host(self.host, super().command(port or BOOKIE_PORT))


class HostBroker(BrokerProcess):
    """A broker on its own host: bound to the wildcard on BROKER_PORT, advertising the
    host's address."""

    def __init__(self, host: Host, log_dir: Path, metadata_uri: str, extra: list[str]) -> None:
        flags = ["--broker-id", host.name, "--host", "0.0.0.0"]
        super().__init__(log_dir, metadata_uri, name=f"broker-{host.name}", extra=[*flags, *extra])
        self.host = host

    def command(self, port: int) -> list[str]:
        return in_host(self.host, super().command(port or BROKER_PORT))


def _flags_after_id(extra: list[str], id_flag: str) -> list[str]:
    """A sandbox node's flags without its id (the hosts name their nodes)."""
    if extra[:1] == [id_flag]:
        return extra[2:]
    return list(extra)


class HostCluster:
    """What run.py asks of a Sandbox (processes, brokers, metadata_uri, service_url,
    start, stop), on hosts: ZooKeeper, bookies and brokers each on their own."""

    def __init__(
        self, root: Path, bookies: int, bookie_flags: list[str], broker_flags: list[list[str]]
    ) -> None:
        self.root = root
        self.network = Network(hosts(bookies, len(broker_flags)), root / "hosts")
        self.bookie_count = bookies
        self.zookeeper: ZooKeeper | None = None
        self.metadata_uri = ""
        self.processes: list[BookieProcess] = []
        self.brokers: list[BrokerProcess] = []
        self._bookie_flags = bookie_flags
        self._broker_flags = broker_flags
        # Each bookie's extra environment (--disk-faults: its failpoints directory).
        self.bookie_env: list[dict[str, str]] = [{} for _ in range(bookies)]

    @property
    def service_url(self) -> str:
        return "streamlib://" + ",".join(b.address for b in self.brokers)

    def start(self) -> HostCluster:
        self.network.workdir.mkdir(parents=True, exist_ok=True)
        self.network.start()
        zk_dir = self.root / "zookeeper"
        zk_dir.mkdir(parents=True, exist_ok=True)
        self.zookeeper = ZooKeeper(self.network[ZK_HOST], zk_dir).start()
        self.metadata_uri = self.zookeeper.uri(CHROOT)
        self.processes = [
            HostBookie(self.network[bookie_host(i)], self.root / f"bookie-{i}",
                       self.metadata_uri, self._bookie_flags)
            for i in range(self.bookie_count)
        ]  # fmt: skip
        for bookie, env in zip(self.processes, self.bookie_env, strict=True):
            bookie.env.update(env)
            bookie.start()
        self.brokers = [
            HostBroker(self.network[broker_host(i)], self.root, self.metadata_uri, flags)
            for i, flags in enumerate(self._broker_flags)
        ]
        for broker in self.brokers:
            broker.start(port=BROKER_PORT)
        return self

    def stop(self) -> None:
        """Brokers, bookies, then the hosts with all that is left in them."""
        try:
            for broker in self.brokers:
                broker.stop()
            for bookie in self.processes:
                bookie.stop()
        finally:
            self.network.close()


class Partitioned(ChaosRun):
    """A mode (DirectRun or ServiceRun) on hosts, with partitions (mixed in first)."""

    network: Network

    def __init__(self, root: Path, seed: int, args: argparse.Namespace, say: Any) -> None:
        super().__init__(root, seed, args, say)  # type: ignore[call-arg, arg-type]
        # The mode's own sandbox says which flags its nodes get; the hosts run them.
        sandbox = self.sandbox
        bookie_flags = _flags_after_id(sandbox.processes[0].extra, "--bookie-id")
        brokers = sandbox.brokers[: args.brokers]  # (direct mode's sandbox has an idle one)
        broker_flags = [_flags_after_id(b.extra, "--broker-id") for b in brokers]
        self.cluster = HostCluster(
            root / "cluster", len(sandbox.processes), bookie_flags, broker_flags
        )
        self.cluster.bookie_env = [dict(b.env) for b in sandbox.processes]  # (--disk-faults)
        self.sandbox = self.cluster  # type: ignore[assignment]
        self.network = self.cluster.network
        self.partition_seconds = float(args.seconds)
        self.cut: dict[Fault, set[str]] = {}  # partitions under way: the bookies they cut

    # -- where things run ---------------------------------------------------------------

    def placement(self, role: str, slot: str, kind: str) -> list[str]:
        first = slot.endswith("0") if slot else role == "producer"
        host = self.network[CLIENT_HOSTS[0] if first else CLIENT_HOSTS[1]]
        return in_host(host, [])

    def create_streams(self, url: str, streams: list[tuple[list[Any], dict[str, Any]]]) -> None:
        argv = [sys.executable, "-m", "streamlib.chaos.partitions", "create-streams", url,
                json.dumps(streams), "--bookies", str(len(self.cluster.processes)),
                "--metadata", self.cluster.metadata_uri]  # fmt: skip
        done = self.network[CLIENT_HOSTS[0]].run(argv, timeout_s=SETUP_TIMEOUT_S + 30)
        if done.returncode != 0:
            raise WorkerError(f"creating the streams on {CLIENT_HOSTS[0]} failed: {done.stderr}")
        self.record("hosts", **{h.name: h.address for h in self.network.hosts.values()})

    # -- the partitions -----------------------------------------------------------------

    def inject(self, faults: list[Fault], seconds: float) -> None:
        bookies, brokers = len(self.cluster.processes), len(self.cluster.brokers)
        planned = plan_partitions(self.seed, self.partition_seconds, bookies, brokers, faults)
        self.say(f"partitions planned: {len(planned)}")
        super().inject(with_heals([*faults, *planned]), max(seconds, last_end_s(planned)))

    def apply(self, step: str, fault: Fault) -> None:
        kind = step.removeprefix(HEAL)
        if kind not in KINDS:
            super().apply(step, fault)
        elif step.startswith(HEAL):
            original = next((f for f in self.cut if f.kind == kind and f.target == fault.target),
                            None)  # fmt: skip
            if original is not None:
                self._cut(original, False)
                del self.cut[original]
                self.record(step, target=fault.target)
        else:
            bookies = cut_bookies(fault)
            if kind != "partition-majority" and bookies and not self._may_cut(bookies):
                self.record("skipped", fault=kind, target=fault.target)
                return
            self._cut(fault, True)
            self.cut[fault] = bookies
            self.record(kind, target=fault.target, for_s=fault.duration_s)

    def _may_cut(self, bookies: set[str]) -> bool:
        """Within max_down: the bookies down or cut off now, and these."""
        out = {bookie_host(i) for i in range(len(self.cluster.processes))
               if self.node_down("bookie", i)}  # fmt: skip
        for cut in self.cut.values():
            out |= cut
        return len(out | bookies) <= self.max_down("bookie")

    def _cut(self, fault: Fault, on: bool) -> None:
        net = self.network
        if fault.kind in ("partition-host", "partition-majority"):
            for name in fault.target.split(","):
                net[name].partition() if on else net[name].heal()
        elif fault.kind == "asymmetric":
            source, destination = fault.target.split(">")
            pair = (net[source], net[destination])
            pair[0].block(pair[1], "out") if on else pair[0].unblock(pair[1], "out")
        else:  # cut-client-broker, cut-zk-broker
            a, b = fault.target.split("|")
            net[a].block(net[b]) if on else net[a].unblock(net[b])

    def heal_nodes(self) -> list[int]:
        """The network whole again, then every bookie and broker running."""
        if self.cut:
            self.record("network-healed", partitions=[f.kind for f in self.cut])
        self.network.heal_all()
        self.cut.clear()
        return super().heal_nodes()

    # -- the report ---------------------------------------------------------------------

    def report(self, verdict: Any, args: argparse.Namespace) -> dict[str, Any]:
        report: dict[str, Any] = super().report(verdict, args)  # type: ignore[misc]
        report["partition_faults"] = dict(
            Counter(e["what"] for e in self.events if e["what"] in KINDS)
        )
        report["replay"] += " --partitions"
        return report

    def print_report(self, report: dict[str, Any]) -> None:  # type: ignore[override]
        super().print_report(report)  # type: ignore[misc]
        print(f"partition faults: {report['partition_faults']}", flush=True)


class PartitionedDirectRun(Partitioned, DirectRun):
    """Direct mode on hosts, with partitions."""

    temp_prefix = "streamlib-chaos-partitions-"


class PartitionedServiceRun(Partitioned, ServiceRun):
    """Broker mode on hosts, with partitions."""

    temp_prefix = "streamlib-chaos-service-partitions-"


# -- stream creation, run inside a host -----------------------------------------------


async def wait_registered(metadata_uri: str, bookies: int, timeout_s: float) -> None:
    """Until `bookies` bookies are registered (bounded; a watch, not a poll)."""
    await wait_for_bookies(metadata_uri, lambda ids: len(ids) >= bookies, timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamlib.chaos.partitions")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create-streams")
    create.add_argument("url")
    create.add_argument("streams", help="JSON: [[args, kwargs], ...] of client.streams.create")
    create.add_argument("--metadata", required=True)
    create.add_argument("--bookies", type=int, required=True)
    args = parser.parse_args(argv)
    asyncio.run(wait_registered(args.metadata, args.bookies, SETUP_TIMEOUT_S))
    create_streams(args.url, [(list(a), dict(k)) for a, k in json.loads(args.streams)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
