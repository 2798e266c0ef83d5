"""Every example in examples/ runs to completion against a real sandbox and says OK."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("pubsub.py", "the cursor resumed with ['order 6', 'order 7', 'order 8', 'order 9']"),
        ("tailing_reader.py", "reader got"),
        ("two_writers_takeover.py", "writer A's next send failed: StreamFencedError"),
    ],
)
def test_example_runs_against_the_sandbox(uri: str, script: str, says: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), uri], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert says in done.stdout
    assert done.stdout.rstrip().endswith("example: OK")
