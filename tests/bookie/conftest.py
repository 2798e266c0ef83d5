"""Fixtures for the bookie tests: real ``bookie serve`` processes on 127.0.0.1 with a
sqlite metadata store in the test's tmp dir, and small gRPC helpers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grpc
import pytest

from bookie.launcher import BookieProcess
from bookie.wire import add_results
from bookie.wire import bookie_pb2 as pb
from bookie.wire import bookie_pb2_grpc as pb_grpc

KEY = b"master-key-of-the-ledger"
FAST = ["--session-timeout", "2", "--disk-check-interval", "0.2", "--gc-interval", "3600"]


def payload_of(ledger_id: int, entry_id: int, size: int = 64) -> bytes:
    seed = f"{ledger_id}:{entry_id}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def entry(
    ledger_id: int,
    entry_id: int,
    *,
    lac: int | None = None,
    key: bytes = KEY,
    flags: int = 0,
    term: int = 0,
    size: int = 64,
) -> pb.AddEntry:
    return pb.AddEntry(
        ledger_id=ledger_id,
        entry_id=entry_id,
        last_add_confirmed=entry_id - 1 if lac is None else lac,
        payload=payload_of(ledger_id, entry_id, size),
        digest=b"digest-%d" % entry_id,
        master_key=key,
        flags=flags,
        term=term,
        length=(entry_id + 1) * size,
    )


class Client:
    """A synchronous gRPC client of one bookie (tests read like the scenario)."""

    def __init__(self, address: str) -> None:
        # Connections of its own: a client made after a bookie restart must dial the new
        # process. (Sync channels share connections process-wide, and without gRPC's
        # EventEngine client -- bookie/__init__.py -- nothing polls an idle one, so a
        # connection to the process that died is found dead only when a call is sent.)
        self.channel = grpc.insecure_channel(
            address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.stub = pb_grpc.BookieStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def add(
        self, entries: Iterable[pb.AddEntry], batch: int = 50
    ) -> dict[tuple[int, int], pb.AddResult]:
        items = list(entries)
        reqs = [pb.AddRequest(entries=items[i : i + batch]) for i in range(0, len(items), batch)]
        out: dict[tuple[int, int], pb.AddResult] = {}
        for resp in self.stub.AddStream(iter(reqs), timeout=60):
            for r in add_results(resp):
                out[(r.ledger_id, r.entry_id)] = r
        return out

    def add_one(self, e: pb.AddEntry) -> pb.AddResult:
        return self.add([e])[(e.ledger_id, e.entry_id)]

    def read(
        self, ledger_id: int, first: int, last: int | None = None, **kw: object
    ) -> pb.ReadResponse:
        req = pb.ReadRequest(
            ledger_id=ledger_id,
            first_entry_id=first,
            last_entry_id=first if last is None else last,
            **kw,
        )
        return self.stub.ReadEntries(req, timeout=60)

    def read_lac(self, ledger_id: int, **kw: object) -> pb.ReadLacResponse:
        return self.stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger_id, **kw), timeout=60)


class Cluster:
    """Creates bookies; stops every one at the end of the test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.metadata_uri = f"sqlite:///{root / 'meta.db'}"
        self.bookies: list[BookieProcess] = []
        self.clients: list[Client] = []

    def bookie(
        self,
        name: str = "b0",
        extra: list[str] | None = None,
        *,
        start: bool = True,
        metadata_uri: str | None = None,
    ) -> BookieProcess:
        """A bookie in ROOT/name, on the cluster's store unless metadata_uri names another."""
        b = BookieProcess(
            self.root / name,
            metadata_uri=metadata_uri or self.metadata_uri,
            extra=FAST + (extra or []),
        )
        self.bookies.append(b)
        if start:
            b.start()
        return b

    def client(self, b: BookieProcess) -> Client:
        c = Client(b.address)
        self.clients.append(c)
        return c

    def other_store(self, name: str) -> str:
        """The URI of another, empty sqlite store beside the cluster's."""
        return f"sqlite:///{self.root / name}.db"

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for b in self.bookies:
            b.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def run_in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    box: list[object] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    return t, box
