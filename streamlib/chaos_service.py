"""`streamlib chaos --brokers N`: the fault-injection verifier's broker mode.

A sandbox with N brokers (streamlib/sandbox.py) and its bookies; two producer processes
publish to one stream through the stream service with deduplication (each has a name
and numbers its messages), and two shared consumers split the stream. For --seconds,
faults planned from --seed hit one process at a time: a broker SIGKILLed and restarted,
a broker SIGSTOPped past its metadata session and continued, a producer SIGKILLed and
restarted under the same name, a consumer SIGKILLed and restarted. Then every process
is healed, the producers stop (flushing), the consumers drain, and a direct reader reads
the stream from the start.

The verdict: every acknowledged message is in the stream (nothing lost), no producer's
sequence id is in it twice (deduplication across failovers), each producer's messages
are in its order, and the consumers received every acknowledged message at least once.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamlib.sandbox import Sandbox

STREAM = "chaos-service"
PRODUCERS = ("P0", "P1")
CONSUMERS = ("C0", "C1")
SESSION_S = 3.0  # the brokers' metadata session: a SIGSTOP lasts longer than this


@dataclass(frozen=True)
class Fault:
    pause_s: float  # before it
    kind: str  # broker-kill | broker-stop | producer-kill | consumer-kill
    target: int  # which broker / worker of its role (modulo their number)
    hold_s: float  # a killed broker stays down / a stopped one stopped this long


KINDS = ("broker-kill", "broker-stop", "producer-kill", "consumer-kill")


def plan_faults(seed: int, seconds: float) -> list[Fault]:
    """The faults of a run, from its seed alone (so a run can be replayed): one at a
    time, filling about `seconds`."""
    rng = random.Random(seed)
    plan: list[Fault] = []
    elapsed = 0.0
    while elapsed < seconds:
        pause, kind, target = rng.uniform(1.0, 3.0), rng.choice(KINDS), rng.randrange(1 << 16)
        hold = rng.uniform(0.5, 2.0) if kind == "broker-kill" else SESSION_S + rng.uniform(1.0, 3.0)
        hold = hold if kind.startswith("broker") else 0.0
        plan.append(Fault(pause, kind, target, hold))
        elapsed += pause + hold + (1.0 if kind != "broker-stop" else 0.0)
    return plan


class Worker:
    def __init__(self, root: Path, role: str, name: str, argv: list[str]) -> None:
        self.role, self.name, self.argv = role, name, argv
        self.log = root / f"{name}.log"
        self.stderr = root / f"{name}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.stderr, "ab") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "streamlib.chaos_service_workers",
                    *self.argv,
                    str(self.log),
                ],
                stderr=err,
            )

    def events(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line torn by a SIGKILL
        return out


class ServiceChaos:
    def __init__(self, root: Path, seed: int, brokers: int, bookies: int, say: Any) -> None:
        self.root = root
        self.random = random.Random(seed)
        self.say = say
        self.sandbox = Sandbox(root / "cluster", bookies=bookies, port_base=0, brokers=brokers)
        for broker in self.sandbox.brokers:
            broker.extra += ["--session-timeout", str(SESSION_S)]
        self.workers: list[Worker] = []
        self.faults: list[str] = []

    def start(self) -> None:
        self.sandbox.start()
        url = self.sandbox.service_url
        for name in CONSUMERS:
            self.workers.append(Worker(self.root, "consumer", name,
                                       ["consume", url, STREAM, "workers", "shared"]))  # fmt: skip
        for name in PRODUCERS:
            self.workers.append(Worker(self.root, "producer", name, ["produce", url, STREAM, name]))
        for worker in self.workers:
            worker.start()

    def inject(self, plan: list[Fault]) -> None:
        for fault in plan:
            time.sleep(fault.pause_s)
            if fault.kind.startswith("broker"):
                broker = self.sandbox.brokers[fault.target % len(self.sandbox.brokers)]
                if fault.kind == "broker-kill":
                    self.say(f"fault: SIGKILL broker {broker.broker_id}")
                    broker.kill()
                    time.sleep(fault.hold_s)
                    broker.start(port=broker.port)
                else:
                    self.say(f"fault: SIGSTOP broker {broker.broker_id} past its session")
                    broker.pause()
                    time.sleep(fault.hold_s)
                    broker.resume()
            else:
                role = fault.kind.split("-")[0]
                candidates = [w for w in self.workers if w.role == role]
                worker = candidates[fault.target % len(candidates)]
                self.say(f"fault: SIGKILL {role} {worker.name}")
                assert worker.proc is not None
                worker.proc.kill()
                worker.proc.wait()
                worker.start()
            self.faults.append(fault.kind)

    def stop_producers(self, timeout_s: float = 60.0) -> None:
        for worker in self.workers:
            if worker.role == "producer" and worker.proc is not None:
                worker.proc.send_signal(signal.SIGTERM)
        for worker in self.workers:
            if worker.role == "producer" and worker.proc is not None:
                worker.proc.wait(timeout_s)

    def acked(self) -> dict[str, dict[int, list[int]]]:
        out: dict[str, dict[int, list[int]]] = {}
        for worker in self.workers:
            if worker.role == "producer":
                out[worker.name] = {e["seq"]: e["id"] for e in worker.events() if e["e"] == "ack"}
        return out

    def received(self) -> collections.Counter[str]:
        got: collections.Counter[str] = collections.Counter()
        for worker in self.workers:
            if worker.role == "consumer":
                got.update(e["data"] for e in worker.events() if e["e"] == "got")
        return got

    def drain(self, timeout_s: float) -> None:
        want = {f"{name}-{seq}" for name, seqs in self.acked().items() for seq in seqs}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not want <= set(self.received()):
            time.sleep(0.2)  # (the consumers are other processes: their logs grow)
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
                try:
                    worker.proc.wait(30)
                except subprocess.TimeoutExpired:
                    worker.proc.kill()
                    worker.proc.wait()

    def scan(self) -> list[str]:
        """The stream's messages, from the start, read directly from the bookies."""
        from streamlib.client import Client
        from streamlib.stream.positions import EARLIEST

        async def read() -> list[str]:
            client = await Client.connect(self.sandbox.metadata_uri)
            try:
                reader = await client.create_reader(STREAM, EARLIEST)
                out = []
                while await reader.has_message_available():
                    out.append((await reader.read_next(timeout=30)).data.decode())
                return out
            finally:
                await client.close()

        return asyncio.run(read())

    def verdict(self, scanned: list[str]) -> dict[str, Any]:
        acked = self.acked()
        stored = collections.Counter(scanned)
        lost = sorted(
            f"{n}-{s}" for n, seqs in acked.items() for s in seqs if f"{n}-{s}" not in stored
        )
        duplicated = sorted(d for d, c in stored.items() if c > 1)
        disordered = []
        for name in PRODUCERS:
            seqs = [int(d.rsplit("-", 1)[1]) for d in scanned if d.startswith(name + "-")]
            if seqs != sorted(seqs):
                disordered.append(name)
        received = self.received()
        unreceived = sorted(
            f"{n}-{s}" for n, seqs in acked.items() for s in seqs if f"{n}-{s}" not in received
        )
        acked_count = sum(len(s) for s in acked.values())
        return {
            "ok": not (lost or duplicated or disordered or unreceived) and acked_count > 0,
            "acknowledged": acked_count,
            "stored": len(scanned),
            "lost": lost[:20],
            "duplicated": duplicated[:20],
            "disordered_producers": disordered,
            "not_received": unreceived[:20],
            "redeliveries": sum(received.values()) - len(received),
            "faults": collections.Counter(self.faults),
        }

    def shutdown(self) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()
        for broker in self.sandbox.brokers:
            if broker.proc is not None:
                broker.resume()
        self.sandbox.stop()


