"""Limits: a client that never reads its answers must not grow a bookie's memory
without bound; a bookie at its call limit refuses new calls and serves on; connection
age and keepalive never cut a client's add stream."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from bookie.launcher import BookieProcess
from bookie.server import BookieConfig, grpc_server_options
from bookie.wire import add_results
from bookie.wire import bookie_pb2 as pb
from tests.bookie.conftest import KEY, Client, Cluster, entry

MiB = 1 << 20
PUSH_BYTES = 150 * MiB
# The bookie stopped reading once the client's send made no progress for this long:
# HTTP/2 flow control then holds the client's next message.
STALLED_S = 3.0
PUSH_DEADLINE_S = 180.0
SAMPLE_S = 0.05
# Python heap fragmentation, gRPC's transport buffers and the HTTP/2 windows, the
# request being handled: what a bookie may hold beyond its configured limits.
SLACK = 32 * MiB


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    assert m is not None, status
    return int(m.group(1)) * 1024


def entries_handled(bookie: BookieProcess) -> int:
    """Entries the bookie has answered or queued an answer for: acknowledged + refused."""
    text = bookie.metrics_text()
    values = re.findall(
        r"^bookie_add_(?:entries|errors)_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M
    )
    return int(sum(float(v) for v in values))


class Push:
    """An AddStream whose answers are never read: gRPC's own request thread pulls the
    requests, so the pushing never blocks the test, only that thread."""

    def __init__(self, client: Client, request: Callable[[int], pb.AddRequest]) -> None:
        self.pushed_bytes = 0
        self.pushed_entries = 0
        self._lock = threading.Lock()

        def requests() -> Iterator[pb.AddRequest]:
            n = 0
            while self.pushed_bytes < PUSH_BYTES:
                req = request(n)
                n += 1
                yield req
                # gRPC asks for the next request only once this one was sent.
                with self._lock:
                    self.pushed_bytes += req.ByteSize()
                    self.pushed_entries += len(req.entries)

        self.call = client.stub.AddStream(requests())

    def progress(self) -> tuple[int, int]:
        with self._lock:
            return self.pushed_bytes, self.pushed_entries


def push_and_watch_rss(bookie: BookieProcess, push: Push) -> tuple[int, bool]:
    """Sample the bookie's RSS while ``push`` runs until it pushed PUSH_BYTES or stalled;
    (the highest RSS seen, whether it stalled). Cancels the call either way."""
    assert bookie.proc is not None
    pid = bookie.proc.pid
    highest = rss_bytes(pid)
    tick = threading.Event()  # never set: its wait is the bounded sampling interval
    deadline = time.monotonic() + PUSH_DEADLINE_S
    last, last_change = -1, time.monotonic()
    stalled = False
    try:
        while True:
            highest = max(highest, rss_bytes(pid))
            pushed, entries = push.progress()
            now = time.monotonic()
            if pushed != last:
                last, last_change = pushed, now
            if pushed >= PUSH_BYTES:
                break
            if now - last_change > STALLED_S:
                stalled = True
                break
            assert now < deadline, f"pushed only {pushed} bytes in {PUSH_DEADLINE_S}s"
            assert not push.call.done(), f"the add stream ended: {push.call.code()}"
            tick.wait(SAMPLE_S)
        if not stalled:
            # Everything was sent: let the bookie handle (and answer into its queue) what
            # is still in transit before the last samples, within a bound.
            while entries_handled(bookie) < entries and time.monotonic() < deadline:
                highest = max(highest, rss_bytes(pid))
                tick.wait(SAMPLE_S)
        highest = max(highest, rss_bytes(pid))
    finally:
        push.call.cancel()
    return highest, stalled


def still_serves(cluster: Cluster, bookie: BookieProcess, ledger_id: int) -> None:
    fresh = cluster.client(bookie)
    assert fresh.add_one(entry(ledger_id, 0)).status == pb.OK
    got = fresh.read(ledger_id, 0)
    assert got.status == pb.OK and got.results[0].status == pb.OK


def assert_rss_stays_below(
    cluster: Cluster, bookie: BookieProcess, request: Callable[[int], pb.AddRequest], limits: int
) -> None:
    """Push adds nobody reads the answers of; the bookie's RSS must stay below its
    RSS before + ``limits`` (what its configuration lets it hold) + SLACK."""
    assert bookie.proc is not None
    baseline = rss_bytes(bookie.proc.pid)
    push = Push(cluster.client(bookie), request)
    highest, stalled = push_and_watch_rss(bookie, push)
    pushed, _ = push.progress()
    bound = baseline + limits + SLACK
    assert highest < bound, (
        f"RSS grew from {baseline / MiB:.0f} to {highest / MiB:.0f} MiB while the client "
        f"pushed {pushed / MiB:.0f} MiB of adds (bound {bound / MiB:.0f} MiB; "
        f"the bookie {'stopped' if stalled else 'never stopped'} reading)"
    )
    still_serves(cluster, bookie, 2)


def test_refused_adds_nobody_reads_do_not_grow_the_bookie(cluster: Cluster) -> None:
    bookie = cluster.bookie()
    assert cluster.client(bookie).add_one(entry(1, 0)).status == pb.OK  # ledger 1, with KEY
    wrong_key = b"not-" + KEY

    def refused(n: int) -> pb.AddRequest:
        # Small entries: each refusal (status + message) is about half the entry's size,
        # and all of it waits in the bookie for a client that does not read.
        return pb.AddRequest(
            entries=[entry(1, 1 + 100 * n + i, key=wrong_key, size=8) for i in range(100)]
        )

    # Nothing reaches the journal: only the answers (default limit 4 MiB) can pile up.
    assert_rss_stays_below(cluster, bookie, refused, 4 * MiB)


def test_accepted_adds_nobody_reads_do_not_grow_the_bookie(cluster: Cluster) -> None:
    flush = 4 * MiB
    inflight = 8 * MiB
    extra = ["--flush-bytes", str(flush), "--max-stream-inflight-bytes", str(inflight)]
    bookie = cluster.bookie(extra=extra)
    assert cluster.client(bookie).add_one(entry(1, 0)).status == pb.OK

    def accepted(n: int) -> pb.AddRequest:
        return pb.AddRequest(entries=[entry(1, 1 + 25 * n + i, size=4096) for i in range(25)])

    # Answers (4 MiB), entries waiting for the journal, and the write cache: at most 4x
    # the flush size before adds are refused, plus as much again being flushed.
    assert_rss_stays_below(cluster, bookie, accepted, 4 * MiB + inflight + 8 * flush)


def test_tight_stream_limits_still_answer_every_add(cluster: Cluster) -> None:
    # Limits of one byte: the stream pauses after every request until its answer is
    # written and its entries are durable. A client that reads gets every answer.
    extra = ["--max-stream-answer-bytes", "1", "--max-stream-inflight-bytes", "1"]
    bookie = cluster.bookie(extra=extra)
    client = cluster.client(bookie)
    assert client.add_one(entry(7, 0)).status == pb.OK
    adds = [entry(1, i) for i in range(600)] + [entry(7, i, key=b"wrong") for i in range(1, 300)]
    answers = client.add(adds, batch=20)
    assert {k: r.status for k, r in answers.items()} == {
        (e.ledger_id, e.entry_id): pb.OK if e.ledger_id == 1 else pb.UNAUTHORIZED for e in adds
    }
    got = client.read(1, 0, 599)
    assert [r.entry.payload for r in got.results] == [e.payload for e in adds[:600]]


class OpenAddStream:
    """An add stream kept open: one call the bookie counts as running."""

    def __init__(self, client: Client) -> None:
        self._requests: queue.Queue[pb.AddRequest | None] = queue.Queue()

        def requests() -> Iterator[pb.AddRequest]:
            while (req := self._requests.get()) is not None:
                yield req

        self._answers = client.stub.AddStream(requests(), timeout=60)

    def add(self, e: pb.AddEntry) -> int:
        self._requests.put(pb.AddRequest(entries=[e]))
        return int(add_results(next(self._answers))[0].status)

    def close(self) -> None:
        self._requests.put(None)
        assert list(self._answers) == []


def test_calls_past_the_concurrency_limit_are_refused_and_the_bookie_serves_on(
    cluster: Cluster,
) -> None:
    bookie = cluster.bookie(extra=["--max-concurrent-rpcs", "3"])
    holder = cluster.client(bookie)
    streams = [OpenAddStream(holder) for _ in range(3)]
    for i, s in enumerate(streams):
        assert s.add(entry(1, i)) == pb.OK  # each call is running on the bookie
    other = cluster.client(bookie)
    with pytest.raises(grpc.RpcError) as refused:
        other.read(1, 0)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert streams[0].add(entry(1, 3)) == pb.OK  # the calls it runs go on
    streams.pop().close()
    deadline = time.monotonic() + 30
    while True:  # the slot frees once the bookie has finished the call
        try:
            got = other.read(1, 0, 3)
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "the finished call's slot was never freed"
    assert [r.status for r in got.results] == [pb.OK] * 4
    for s in streams:
        s.close()


def test_an_add_stream_outlives_the_connection_age(cluster: Cluster) -> None:
    # Past its age a connection takes no new calls, but its add stream goes on: cut, it
    # would look like a bookie failure to the writer (an ensemble change for nothing).
    age_s = 1.0
    bookie = cluster.bookie(extra=["--max-connection-age", str(age_s)])
    client = cluster.client(bookie)
    stream = OpenAddStream(client)
    opened = time.monotonic()
    pace = threading.Event()  # never set: its wait paces the adds
    entry_id = 0
    while time.monotonic() - opened < 3 * age_s:
        assert stream.add(entry(1, entry_id)) == pb.OK
        # New calls on the same channel move to a fresh connection.
        assert client.read(1, entry_id).results[0].status == pb.OK
        entry_id += 1
        pace.wait(0.1)
    stream.close()
    assert entry_id > 3


def test_client_keepalive_pings_no_more_often_than_a_bookie_permits() -> None:
    # A client pinging more often than the bookie permits gets GOAWAY "too_many_pings",
    # which fails every call on the connection, the add stream included.
    from streamlib.ledger.bookie_client import CHANNEL_OPTIONS

    client = dict(CHANNEL_OPTIONS)
    server = dict(grpc_server_options(BookieConfig(data_dir=Path("unused"))))
    assert (
        client["grpc.keepalive_time_ms"]
        >= 2 * server["grpc.http2.min_ping_interval_without_data_ms"]
    )
    assert (
        client["grpc.keepalive_permit_without_calls"]
        <= server["grpc.keepalive_permit_without_calls"]
    )
