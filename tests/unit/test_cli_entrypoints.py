"""The console scripts are installed and print usage."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def script(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    assert found, f"console script {name} is not installed (pip install -e .)"
    return found


@pytest.mark.parametrize("name", ["streamlib", "bookie"])
def test_help_prints_usage(name):
    result = subprocess.run([script(name), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout.lower()


def test_unknown_subcommand_is_a_usage_error():
    result = subprocess.run(
        [script("streamlib"), "no-such-command"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "usage" in result.stderr.lower()
