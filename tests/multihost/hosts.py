"""The multi-host tests' hosts: the package's network-namespace harness
(streamlib.chaos.hosts: topology, faults, cleanup) plus the tests' JSON-lines worker
protocol (workers.py) and a Network that fails a test, never skips, on a machine that
cannot make namespaces."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from streamlib.chaos import hosts as base
from streamlib.chaos.hosts import (  # noqa: F401 (the tests' names for them)
    NETNS_ETC,
    PREFIX,
    NetnsUnavailableError,
    Proc,
    WorkerError,
    check_capabilities,
    harness_env,
    netns_names,
    sweep_leftovers,
)

REPO = Path(__file__).resolve().parents[2]
WORKERS = (sys.executable, "-m", "tests.multihost.workers")


class Worker(Proc):
    """A process speaking JSON lines: requests on stdin, events on stdout (see
    workers.py). Every event carries "event" and a monotonic time "t" (one clock for
    all processes of the machine, so times from different hosts compare)."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.events: list[dict[str, Any]] = []
        self._rid = 0
        super().__init__(name, popen, log)

    def _parsed(self, count: int) -> None:
        for line in self.lines[len(self.lines) - count :]:
            try:
                self.events.append(json.loads(line))
            except json.JSONDecodeError:
                self.events.append({"event": "text", "text": line})

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, since: int = 0
    ) -> dict[str, Any]:
        """The first event from index `since` on that matches."""
        return self._wait(
            lambda: next((e for e in self.events[since:] if predicate(e)), None), timeout_s
        )

    def wait_event(self, kind: str, timeout_s: float, since: int = 0) -> dict[str, Any]:
        return self.wait_for(lambda e: e.get("event") == kind, timeout_s, since)

    def ask(self, op: str, **args: Any) -> int:
        """Send one request without waiting; its rid, for answer()."""
        self._rid += 1
        self.send({"op": op, "rid": self._rid, **args})
        return self._rid

    def answer(self, rid: int, timeout_s: float = 30.0) -> dict[str, Any]:
        """The answer to request rid; an answered error raises."""
        found = self.wait_for(lambda e: e.get("rid") == rid, timeout_s)
        if found.get("event") == "failed":
            raise WorkerError(f"{self.name}: request {rid} failed: {found}{self.tail()}")
        return found

    def request(self, op: str, timeout_s: float = 30.0, **args: Any) -> dict[str, Any]:
        """Send one request and wait for its answer."""
        return self.answer(self.ask(op, **args), timeout_s)

    def of(self, kind: str, since: int = 0) -> list[dict[str, Any]]:
        self._pump(0)
        return [e for e in self.events[since:] if e.get("event") == kind]


class Host(base.Host):
    """A host that also starts the tests' workers."""

    def worker(self, *args: str, label: str = "", env: dict[str, str] | None = None) -> Worker:
        """Start `python -m tests.multihost.workers ARGS` here (env: variables added to
        the harness environment, e.g. STREAMLIB_TLS_CA and STREAMLIB_TOKEN)."""
        proc = self.popen([*WORKERS, *args], label=label, proc_class=Worker, env=env)
        assert isinstance(proc, Worker)
        return proc


class Network(base.Network):
    """The harness's network, with the tests' hosts; the repository (the workers live in
    tests/) importable in them."""

    host_class = Host
    hosts: dict[str, Host]  # type: ignore[assignment]

    def __init__(self, names: Sequence[str], workdir: Path) -> None:
        super().__init__(names, workdir, python_path=[REPO])

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]


@contextlib.contextmanager
def running_network(names: Sequence[str], root: Path) -> Iterator[Network]:
    """A started Network, closed however the block ends; a machine that cannot make
    namespaces fails the test with the reason (the suite needs root, never skips)."""
    import pytest  # only the tests use this helper

    net = Network(list(names), root)
    try:
        net.start()
    except NetnsUnavailableError as e:
        pytest.fail(f"the multi-host tests need Linux network namespaces: {e}", pytrace=False)
    try:
        yield net
    finally:
        net.close()
