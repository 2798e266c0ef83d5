"""The documentation site builds with mkdocs --strict (any warning fails: a broken link,
a docstring mkdocstrings cannot read, an API name that moved), and every Python example
in docs/ runs as written against a real cluster."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_site_builds_strictly_with_the_api_reference(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    blocking = (tmp_path / "site" / "api" / "blocking" / "index.html").read_text()
    for name in ("send_async", "batch_receive", "ConsumerType", "DeadLetterPolicy"):
        assert name in blocking, name
    assert "IncompatibleSchemaError" in (tmp_path / "site/api/schemas/index.html").read_text()
    assert "Coming from pulsar-client" in (tmp_path / "site" / "index.html").read_text()


# Pages whose examples run both ways: URI is the metadata store's, then a broker's.
BOTH_MODES = ("pulsar.md",)


def examples() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        where = str(page.relative_to(DOCS))
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            found.append((f"{where}#{i}", code))
            if where in BOTH_MODES:
                found.append((f"{where}#{i}@service", code))
    return found


@pytest.mark.parametrize(("where", "code"), examples(), ids=[w for w, _ in examples()])
def test_every_example_runs_as_written(cluster, capsys, where: str, code: str) -> None:
    cluster.start_bookies(3)
    # A module of its own, as a script would be (dataclasses look their module up).
    module = types.ModuleType("docs_example")
    module.URI = cluster.metadata_uri  # type: ignore[attr-defined]
    if where.endswith("@service"):  # the same example through the stream service
        cluster.start_brokers(1)
        module.URI = cluster.service_url  # type: ignore[attr-defined]
    if "PULSAR_URL" in code:  # pulsar-client's own: a broker's Pulsar port
        cluster.start_brokers(1, pulsar=True)
        module.PULSAR_URL = cluster.pulsar_url  # type: ignore[attr-defined]
    if "SERVICE_URL" in code:  # an example of the stream service: a broker too
        cluster.start_brokers(1)
        module.SERVICE_URL = cluster.service_url  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, where, "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    assert capsys.readouterr().out  # each example prints what it shows
