"""Start and stop real ``streamlib broker`` processes (the sandbox, tests, benchmarks).

The child prints ``broker ID listening on HOST:PORT`` when it serves; start() waits for
that line with a bounded timeout and fails with the child's stderr if it exits first.
With ``pulsar=True`` it serves Pulsar's binary protocol and admin REST API too, and
prints ``pulsar listening on URL`` and ``pulsar admin listening on URL`` next
(restarted, on the same ports).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from bookie.launcher import StdoutLines, open_private_log

_LISTENING = re.compile(r"^broker (\S+) listening on (\S+)")
_PULSAR = re.compile(r"^pulsar listening on (\S+)")
_PULSAR_ADMIN = re.compile(r"^pulsar admin listening on (\S+)")


class BrokerStartError(RuntimeError):
    """``streamlib broker`` exited or stayed silent instead of serving."""


class BrokerProcess:
    def __init__(
        self,
        log_dir: Path,
        metadata_uri: str,
        *,
        name: str = "broker",
        extra: list[str] | None = None,
        pulsar: bool = False,
    ) -> None:
        self.metadata_uri = metadata_uri
        self.extra = list(extra or [])
        self.pulsar = pulsar
        self.pulsar_url = ""  # pulsar://HOST:PORT (pulsar+ssl:// with TLS)
        self.pulsar_port = 0
        self.pulsar_admin_url = ""  # http(s)://HOST:PORT
        self.pulsar_admin_port = 0
        self.stderr_path = log_dir / f"{name}.stderr.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.broker_id = ""
        self.address = ""
        self.port = 0

    def command(self, port: int) -> list[str]:
        return [
            sys.executable, "-m", "streamlib", "broker", "--metadata", self.metadata_uri,
            "--port", str(port), *self.extra,
            *(["--pulsar-port", str(self.pulsar_port),
               "--pulsar-admin-port", str(self.pulsar_admin_port)] if self.pulsar else []),
        ]  # fmt: skip

    def start(self, *, port: int | None = None, timeout_s: float = 60.0) -> BrokerProcess:
        """Start (again on the same port by default) and wait until it serves."""
        self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
        stderr = open_private_log(self.stderr_path)
        try:
            self.proc = subprocess.Popen(
                self.command(self.port if port is None else port),
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        finally:
            os.close(stderr)  # the child has its own copy
        lines = StdoutLines(self.proc)
        line = lines.next(timeout_s)
        m = _LISTENING.match(line)
        if m is None:
            self.kill()
            raise BrokerStartError(f"broker did not start: {line!r}\n{self.stderr_tail()}")
        self.broker_id, self.address = m.group(1), m.group(2)
        self.port = int(self.address.rsplit(":", 1)[1])
        if self.pulsar:
            self.pulsar_url, self.pulsar_port = self._listening(lines, _PULSAR, timeout_s)
            self.pulsar_admin_url, self.pulsar_admin_port = self._listening(
                lines, _PULSAR_ADMIN, timeout_s
            )
        return self

    def _listening(
        self, lines: StdoutLines, pattern: re.Pattern[str], timeout_s: float
    ) -> tuple[str, int]:
        """The URL and port of a "... listening on URL" line it prints next."""
        line = lines.next(timeout_s)
        found = pattern.match(line)
        if found is None:
            self.kill()
            raise BrokerStartError(f"broker did not serve Pulsar: {line!r}\n{self.stderr_tail()}")
        return found.group(1), int(found.group(1).rsplit(":", 1)[1])

    def stderr_tail(self, n: int = 4000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        return 0 if self.proc is None else self.proc.pid

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (gives its streams up) and wait; the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # (a stopped one must run to stop)
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
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

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None
