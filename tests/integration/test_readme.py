"""The README's Python example runs as written (against a real cluster)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs(cluster, capsys):
    cluster.start_bookies(3)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1
    code = re.sub(r'streamlib\.connect\("[^"]*"\)', "streamlib.connect(URI)", blocks[0])
    exec(compile(code, "README.md", "exec"), {"URI": cluster.metadata_uri})
    printed = capsys.readouterr().out
    assert "b'hello'" in printed and "customer-1" in printed
    assert "[b'entry 0']" in printed
