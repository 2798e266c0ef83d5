"""`streamlib sandbox`: starts, serves, stops cleanly; restarts keep data; the demo."""

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pulsar
import pytest

import streamlib

STREAMLIB = [sys.executable, "-m", "streamlib.cli"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes; our children are reaped by the sandbox.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


class RunningSandbox:
    def __init__(self, data_dir: Path, bookies: int = 3) -> None:
        self.proc = subprocess.Popen(
            [*STREAMLIB, "sandbox", "--json", "--data-dir", str(data_dir),
             "--bookies", str(bookies), "--port-base", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the sandbox prints it once ready (bounded below)
        if not line:
            self.proc.wait(timeout=30)
            pytest.fail(f"sandbox exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
        self.info = json.loads(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def sandboxes():
    started: list[RunningSandbox] = []

    def start(data_dir: Path, bookies: int = 3) -> RunningSandbox:
        sandbox = RunningSandbox(data_dir, bookies)
        started.append(sandbox)
        return sandbox

    yield start
    for sandbox in started:
        sandbox.stop()
        for b in sandbox.info["bookies"] + sandbox.info.get("brokers", []):
            if alive(b["pid"]):
                os.kill(b["pid"], signal.SIGKILL)


def test_sandbox_reports_json_then_stops_cleanly(sandboxes, tmp_path):
    sandbox = sandboxes(tmp_path / "sb", bookies=3)
    info = sandbox.info
    assert info["metadata"] == f"sqlite://{tmp_path / 'sb' / 'meta.db'}"
    assert [b["id"] for b in info["bookies"]] == [f"sandbox-bookie-{i}" for i in range(3)]
    assert all(b["address"].startswith("127.0.0.1:") for b in info["bookies"])
    pids = [b["pid"] for b in info["bookies"]]
    assert all(alive(pid) for pid in pids)
    with streamlib.connect(info["metadata"]) as client:
        registered = {b.bookie_id for b in client.registry.list()}
    assert registered == {b["id"] for b in info["bookies"]}
    # One broker by default: the stream service, at service_url.
    [broker] = info["brokers"]
    assert broker["id"] == "sandbox-broker-0" and alive(broker["pid"])
    assert info["service_url"] == f"streamlib://{broker['address']}"
    with streamlib.connect(info["service_url"]) as client:
        first = client.create_producer("through-the-broker", producer_name="one")
        second = client.create_producer("through-the-broker", producer_name="two")
        assert first.send(b"a").entry_id >= 0 and second.send(b"b").entry_id >= 0
    # ... and Pulsar's ports: its binary protocol (pulsar_url) and admin REST API.
    assert info["pulsar_url"] == broker["pulsar_url"]
    assert info["pulsar_url"].startswith("pulsar://127.0.0.1:")
    assert info["pulsar_admin_url"].startswith("http://127.0.0.1:")
    client = pulsar.Client(info["pulsar_url"], operation_timeout_seconds=30)
    try:
        reader = client.create_reader("through-the-broker", pulsar.MessageId.earliest)
        assert {reader.read_next(30_000).data() for _ in range(2)} == {b"a", b"b"}
    finally:
        client.close()
    with urllib.request.urlopen(f"{info['pulsar_admin_url']}/admin/v2/clusters", timeout=30) as r:
        assert json.load(r) == ["streamlib"]
    assert sandbox.stop() == 0
    assert not any(alive(pid) for pid in [*pids, broker["pid"]])


def test_restart_on_the_same_data_dir_keeps_the_data(sandboxes, tmp_path):
    first = sandboxes(tmp_path / "sb")
    with streamlib.connect(first.info["metadata"]) as client:
        writer = client.ledgers.create(3, 3, 2, password=b"pw")
        ids = writer.append_many([b"kept-%d" % i for i in range(50)])
        writer.close()
    assert first.stop() == 0
    second = sandboxes(tmp_path / "sb")
    with streamlib.connect(second.info["metadata"]) as client:
        reader = client.ledgers.open(writer.ledger_id, password=b"pw")
        assert reader.read(0, ids[-1]) == [b"kept-%d" % i for i in range(50)]


@pytest.mark.parametrize("secure", [False, True], ids=["plaintext", "secure"])
def test_demo_runs_end_to_end_and_exits_zero(tmp_path, secure):
    result = subprocess.run(
        [*STREAMLIB, "sandbox", "--demo", "--data-dir", str(tmp_path / "demo")]
        + (["--secure"] if secure else []),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "sandbox ready: 3 bookies" in out
    if secure:
        assert "TLS to every bookie" in out
        assert "the reader token may not produce: UnauthorizedError" in out
    assert "received all 1000 in order" in out
    assert "StreamFencedError" in out
    assert "resumed from its durable cursor" in out
    assert "two producer processes publish to 'demo-jobs'" in out
    assert "both producers' 1000 messages arrived once each" in out
    assert "demo finished: OK" in out
    assert "sandbox stopped" in out


@pytest.mark.parametrize("args", [["--bookies", "zero"], ["--no-such-flag"]])
def test_bad_arguments_are_usage_errors(args):
    result = subprocess.run(
        [*STREAMLIB, "sandbox", *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "usage" in result.stderr.lower()


@pytest.fixture
def secure_sandbox(tmp_path):
    """A secure sandbox (one bookie, one broker) started in this process under umask
    022 (files would be 0644 unless created private); stopped at the end."""
    from streamlib.sandbox import Sandbox

    umask = os.umask(0o022)
    try:
        sandbox = Sandbox(tmp_path / "sb", bookies=1, port_base=0, secure=True, brokers=1)
        with sandbox:
            yield sandbox
    finally:
        os.umask(umask)


def test_no_process_of_a_secure_sandbox_shows_a_credential_on_its_command_line(secure_sandbox):
    security = secure_sandbox.security
    secrets = [*security.tokens.values(), security.broker_token]
    secrets.append(security.secret_file.read_text().strip())
    pids = [p.proc.pid for p in secure_sandbox.processes] + [b.pid for b in secure_sandbox.brokers]
    seen = set()
    for entry in Path("/proc").iterdir():  # every process: a child may start children
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        seen.add(int(entry.name))
        leaked = [s for s in secrets if s in cmdline]
        for secret in leaked:  # (the failure shows where, not the secret itself)
            cmdline = cmdline.replace(secret, "<SECRET>")
        if leaked:
            pytest.fail(f"pid {entry.name} shows a credential: {cmdline.split(chr(0))}")
    assert set(pids) <= seen  # the bookies' and the broker's were among those read


def test_every_file_a_secure_sandbox_writes_is_private(secure_sandbox):
    """Logs, credentials, the metadata store and the bookies' storage alike: files
    0600, directories 0700, checked while it runs and after it stopped."""

    def exposed() -> list[str]:
        paths = [secure_sandbox.data_dir, *secure_sandbox.data_dir.rglob("*")]
        return [
            f"{path} {oct(path.stat().st_mode & 0o777)}"
            for path in paths
            if path.stat().st_mode & 0o077
        ]

    names = {p.name for p in secure_sandbox.data_dir.iterdir()}
    assert {"meta.db", "security", "bookie-0.stderr.log", "broker-0.stderr.log"} <= names
    running = exposed()
    assert not running, "\n".join(running)
    secure_sandbox.stop()
    stopped = exposed()
    assert not stopped, "\n".join(stopped)
