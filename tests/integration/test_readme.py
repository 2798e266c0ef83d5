"""The README's Python examples run as written (against a real cluster)."""

import re
from pathlib import Path

import pytest

import streamlib
from streamlib.errors import InvalidTermError

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_api_example_runs(cluster, capsys):
    cluster.start_bookies(3)
    code = re.sub(r'streamlib\.connect\("[^"]*"\)', "streamlib.connect(URI)", python_blocks()[0])
    exec(compile(code, "README.md", "exec"), {"URI": cluster.metadata_uri})
    printed = capsys.readouterr().out
    assert "b'hello'" in printed and "customer-1" in printed
    assert "[b'entry 0']" in printed


def test_readme_unbounded_example_runs(cluster):
    cluster.start_bookies(3)
    with (
        streamlib.connect(cluster.metadata_uri) as client,
        streamlib.connect(cluster.metadata_uri) as other_client,
    ):
        names = {"client": client, "other_client": other_client}
        exec(compile(python_blocks()[1], "README.md", "exec"), names)
        with pytest.raises(InvalidTermError):
            names["writer"].append(b"from the old term")