def run(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="streamlib-chaos-service-"))
    root.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    say(f"chaos (broker mode): seed {seed}, {args.brokers} brokers, {args.bookies} bookies, "
        f"{args.seconds:.0f} s of faults")  # fmt: skip
    chaos = ServiceChaos(root, seed, args.brokers, args.bookies, say)
    try:
        chaos.start()
        chaos.inject(plan_faults(seed, args.seconds))
        chaos.stop_producers()
        chaos.drain(args.drain_timeout)
        report = chaos.verdict(chaos.scan())
    finally:
        chaos.shutdown()
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    report["seed"] = seed
    report["replay"] = (
        f"streamlib chaos --brokers {args.brokers} --bookies {args.bookies} "
        f"--seconds {args.seconds:g} --seed {seed}"
    )
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        print(
            f"{'SAFE' if report['ok'] else 'UNSAFE'}: {report['acknowledged']:,} acknowledged, "
            f"{report['stored']:,} stored, lost {len(report['lost'])}, duplicated "
            f"{len(report['duplicated'])}, producers out of order {report['disordered_producers']}, "
            f"not received {len(report['not_received'])}, redeliveries {report['redeliveries']}, "
            f"faults {dict(report['faults'])}",
            flush=True,
        )
        for key in ("lost", "duplicated", "not_received"):
            if report[key]:
                print(f"  {key}: {report[key]}")
    return 0 if report["ok"] else 1
