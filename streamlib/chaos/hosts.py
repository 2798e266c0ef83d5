"""Hosts made of Linux network namespaces, for faults only a network can make: used by
`streamlib chaos --partitions` (streamlib/chaos/partitions.py) and by the multi-host tests
(tests/multihost/, which add their JSON-lines worker protocol on top of Proc).

Topology (one per Network):

    switch namespace:  bridge br0, one port per host (p-NAME)
    host namespace:    lo, eth0 (the other end of its port) with 10.213.K.N/24

The bridge lives in a namespace of its own, so the root namespace's network is never
changed: every link is created directly inside our namespaces and dies with them.
Hosts reach each other and nothing else. Each host namespace also gets an /etc/hosts
(ip netns exec bind-mounts /etc/netns/NS/hosts) naming every host, as DNS would in a
real deployment: a bookie id like `b1:3181` then resolves.

Faults:
- Host.partition() / heal(): the host's switch port goes down / up, as if its cable
  were pulled. Its processes live on; its eth0 loses carrier, so its packets vanish
  (after ARP gives up, new connections get EHOSTUNREACH, as on a real LAN). Taking
  eth0 itself down would instead remove the host's route and fail every send at once
  with ENETUNREACH, which no remote fault looks like.
- Host.block(other, direction) / unblock(): the switch drops IP packets from this host
  to `other` ("out"), from `other` to this host ("in"), or both, with an nftables set
  in the bridge family (Debian package `nftables`). Neither host's kernel sees
  anything: the packets just never arrive.

Names: every namespace is `slmh-PID-RAND-NAME` (PID: the process that made it), so
parallel runs never collide, and sweep_leftovers() removes only the namespaces (and
their processes and /etc/netns files) of `slmh-` runs whose process is gone. Interface
names stay within the kernel's 15 characters. Network.close() kills every process
started through a Host (whole process groups), then everything left in its
namespaces, then deletes the namespaces; it runs even when a test or a run fails.

Processes in hosts import streamlib from where this package is installed (its checkout
or site-packages), then from the caller's PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import streamlib

PREFIX = "slmh"  # every namespace this harness makes starts with "slmh-"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+-")
NETNS_ETC = Path("/etc/netns")
# Where streamlib is imported from (a checkout's root or site-packages): processes in
# hosts import the same code as the process that made the hosts.
PACKAGE_ROOT = Path(streamlib.__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
_IFNAMSIZ = 15
_NFT_TABLE = "slmh"


class NetnsUnavailableError(RuntimeError):
    """This machine cannot make the namespaces, links or filters the harness needs."""


class WorkerError(RuntimeError):
    """A harness process exited, timed out or said something unexpected."""


def harness_env(
    extra: dict[str, str] | None = None, python_path: Sequence[Path] = ()
) -> dict[str, str]:
    """The environment of every process in a host: the venv's tools first on PATH,
    python_path then this streamlib's location then the caller's PYTHONPATH importable,
    output unbuffered so events arrive as they happen."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    paths = [*map(str, python_path), str(PACKAGE_ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _ip(*args: str, ns: str | None = None, check: bool = True) -> str:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise NetnsUnavailableError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


