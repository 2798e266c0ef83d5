"""What clients that never read cost a real `streamlib broker` process, measured from
/proc: its RSS (VmRSS) and its CPU time (utime + stime). Helpers for
tests/integration/test_broker_bounds.py, and a script that prints the figures:

    python -m tests.integration.broker_load [a] [b] [c] [--sessions N] [-- BROKER FLAGS]

(from the repository's root: three bookies and a broker on 127.0.0.1 over sqlite in a
temporary directory; the flags after `--` go to `streamlib broker`.)

  a. a 96 MiB backlog, three subscriptions, one consumer each granting one permit;
  b. a 62 MiB backlog, eight subscriptions, one consumer each granting 2**32-1 permits;
  c. idle Consume sessions on one shared subscription: RSS, and CPU while they idle.

Clients are raw gRPC calls (broker_pb2): each writes its Open (and a Flow), reads its
first answer, and then reads nothing more -- what a careless or hostile client does.

A growth is measured from a baseline taken once the broker owns the stream, so what a
takeover costs is not counted; and the backlog's stream is taken over by a first broker
that is then stopped (its dedup snapshot written), so the measured broker does not scan
the whole backlog when it takes the stream over (that scan's memory, freed but kept by
the allocator, would be reused by the read-ahead and hide part of it).
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import collections
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from streamlib.broker.launcher import BrokerProcess
from streamlib.ledger.bookie_client import BookieClientConfig
from streamlib.wire import broker_pb2 as pb
from streamlib.wire import broker_pb2_grpc as pb_grpc

MiB = 1 << 20
KiB = 1 << 10
MAX_PERMITS = 2**32 - 1  # a Flow's permits is a uint32
# The default metadata session (10 s), not the integration tests' 2 s: a broker busy
# reading ahead or opening thousands of sessions stalls its event loop long enough to
# lose a 2 s session, and with it the stream (seen here: NotOwnerError) -- not what is
# measured.
LOADED_BROKER = ["--session-timeout", "10"]
CALLS_PER_CHANNEL = 50  # (a broker may limit concurrent streams per connection; 50 is far below)
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


# -- the broker process, from /proc ------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """The process's resident set (VmRSS)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    raise ProcessLookupError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time the process used so far, in user and kernel mode (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        # (the command name, field 2, may hold spaces: count fields after its ')')
        fields = stat.read().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _TICKS_PER_S


async def cpu_share(pid: int, window_s: float) -> float:
    """The share of one core the process used over the next window_s."""
    before, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(window_s)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


@dataclass(frozen=True)
class Settled:
    peak_rss: int  # the highest RSS seen while waiting
    settled: bool  # False: timeout_s passed before the process was quiet
    after_s: float


async def until_quiet(
    pid: int,
    *,
    quiet_s: float = 3.0,
    timeout_s: float = 40.0,
    interval_s: float = 0.25,
    rss_slack: int = 2 * MiB,
    busy_share: float = 0.15,
) -> Settled:
    """Sample the process until it is quiet -- over the last quiet_s its RSS moved less
    than rss_slack and it used less than busy_share of a core (a broker reading ahead is
    busy) -- or timeout_s passed; the peak RSS seen meanwhile."""
    started = time.monotonic()
    window: collections.deque[tuple[float, int, float]] = collections.deque(
        maxlen=round(quiet_s / interval_s) + 1
    )
    peak = 0
    while True:
        now, rss = time.monotonic(), rss_bytes(pid)
        peak = max(peak, rss)
        window.append((now, rss, cpu_seconds(pid)))
        if len(window) == window.maxlen:
            span = window[-1][0] - window[0][0]
            rss_moved = max(w[1] for w in window) - min(w[1] for w in window)
            share = (window[-1][2] - window[0][2]) / span
            if rss_moved < rss_slack and share < busy_share:
                return Settled(peak, True, now - started)
        if now - started > timeout_s:
            return Settled(peak, False, now - started)
        await asyncio.sleep(interval_s)


# -- raw sessions ------------------------------------------------------------------------


