"""One real sandbox (three `bookie serve` processes on 127.0.0.1 over the embedded
sqlite store) per test module, and `cli(...)`: the `streamlib` command line run as a
subprocess against it, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from streamlib.sandbox import Sandbox

CLI_TIMEOUT_S = 60.0


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def run_cli(
    *args: str,
    metadata: str | None = None,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
) -> Result:
    argv = [sys.executable, "-m", "streamlib.cli", *args]
    if metadata is not None:
        argv += ["--metadata", metadata]
    environment = {k: v for k, v in os.environ.items() if k != "STREAMLIB_METADATA"}
    environment.update(env or {})
    done = subprocess.run(
        argv, input=stdin, capture_output=True, timeout=CLI_TIMEOUT_S, env=environment
    )
    return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.code == 1, result
    assert result.out == ""
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamlib: error: "), result.err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path_factory.mktemp("sandbox"), bookies=3, port_base=0)
    box.start()
    try:
        yield box
    finally:
        box.stop()
    for process in box.processes:
        assert process.proc is None or process.proc.poll() is not None


@pytest.fixture(scope="module")
def uri(sandbox: Sandbox) -> str:
    return sandbox.metadata_uri
