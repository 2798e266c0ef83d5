"""Start and stop real ``bookie serve`` processes (for the benchmark, tests and sandboxes).

The child prints one line when it serves: ``bookie ID listening on HOST:PORT
(metrics HOST:MPORT)``, then `` (framed HOST:FPORT)`` when it has a framed add port;
:meth:`BookieProcess.start` waits for it with a bounded timeout and fails with the
child's stderr if it exits first.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

_LISTENING = re.compile(
    r"^bookie (\S+) listening on (\S+):(\d+) \(metrics (\S+):(\d+)\)(?: \(framed (\S+):(\d+)\))?"
)


class BookieStartError(RuntimeError):
    """``bookie serve`` exited or stayed silent instead of serving."""


def open_private_log(path: Path) -> int:
    """A child's stderr log (a file descriptor), appended to and readable by its owner
    only, whatever the umask: it names principals, addresses and files. An existing log
    is tightened to 0600 too (O_CREAT leaves its mode alone)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return fd


class StdoutLines:
    """A child's stdout, a line at a time, each within a bounded wait: what a read
    brought past a line is kept for the next (a child may print two lines at once)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self._buffer = b""

    def next(self, timeout_s: float) -> str:
        """The next line; the text so far and why, if the child exits or times out first."""
        stdout = self.proc.stdout
        assert stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        try:
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return self._buffer.decode(errors="replace") + " (timed out)"
                if sel.select(remaining):
                    chunk = os.read(stdout.fileno(), 4096)
                    if not chunk:
                        return (
                            self._buffer.decode(errors="replace") + f" (exited {self.proc.wait()})"
                        )
                    self._buffer += chunk
        finally:
            sel.close()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode(errors="replace")


class BookieProcess:
    def __init__(
        self, data_dir: Path, *, metadata_uri: str | None = None, extra: list[str] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.metadata_uri = metadata_uri
        self.extra = list(extra or [])
        self.env: dict[str, str] = {}  # extra environment for the next start (failpoints)
        self.proc: subprocess.Popen[bytes] | None = None
        self.bookie_id = ""
        self.port = 0
        self.metrics_port = 0
        self.framed_port = 0  # 0: the bookie serves no framed add port
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self, port: int = 0) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "bookie",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(port),
        ]
        if self.metadata_uri:
            cmd += ["--metadata", self.metadata_uri]
        return cmd + self.extra

    def start(self, *, port: int | None = None, timeout_s: float = 30.0) -> BookieProcess:
        """Start (or restart, on the same port by default) and wait for the listening line."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        use_port = self.port if port is None else port
        stderr = open_private_log(self.stderr_path)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        try:
            self.proc = subprocess.Popen(
                self.command(use_port), stdout=subprocess.PIPE, stderr=stderr, env=env
            )
        finally:
            os.close(stderr)  # the child has its own copy
        assert self.proc.stdout is not None
        line = StdoutLines(self.proc).next(timeout_s)
        m = _LISTENING.match(line)
        if m is None:
            self.kill()
            raise BookieStartError(f"bookie did not start: {line!r}\n{self.stderr_tail()}")
        self.bookie_id, self.port, self.metrics_port = m.group(1), int(m.group(3)), int(m.group(5))
        self.framed_port = int(m.group(7) or 0)
        return self

    def run_to_exit(self, timeout_s: float = 30.0) -> tuple[int, str]:
        """Start and expect the child to exit (a refused start); (exit code, stderr)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            self.command(self.port), capture_output=True, timeout=timeout_s, check=False
        )
        return proc.returncode, proc.stderr.decode(errors="replace")

    def stderr_tail(self, n: int = 4000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (graceful: flush, unregister) and wait; the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._close()
        return rc

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        """Wait for the child to end on its own (a failpoint); its exit code."""
        assert self.proc is not None
        rc = self.proc.wait(timeout_s)
        self._close()
        return rc

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def admin(
        self, method: str, path: str, *, token: str | None = None, ca: Path | None = None
    ) -> dict[str, object]:
        """Call the admin HTTP port (HTTPS trusting ca when given; the token as a bearer).
        HTTP errors raise urllib.error.HTTPError (its .code is the status)."""
        with self._http(method, path, token, ca) as resp:
            result: dict[str, object] = json.loads(resp.read())
            return result

    def metrics_text(self, *, token: str | None = None, ca: Path | None = None) -> str:
        with self._http("GET", "/metrics", token, ca) as resp:
            return str(resp.read().decode())

    def _http(self, method: str, path: str, token: str | None, ca: Path | None) -> Any:
        scheme = "https" if ca is not None else "http"
        req = urllib.request.Request(
            f"{scheme}://127.0.0.1:{self.metrics_port}{path}", method=method
        )
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
        return urllib.request.urlopen(req, timeout=30, context=context)