class RawSessions:
    """Produce and Consume calls to one broker that read their first answer and nothing
    more (the sessions: those answered Ready); CALLS_PER_CHANNEL calls share a
    connection. token: sent as a bearer token."""

    def __init__(self, address: str, token: str | None = None) -> None:
        self.address = address
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.calls: list[Any] = []
        self._channels: list[tuple[grpc.aio.Channel, pb_grpc.BrokerStub]] = []
        self._opened = 0

    def _stub(self) -> pb_grpc.BrokerStub:
        if self._opened % CALLS_PER_CHANNEL == 0:
            channel = grpc.aio.insecure_channel(self.address)
            self._channels.append((channel, pb_grpc.BrokerStub(channel)))
        self._opened += 1
        return self._channels[-1][1]

    async def consume(
        self,
        stream: str,
        subscription: str = "",
        *,
        consumer_type: str = "",
        initial_position: str = "",
        permits: int = 0,
    ) -> pb.ConsumeResponse:
        """A consumer (a reader without subscription); its first answer. permits: one
        Flow of that many after a Ready."""
        call = self._stub().Consume(metadata=self.metadata)
        opened = pb.ConsumerOpen(stream=stream, subscription=subscription,
                                 consumer_type=consumer_type,
                                 initial_position=initial_position,
                                 protocol_version=2)  # fmt: skip
        first = await self._open(call, pb.ConsumeRequest(open=opened))
        if permits and first.WhichOneof("kind") == "ready":
            await call.write(pb.ConsumeRequest(flow=pb.Flow(permits=permits)))
        return first

    async def create(self, stream: str) -> None:
        """Create the stream (a consumer's open does not)."""
        await self._stub().Admin(
            pb.AdminRequest(call="create", arguments_json=json.dumps({"name": stream})),
            metadata=self.metadata,
        )

    async def produce(self, stream: str, producer_name: str) -> pb.ProduceResponse:
        """A producer that sends nothing; its first answer."""
        call = self._stub().Produce(metadata=self.metadata)
        opened = pb.ProducerOpen(stream=stream, producer_name=producer_name)
        return await self._open(call, pb.ProduceRequest(open=opened))

    async def _open(self, call: Any, opening: Any) -> Any:
        """The call's first answer; a call answered Ready is kept open (in self.calls),
        any other ended."""
        try:
            first = await _first_answer(call, opening)
        except BaseException:
            call.cancel()
            raise
        if first.WhichOneof("kind") == "ready":
            self.calls.append(call)
        else:
            call.cancel()
        return first

    def close(self, count: int | None = None) -> None:
        """Cancel the last `count` sessions opened (all: None)."""
        count = len(self.calls) if count is None else count
        for _ in range(count):
            self.calls.pop().cancel()

    async def aclose(self) -> None:
        self.close()
        for channel, _stub in self._channels:
            await channel.close(None)
        self._channels.clear()


async def _first_answer(call: Any, opening: Any) -> Any:
    # Reading already while the Open is written: a broker may refuse a call before it
    # reads its Open (the write then fails, and a read begun after it fails too).
    reading = asyncio.ensure_future(call.read())
    with contextlib.suppress(grpc.aio.BaseError, grpc.RpcError, asyncio.InvalidStateError):
        await call.write(opening)
    first = await reading
    if first is grpc.aio.EOF:  # type: ignore[attr-defined]
        raise AssertionError(f"the call ended without an answer: {await call.code()}")
    return first


def answer_kind(answer: Any) -> str:
    """ready, error:CODE, heartbeat, ..."""
    kind = answer.WhichOneof("kind")
    return f"error:{answer.error.code}" if kind == "error" else kind


async def open_many(opens: list[Any], at_once: int = 100) -> list[str]:
    """Await the opens (coroutines), at_once at a time; their answers' kinds."""
    kinds: list[str] = []
    for start in range(0, len(opens), at_once):
        answers = await asyncio.gather(*opens[start : start + at_once])
        kinds += [answer_kind(a) for a in answers]
    return kinds


async def heard_within(call: Any, window_s: float) -> str | None:
    """What the broker sends next on the call (its kind, or "the end") if it sends
    anything within window_s; None if nothing."""
    try:
        answer = await asyncio.wait_for(call.read(), window_s)
    except builtins.TimeoutError:
        return None
    return "the end" if answer is grpc.aio.EOF else answer_kind(answer)  # type: ignore[attr-defined]


# -- scenarios ---------------------------------------------------------------------------


async def publish_backlog(cluster: Any, stream: str, count: int, size: int) -> None:
    """count messages of size bytes, published in direct mode, then the stream taken over
    by a broker that is stopped at once: its snapshot spares the next owner the scan."""
    # (The cluster's clients time out in 3 s, for tests of failures; a backlog written
    # while other tests load the machine may take longer, and must not change bookies.)
    client = await cluster.client(bookie_config=BookieClientConfig(add_timeout_s=30.0))
    producer = await client.create_producer(stream, max_pending_messages=64)
    filler = os.urandom(size - 16)
    for i in range(count):
        await producer.send_async(b"%016d" % i + filler)
    await producer.flush()
    await producer.close()
    [first] = cluster.start_brokers(1, extra=LOADED_BROKER)
    await own(first.address, stream)
    assert first.stop() == 0, first.stderr_tail()


async def own(address: str, stream: str) -> None:
    """Have the broker take the stream over (a consumer at latest, opened and closed)."""
    sessions = RawSessions(address)
    try:
        first = await sessions.consume(stream, "warm-up", initial_position="latest")
        assert answer_kind(first) == "ready", first
    finally:
        await sessions.aclose()


@dataclass(frozen=True)
class Growth:
    rss: int  # peak RSS over the baseline
    settled: Settled

    def __str__(self) -> str:
        quiet = "quiet" if self.settled.settled else "NOT quiet"
        return f"+{self.rss / MiB:.0f} MiB ({quiet} after {self.settled.after_s:.0f} s)"