def netns_names() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(ns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL everything still running in ns and wait (bounded) until it is gone: a
    namespace with a process in it outlives `ip netns del`."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).split()]
        if not pids:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {ns} survive SIGKILL")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)  # bounded wait for the kernel to reap them


def _delete_namespace(ns: str) -> None:
    _kill_namespace_processes(ns)
    _ip("netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def sweep_leftovers() -> list[str]:
    """Remove what crashed earlier runs left: namespaces (and their processes and
    /etc/netns entries) named `slmh-PID-...` whose PID is no longer alive. Anything
    not named so, and any live run's namespaces, are left alone."""
    stale = set()
    names = netns_names()
    extra = [p.name for p in NETNS_ETC.iterdir()] if NETNS_ETC.is_dir() else []
    for name in [*names, *extra]:
        m = _NAME.match(name)
        if m and not _pid_alive(int(m.group(1))):
            stale.add(name)
    # Hosts first: the switch's ports die with their peers.
    for name in sorted(stale, key=lambda n: n.endswith("-sw")):
        if name in names:
            _delete_namespace(name)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    return sorted(stale)


def check_capabilities() -> None:
    """Fail with what is missing instead of somewhere deep in a test."""
    if os.geteuid() != 0:
        raise NetnsUnavailableError("making network namespaces needs root")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise NetnsUnavailableError(f"`{tool}` is missing: apt-get install {package}")


def _subnet_octet() -> int:
    # Networks are isolated from each other (each has its own switch), so a clash would
    # be harmless; distinct subnets only keep parallel runs' logs apart.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return 1 + (os.getpid() * 7 + int(worker or 0)) % 254


class Proc:
    """A process started in a host: its output read line by line with bounded waits,
    its stderr in a log file for the post-mortem."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.popen = popen
        self.log = log
        self.lines: list[str] = []
        self._buf = b""
        self._eof = False
        if popen.stdout is not None:
            os.set_blocking(popen.stdout.fileno(), False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _pump(self, timeout_s: float) -> bool:
        """Read what arrives within timeout_s; False once stdout is closed."""
        out = self.popen.stdout
        if out is None or self._eof:
            return False
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            if not sel.select(max(timeout_s, 0.0)):
                return True
        try:
            chunk = os.read(out.fileno(), 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        *complete, self._buf = self._buf.split(b"\n")
        self.lines += [line.decode(errors="replace") for line in complete]
        self._parsed(len(complete))
        return True

    def _parsed(self, count: int) -> None:
        pass

    def wait_line(self, predicate: Callable[[str], bool], timeout_s: float) -> str:
        return self._wait(lambda: next((x for x in self.lines if predicate(x)), None), timeout_s)

    def _wait(self, find: Callable[[], Any], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            found = find()
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(f"{self.name}: nothing expected within {timeout_s}s{self.tail()}")
            if not self._pump(remaining):
                found = find()
                if found is not None:
                    return found
                code = self.popen.wait(10)
                raise WorkerError(f"{self.name} exited {code} early{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        try:
            err = self.log.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            err = ""
        out = "\n".join(self.lines[-20:])
        return f"\n--- {self.name} stdout (last lines) ---\n{out}\n--- stderr ---\n{err}"

    def send(self, obj: dict[str, Any]) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(obj).encode() + b"\n")
        self.popen.stdin.flush()

    def wait(self, timeout_s: float = 30.0) -> int:
        """Wait for exit (reading its output meanwhile, so a full pipe cannot stall it)."""
        deadline = time.monotonic() + timeout_s
        while self.popen.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(f"{self.name} still runs after {timeout_s}s{self.tail()}")
            if not self._pump(min(remaining, 0.2)):
                return self.popen.wait(remaining)
        while self._pump(0):
            pass
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL its whole process group (a bookie's auto-recovery child too)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.wait(10)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class Network:
    """A switch and hosts; a context manager that leaves nothing behind.

    python_path: put first on the PYTHONPATH of processes in the hosts (the tests add
    their repository, for their workers)."""

    host_class: type[Host]  # (set below Host: a subclass may make its own hosts)

    def __init__(
        self, names: Sequence[str], workdir: Path, python_path: Sequence[Path] = ()
    ) -> None:
        for name in names:
            if not re.fullmatch(r"[a-z][a-z0-9]{0,10}", name):
                raise ValueError(f"host name {name!r}: 1-11 of [a-z0-9] (interface names)")
        self.names = list(names)
        self.workdir = workdir
        self.python_path = list(python_path)
        self.run_id = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(2)}"
        self.switch_ns = f"{self.run_id}-sw"
        self.subnet = f"10.213.{_subnet_octet()}"
        self.hosts: dict[str, Host] = {}
        self.procs: list[Proc] = []
        self._made: list[str] = []  # namespaces, in creation order
        self._blocked: set[tuple[str, str]] = set()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def start(self) -> Network:
        check_capabilities()
        sweep_leftovers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        self._add_namespace(self.switch_ns)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch_ns)
        _ip("link", "set", "br0", "up", ns=self.switch_ns)
        self._nft(
            f"add table bridge {_NFT_TABLE}\n"
            f"add set bridge {_NFT_TABLE} blocked {{ type ipv4_addr . ipv4_addr; }}\n"
            f"add chain bridge {_NFT_TABLE} forward "
            "{ type filter hook forward priority 0; policy accept; }\n"
            f"add rule bridge {_NFT_TABLE} forward ip saddr . ip daddr @blocked drop\n"
        )
        for index, name in enumerate(self.names, start=1):
            host = self.host_class(self, name, f"{self.run_id}-{name}", f"{self.subnet}.{index}")
            self._add_namespace(host.ns)
            port = host.port
            assert len(port) <= _IFNAMSIZ
            veth = f"link add {port} type veth peer name eth0 netns {host.ns}"
            _ip(*veth.split(), ns=self.switch_ns)
            _ip("link", "set", port, "master", "br0", ns=self.switch_ns)
            _ip("link", "set", port, "up", ns=self.switch_ns)
            _ip("addr", "add", f"{host.address}/24", "dev", "eth0", ns=host.ns)
            _ip("link", "set", "eth0", "up", ns=host.ns)
            self.hosts[name] = host
        hosts_file = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
            f"{h.address} {h.name}\n" for h in self.hosts.values()
        )
        for host in self.hosts.values():
            (NETNS_ETC / host.ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / host.ns / "hosts").write_text(hosts_file)

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("link", "set", "lo", "up", ns=ns)

    def _nft(self, script: str) -> None:
        done = subprocess.run(
            ["ip", "netns", "exec", self.switch_ns, "nft", "-f", "-"],
            input=script,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise NetnsUnavailableError(f"nft in the switch failed: {done.stderr.strip()}")

    def drop(self, src: Host, dst: Host, dropped: bool) -> None:
        """Drop (or stop dropping) IP packets from src to dst at the switch."""
        pair = (src.address, dst.address)
        if dropped == (pair in self._blocked):
            return
        verb = "add" if dropped else "delete"
        self._nft(f"{verb} element bridge {_NFT_TABLE} blocked {{ {pair[0]} . {pair[1]} }}\n")
        if dropped:
            self._blocked.add(pair)
        else:
            self._blocked.discard(pair)

    def heal_all(self) -> None:
        """Every link up, nothing dropped."""
        if self._blocked:
            self._nft(f"flush set bridge {_NFT_TABLE} blocked\n")
            self._blocked.clear()
        for host in self.hosts.values():
            host.heal()

    def kill_processes(self, since: int = 0) -> None:
        """Kill the processes started through our hosts (from index `since` on)."""
        for proc in self.procs[since:]:
            proc.kill()
        del self.procs[since:]

    def close(self) -> None:
        errors = []
        self.kill_processes()
        # Hosts before the switch; anything left in a namespace is killed first.
        for ns in reversed(self._made):
            try:
                _delete_namespace(ns)
            except Exception as e:  # go on: the other namespaces must still go
                errors.append(f"{ns}: {e}")
        self._made.clear()
        left = [n for n in netns_names() if n.startswith(self.run_id)]
        if errors or left:
            raise RuntimeError(f"cleanup of {self.run_id} incomplete: {errors} left={left}")

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class Host:
    """One namespace with one address."""

    def __init__(self, network: Network, name: str, ns: str, address: str) -> None:
        self.network = network
        self.name = name
        self.ns = ns
        self.address = address
        self.port = f"p-{name}"  # its port on the switch
        self.partitioned = False

    def __repr__(self) -> str:
        return f"<host {self.name} {self.address}>"

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def popen(
        self,
        argv: Sequence[str],
        *,
        label: str = "",
        proc_class: type[Proc] = Proc,
        env: dict[str, str] | None = None,
        **popen_kw: Any,
    ) -> Proc:
        """Start argv in this host, in a process group of its own (killed as a whole),
        stdin and stdout as pipes, stderr to WORKDIR/LABEL.log."""
        label = label or f"{self.name}-{Path(argv[0]).name}-{len(self.network.procs)}"
        log = self.network.workdir / f"{label}.log"
        with log.open("ab") as stderr:
            popen = subprocess.Popen(
                self.argv(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=harness_env(env, self.network.python_path),
                start_new_session=True,
                **popen_kw,
            )
        proc = proc_class(label, popen, log)
        self.network.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run argv in this host to completion (output captured)."""
        return subprocess.run(
            self.argv(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=harness_env(None, self.network.python_path),
            check=False,
        )

    # -- faults -------------------------------------------------------------------------

    def partition(self) -> None:
        """Pull the cable: the switch port goes down; processes here live on."""
        _ip("link", "set", self.port, "down", ns=self.network.switch_ns)
        self.partitioned = True

    def heal(self) -> None:
        _ip("link", "set", self.port, "up", ns=self.network.switch_ns)
        self.partitioned = False

    def block(self, other: Host, direction: str = "both") -> None:
        """Drop packets between this host and `other`: "out" (this -> other), "in"
        (other -> this) or "both"."""
        for src, dst in self._pairs(other, direction):
            self.network.drop(src, dst, True)

    def unblock(self, other: Host, direction: str = "both") -> None:
        for src, dst in self._pairs(other, direction):
            self.network.drop(src, dst, False)

    def _pairs(self, other: Host, direction: str) -> list[tuple[Host, Host]]:
        pairs = {"out": [(self, other)], "in": [(other, self)]}
        pairs["both"] = pairs["out"] + pairs["in"]
        if direction not in pairs:
            raise ValueError(f"direction is 'in', 'out' or 'both', got {direction!r}")
        return pairs[direction]


Network.host_class = Host
