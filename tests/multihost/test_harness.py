"""The harness itself: its faults do what they say, and it leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multihost.hosts import (
    NETNS_ETC,
    Host,
    Network,
    netns_names,
    running_network,
    sweep_leftovers,
)

LISTENER = (
    "import socket, sys\n"
    "s = socket.socket(); s.bind((sys.argv[1], 7000)); s.listen(); print('ready', flush=True)\n"
    "while True: s.accept()[0].close()\n"
)
DIAL = (
    "import socket, sys\n"
    "try: socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])).close()\n"
    "except OSError: sys.exit(1)\n"
)


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Network]:
    with running_network(["h1", "h2"], tmp_path) as net:
        yield net


def reaches(a: Host, b: Host) -> bool:
    """Whether a connection from a to b is made. 5 s to make it: a healthy one takes
    milliseconds, but a first ARP request lost on a fresh link is only sent again after
    a second (a 1 s bound made the first dial of a run fail now and then)."""
    return a.run([sys.executable, "-c", DIAL, b.address, "5"], timeout_s=30).returncode == 0


def cut_off(a: Host, b: Host) -> bool:
    """Whether a connection from a to b fails (1 s: a cut link never answers)."""
    return a.run([sys.executable, "-c", DIAL, b.address, "1"], timeout_s=30).returncode == 1


def test_faults_cut_exactly_what_they_name(two_hosts: Network) -> None:
    h1, h2 = two_hosts["h1"], two_hosts["h2"]
    listener = h2.popen([sys.executable, "-c", LISTENER, h2.address])
    listener.wait_line(lambda line: line == "ready", 30)
    assert reaches(h1, h2)
    h1.partition()
    assert cut_off(h1, h2)
    h1.heal()
    assert reaches(h1, h2)
    for direction in ("out", "in", "both"):  # a TCP handshake needs both ways
        h1.block(h2, direction)
        assert cut_off(h1, h2), direction
        h1.unblock(h2, direction)
        assert reaches(h1, h2), direction


def test_closing_leaves_no_namespace_link_or_process(tmp_path: Path) -> None:
    net = Network(["h1", "h2"], tmp_path).start()
    namespaces = [net.switch_ns, net["h1"].ns, net["h2"].ns]
    sleeper = net["h1"].popen(["sleep", "600"])
    net.close()
    assert sleeper.popen.poll() is not None
    assert not [n for n in netns_names() if n.startswith(net.run_id)]
    assert not [n for n in namespaces if (NETNS_ETC / n).exists()]


def test_the_sweep_removes_only_what_dead_runs_left(tmp_path: Path) -> None:
    exited = subprocess.Popen(["true"])
    exited.wait()
    stale = f"slmh-{exited.pid}-dead-h1"
    live = f"slmh-{os.getpid()}-beef-h1"  # a run in progress (this one)
    foreign = f"notslmh-{os.getpid()}"  # not ours at all
    made = [stale, live, foreign]
    try:
        for ns in made:
            subprocess.run(["ip", "netns", "add", ns], check=True)
        # A process the crashed run left inside its namespace.
        orphan = subprocess.Popen(
            ["ip", "netns", "exec", stale, "sleep", "600"], start_new_session=True
        )
        assert stale in sweep_leftovers()
        names = netns_names()
        assert stale not in names
        assert live in names and foreign in names
        assert orphan.wait(10) == -9
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
