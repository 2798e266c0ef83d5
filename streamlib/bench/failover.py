"""`streamlib bench failover`: how long the stream service's producers wait when the
broker that owns their stream fails, on three local bookies and two brokers.

A producer process publishes at a steady rate through the service; each acknowledgement
is timed where it arrives. Then, round after round:

- the stream's owner is SIGKILLed: the figure is the time from its death to the first
  acknowledgement of a message sent after it (only the next owner can give that one);
  the killed broker is restarted with the same id and port, and the time until it
  serves again is the restart figure;
- the owner is SIGSTOPped and kept stopped past its metadata session: the figure is the
  time from the stop to the first acknowledgement of a message sent after it, less the
  session timeout (no evidence of death comes from a stopped process: its session must
  expire first);
- the same kills with every core kept busy by spinning processes (a loaded machine).

Between faults there are quiet periods, loaded and not: a change of owner during one is
a takeover nobody needed (evidence that was not: streamlib.protocol.ownership), counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from metadata.services.brokers import BrokerRegistry
from metadata.uri import connect as connect_store
from streamlib.bench import percentile
from streamlib.bench.cluster import local_cluster
from streamlib.broker.launcher import BrokerProcess

STREAM = "failover-bench"
WAIT_S = 60.0  # a bound on any one wait for an acknowledgement

# argv: service-uri stream rate. Publishes `rate` messages a second until stdin closes;
# prints "ack SENT ACKED" (wall clock) for each acknowledgement.
PRODUCER = """
import sys, threading, time, streamlib
uri, stream, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
client = streamlib.connect(uri)
producer = client.create_producer(stream, producer_name="failover-bench")
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
def acked(error, _id, sent):
    print(("ack %.6f %.6f" % (sent, time.time())) if error is None else "fail %r" % error,
          flush=True)
print("ready", flush=True)
while not done.wait(1 / rate):
    sent = time.time()
    producer.send_async(b"x" * 100, lambda e, i, sent=sent: acked(e, i, sent))
client.close()
"""
BURNER = "while True: pass"


class Acks:
    """The producer's acknowledgements as they come: (sent, acknowledged) wall times."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.items: list[tuple[float, float]] = []
        self.failures = 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            word, *rest = line.split()
            with self._changed:
                if word == "ack":
                    self.items.append((float(rest[0]), float(rest[1])))
                elif word == "fail":
                    self.failures += 1
                self._changed.notify_all()

    def first_sent_after(self, t0: float, timeout_s: float = WAIT_S) -> float:
        """When the first message sent after t0 was acknowledged."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: any(sent > t0 for sent, _ in self.items[-2000:]), timeout_s
            )
            if not found:
                raise TimeoutError(f"no acknowledgement within {timeout_s:.0f} s")
            return min(acked for sent, acked in self.items[-2000:] if sent > t0)


class Bench:
    def __init__(self, root: Path, metadata_uri: str, brokers: int, session_s: float) -> None:
        self.metadata_uri = metadata_uri
        self.session_s = session_s
        self.brokers = [
            BrokerProcess(root / "brokers", metadata_uri, name=f"broker{i}",
                          extra=["--broker-id", f"b{i}", "--session-timeout", str(session_s)])
            for i in range(brokers)
        ]  # fmt: skip
        self.unneeded = 0  # owner changes while nothing failed

    def owner(self) -> str | None:
        async def ask() -> str | None:
            store = await connect_store(self.metadata_uri)
            try:
                found = await BrokerRegistry(store).owner(STREAM)
                return found.broker_id if found is not None else None
            finally:
                await store.close()

        return asyncio.run(ask())

    def broker(self, broker_id: str) -> BrokerProcess:
        return next(b for b in self.brokers if b.broker_id == broker_id)

    def settle(self, acks: Acks) -> str:
        """Until a message sent now is acknowledged; the stream's owner then."""
        acks.first_sent_after(time.time())
        owner = self.owner()
        assert owner is not None, "nobody owns the stream while it is served"
        return owner

    def quiet(self, acks: Acks, seconds: float) -> None:
        """`seconds` without a fault; an owner change meanwhile is counted."""
        owner: str | None = self.settle(acks)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)  # (a sampling period, not a wait for a state)
            now = self.owner()
            if now != owner:
                self.unneeded += 1
                owner = now

    def kill_round(self, acks: Acks) -> tuple[float, float]:
        """(death to first acknowledgement, restart to serving)."""
        victim = self.broker(self.settle(acks))
        victim.kill()
        t0 = time.time()
        failover = acks.first_sent_after(t0) - t0
        start = time.monotonic()
        victim.start()
        return failover, time.monotonic() - start

    def stop_round(self, acks: Acks) -> float:
        """Stop to first acknowledgement, less the session timeout."""
        victim = self.broker(self.settle(acks))
        victim.pause()
        t0 = time.time()
        try:
            took = acks.first_sent_after(t0, self.session_s + WAIT_S) - t0
        finally:
            victim.resume()
        return took - self.session_s


