"""A throwaway local cluster for benchmarks: N `bookie serve` processes over a sqlite
metadata store in a temporary directory, stopped on exit."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bookie.launcher import BookieProcess


@dataclass
class LocalCluster:
    root: Path
    metadata_uri: str
    bookies: list[BookieProcess]


@contextlib.contextmanager
def local_cluster(bookies: int = 3, extra: list[str] | None = None) -> Iterator[LocalCluster]:
    with tempfile.TemporaryDirectory(prefix="streamlib-bench-") as tmp:
        root = Path(tmp)
        uri = f"sqlite://{root / 'meta.db'}"
        started: list[BookieProcess] = []
        try:
            for i in range(bookies):
                started.append(
                    BookieProcess(root / f"bookie{i}", metadata_uri=uri, extra=extra).start()
                )
            yield LocalCluster(root, uri, started)
        finally:
            for b in started:
                b.stop()