async def read_ahead_growth(
    broker: BrokerProcess, stream: str, subscriptions: int, permits: int, **quiet: Any
) -> Growth:
    """The broker owns the backlog's stream: one consumer per subscription (from the
    earliest) grants `permits` and reads nothing; the RSS growth once the broker is quiet."""
    await own(broker.address, stream)
    await until_quiet(broker.pid, quiet_s=1.0, timeout_s=10)
    baseline = rss_bytes(broker.pid)
    sessions = RawSessions(broker.address)
    try:
        for i in range(subscriptions):
            first = await sessions.consume(
                stream, f"sub-{i}", initial_position="earliest", permits=permits
            )
            assert answer_kind(first) == "ready", first
        settled = await until_quiet(broker.pid, **quiet)
        return Growth(settled.peak_rss - baseline, settled)
    finally:
        await sessions.aclose()


@dataclass(frozen=True)
class IdleCost:
    answers: collections.Counter[str]  # to the opens, by kind (ready: a session)
    growth: Growth
    cpu_share: float  # of one core, while the sessions idle

    def __str__(self) -> str:
        return (f"{self.answers['ready']} sessions: RSS {self.growth}, CPU "
                f"{100 * self.cpu_share:.0f}% of a core; answers {dict(self.answers)}")  # fmt: skip


async def idle_sessions_cost(
    broker: BrokerProcess, count: int, cpu_window_s: float = 5.0
) -> IdleCost:
    """count shared consumers of one subscription of an empty stream, opened and never
    read: the broker's RSS growth, and its CPU share over cpu_window_s while they idle."""
    sessions = RawSessions(broker.address)
    try:
        await sessions.create("idle")
        first = await sessions.consume("idle", "idle", consumer_type="shared")
        assert answer_kind(first) == "ready", first  # (the stream owned, the dispatcher made)
        await until_quiet(broker.pid, quiet_s=1.0, timeout_s=10)
        baseline = rss_bytes(broker.pid)
        opens = [sessions.consume("idle", "idle", consumer_type="shared") for _ in range(count)]
        answers = collections.Counter(await open_many(opens))
        # (Quiet: its RSS steady. Its CPU is what is measured next: busy_share=1 ignores it.)
        settled = await until_quiet(broker.pid, quiet_s=2.0, timeout_s=20, busy_share=1.0)
        share = await cpu_share(broker.pid, cpu_window_s)
        peak = max(settled.peak_rss, rss_bytes(broker.pid))
        return IdleCost(answers, Growth(peak - baseline, settled), share)
    finally:
        await sessions.aclose()


# The backlogs of a and b: as in the review that found the broker unbounded.
SCENARIO_A = dict(count=1024, size=96 * KiB, subscriptions=3, permits=1)  # 96 MiB
SCENARIO_B = dict(count=992, size=64 * KiB, subscriptions=8, permits=MAX_PERMITS)  # 62 MiB


# -- the script --------------------------------------------------------------------------


async def _main(args: argparse.Namespace, broker_flags: list[str]) -> None:
    from tests.integration.conftest import LedgerCluster

    for scenario in args.scenarios or ["a", "b", "c"]:
        with tempfile.TemporaryDirectory(prefix="broker-load-") as tmp:
            root = Path(tmp)
            cluster = LedgerCluster(root, f"sqlite://{root / 'meta.db'}")
            try:
                cluster.start_bookies(3)
                started = time.monotonic()
                if scenario == "c":
                    [broker] = cluster.start_brokers(1, extra=LOADED_BROKER + broker_flags)
                    cost = await idle_sessions_cost(broker, args.sessions)
                    print(f"c. {args.sessions} idle sessions opened, {cost}", flush=True)
                else:
                    s = SCENARIO_A if scenario == "a" else SCENARIO_B
                    await publish_backlog(cluster, "backlog", s["count"], s["size"])
                    [broker] = cluster.start_brokers(1, extra=LOADED_BROKER + broker_flags)
                    growth = await read_ahead_growth(
                        broker, "backlog", s["subscriptions"], s["permits"]
                    )
                    print(f"{scenario}. {s['count']} x {s['size'] // KiB} KiB "
                          f"({s['count'] * s['size'] / MiB:.0f} MiB), {s['subscriptions']} "
                          f"subscriptions granting {s['permits']}: {growth}", flush=True)  # fmt: skip
                print(f"   ({time.monotonic() - started:.0f} s)", flush=True)
            finally:
                await cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help="a, b, c (default: all three)")
    parser.add_argument("--sessions", type=int, default=2000, help="c: idle sessions")
    argv = sys.argv[1:]
    broker_flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if set(args.scenarios) - {"a", "b", "c"}:
        parser.error("scenarios are a, b and c")
    asyncio.run(_main(args, broker_flags))


if __name__ == "__main__":
    main()