@contextlib.contextmanager
def burning(count: int) -> Iterator[None]:
    """`count` processes spinning on a core each, while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    if not ordered:
        return {}
    return {"n": len(ordered), "p50": statistics.median(ordered),
            "p99": percentile(ordered, 0.99), "max": ordered[-1]}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    figures: dict[str, Any] = {"session_timeout_s": args.session_timeout}
    with local_cluster(3) as cluster:
        bench = Bench(cluster.root, cluster.metadata_uri, args.brokers, args.session_timeout)
        producer: subprocess.Popen[str] | None = None
        try:
            for broker in bench.brokers:
                broker.start()
            uri = "streamlib://" + ",".join(b.address for b in bench.brokers)
            producer = subprocess.Popen(
                [sys.executable, "-c", PRODUCER, uri, STREAM, str(args.rate)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            acks = Acks(producer)
            bench.quiet(acks, args.quiet_seconds)
            kills = [bench.kill_round(acks) for _ in range(args.kills)]
            figures["kill_to_first_ack_s"] = percentiles([k[0] for k in kills])
            figures["restart_to_serving_s"] = percentiles([k[1] for k in kills])
            stops = [bench.stop_round(acks) for _ in range(args.stops)]
            figures["stop_to_first_ack_past_session_s"] = percentiles(stops)
            with burning(os.cpu_count() or 2):
                bench.quiet(acks, args.quiet_seconds)
                loaded = [bench.kill_round(acks)[0] for _ in range(args.loaded_kills)]
            figures["loaded_kill_to_first_ack_s"] = percentiles(loaded)
            figures["takeovers_not_needed"] = bench.unneeded
            figures["failed_sends"] = acks.failures
        finally:
            if producer is not None:
                with contextlib.suppress(OSError):
                    assert producer.stdin is not None
                    producer.stdin.close()
                try:
                    producer.wait(30)
                except subprocess.TimeoutExpired:
                    producer.kill()
            for broker in bench.brokers:
                broker.stop()
    show(figures)
    if args.json:
        print(json.dumps(figures))
    return 0


def show(figures: dict[str, Any]) -> None:
    print(f"failover: {figures['session_timeout_s']:g} s metadata sessions, 2 brokers, "
          "3 bookies (seconds)")  # fmt: skip
    for key, label in (
        ("kill_to_first_ack_s", "broker SIGKILL -> first ack via the next owner"),
        ("restart_to_serving_s", "killed broker restarted -> serving again"),
        ("stop_to_first_ack_past_session_s", "broker SIGSTOP -> first ack, past the session"),
        ("loaded_kill_to_first_ack_s", "SIGKILL, every core busy -> first ack"),
    ):
        p = figures[key]
        if not p:
            print(f"  {label:48} (not measured)")
            continue
        print(f"  {label:48} p50 {p['p50']:6.3f}  p99 {p['p99']:6.3f}  "
              f"max {p['max']:6.3f}  (n={p['n']})")  # fmt: skip
    print(f"  takeovers nobody needed (quiet periods, idle and loaded): "
          f"{figures['takeovers_not_needed']}")  # fmt: skip
    print(f"  sends that failed: {figures['failed_sends']}")


def add_parser(which: Any) -> None:
    parser = which.add_parser(
        "failover", help="broker SIGKILL / SIGSTOP -> first acknowledgement via the next owner"
    )
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--session-timeout", type=float, default=10.0,
                        help="the brokers' metadata session, seconds (default 10)")  # fmt: skip
    parser.add_argument("--rate", type=float, default=200.0, help="messages a second")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--stops", type=int, default=3)
    parser.add_argument("--loaded-kills", type=int, default=10)
    parser.add_argument("--quiet-seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.set_defaults(run=run)
