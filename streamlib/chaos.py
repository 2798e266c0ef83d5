"""`streamlib chaos`: a built-in fault-injection verifier, in the manner of Jepsen.

It starts a local cluster (a Sandbox of `bookie serve` processes over the embedded
sqlite store, on free ports, in a temporary directory unless --data-dir), creates a
managed and an unbounded stream with small rollover, and runs, as separate processes
(streamlib.chaos_workers), a producer, a durable consumer and a reader per stream, each
logging what it was acknowledged / received / read. For --seconds it injects faults
planned from --seed (plan_faults): bookies SIGKILLed and restarted or SIGSTOPped and
continued (never more than max_down() at once), producers SIGKILLed and replaced, duels
(a second producer takes the stream over while the first runs), consumers SIGKILLed and
restarted. Then it heals (every bookie up, one producer per stream), waits (bounded)
until each producer has a send acknowledged again, stops the producers, lets the
consumers and readers drain (bounded), reads each stream once more from EARLIEST with a
fresh reader, stops everything and prints the verdict of streamlib.chaos_verdict.

Exit code: 0 if the run was safe, every producer recovered after the heal and no worker
crashed (a crashed worker may have missed what it should have seen); 1 if not; 2 for
usage errors; 3 if the cluster could not be run at all.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bookie.launcher import BookieStartError
from streamlib import chaos_verdict as v
from streamlib.chaos_plan import Fault, max_down, plan_faults, timeline
from streamlib.sandbox import Sandbox, SandboxError

# (name, mode, ensemble, write quorum, ack quorum): Qw = Qa stalls on one slow bookie
# until an ensemble change; Qw > Qa rides over it. Both roll every ROLL_ENTRIES entries.
STREAMS = (("chaos-managed", "managed", 3, 2, 2), ("chaos-unbounded", "unbounded", 3, 3, 2))
ROLL_ENTRIES = 25
# A short metadata session, so a killed bookie's registration goes away soon.
BOOKIE_FLAGS = ["--session-timeout", "3", "--disk-check-interval", "0.5"]
STOP_TIMEOUT_S = 30.0  # a SIGTERMed process gets this long before SIGKILL
SCAN_TIMEOUT_S = 60.0
POLL_S = 0.2  # how often a bounded wait re-checks the logs
STALL_GAP_S = 3.0
MAX_RESTARTS = 5  # of crashed workers, per role and stream
DEFAULT_CLIENT_TIMEOUT_S = 3.0  # the workers' bookie add / read timeout


class LogTail:
    """The events of one worker's log, read incrementally (a torn last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0

    def poll(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self.events
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        self.events += [json.loads(line) for line in data[:complete].splitlines() if line]
        return self.events


@dataclass
class Worker:
    role: str
    stream: str
    incarnation: int
    proc: subprocess.Popen[bytes]
    log: LogTail
    kind: str = ""  # "seal" / "scan": not part of the run's history
    stopping: float | None = None  # when it was sent SIGTERM
    killed: bool = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def name(self) -> str:
        return f"{self.role} {self.incarnation} of {self.stream}"

    def stderr_tail(self) -> str:
        path = self.log.path.with_suffix(".stderr")
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


@dataclass
class ChaosRun:
    root: Path
    seed: int
    bookies: int
    client_timeout_s: float
    say: Callable[[str], None]
    workers: list[Worker] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)  # not drained: where they wait
    sealed: dict[str, str] = field(default_factory=dict)
    final_producer: dict[str, int] = field(default_factory=dict)
    recovery_s: dict[str, float | None] = field(default_factory=dict)
    drained: bool = False
    healed_at: float = 0.0
    paused: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.sandbox = Sandbox(
            self.root / "cluster", bookies=self.bookies, port_base=0, extra_bookie_args=BOOKIE_FLAGS
        )
        self.streams = [name for name, *_ in STREAMS]
        self._counts: dict[tuple[str, str], int] = {}  # incarnations so far
        self._restarts: dict[tuple[str, str], int] = {}  # of crashed workers
        self._t0 = time.monotonic()

    # -- bookkeeping ------------------------------------------------------------------

    def record(self, what: str, **details: Any) -> None:
        # t: seconds since the start; wall: the workers' logs' clock, to line them up
        t = round(time.monotonic() - self._t0, 2)
        event = {"t": t, "wall": round(time.time(), 3), "what": what, **details}
        self.events.append(event)
        self.say(f"{t:7.2f}s  {what}  {' '.join(f'{k}={x}' for k, x in details.items())}")

    def spawn(self, role: str, stream: str, *extra: str, kind: str = "") -> Worker:
        number = self._counts[role, stream] = self._counts.get((role, stream), 0) + 1
        log = self.logs / f"{kind or role}-{stream}-{number}.jsonl"
        command = [
            sys.executable, "-m", "streamlib.chaos_workers", role,
            "--metadata", self.sandbox.metadata_uri, "--stream", stream, "--log", str(log),
            "--incarnation", str(number), "--client-timeout", str(self.client_timeout_s), *extra,
        ]  # fmt: skip
        with log.with_suffix(".stderr").open("ab") as stderr:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
        worker = Worker(role, stream, number, proc, LogTail(log), kind)
        self.workers.append(worker)
        return worker

    def running(self, role: str, stream: str) -> list[Worker]:
        """Live workers of the run in that role, oldest first (not those told to stop)."""
        return [
            w
            for w in self.workers
            if w.role == role and w.stream == stream and not w.kind and w.alive and not w.stopping
        ]

    def kill(self, worker: Worker) -> None:
        worker.killed = True
        worker.proc.kill()
        worker.proc.wait()

    def terminate(self, worker: Worker) -> None:
        if worker.alive and worker.stopping is None:
            worker.stopping = time.monotonic()
            worker.proc.send_signal(signal.SIGTERM)

    def reap(self, wait: list[Worker] | None = None, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGKILL workers told to stop more than STOP_TIMEOUT_S ago; with `wait`, first
        wait (bounded) until those have exited."""
        deadline = time.monotonic() + timeout_s
        for worker in wait or []:
            try:
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.record("stop-timed-out", worker=worker.name)
                self.kill(worker)
        for worker in self.workers:
            if worker.stopping and worker.alive and time.monotonic() - worker.stopping > timeout_s:
                self.record("stop-timed-out", worker=worker.name)
                self.kill(worker)

    def check_crashes(self) -> None:
        """A worker that exited without being told to crashed: record it and start
        another (up to MAX_RESTARTS per role and stream: a worker that cannot start at
        all must not be started forever)."""
        for worker in list(self.workers):
            if worker.kind or worker.alive or worker.killed or worker.stopping:
                continue
            worker.stopping = time.monotonic()  # handled once
            crash = {"worker": worker.name, "exit_code": worker.proc.returncode}
            self.crashes.append({**crash, "stderr": worker.stderr_tail()})
            self.record("crashed", **crash)
            key = (worker.role, worker.stream)
            self._restarts[key] = self._restarts.get(key, 0) + 1
            if self._restarts[key] <= MAX_RESTARTS:
                self.replace(worker)

    def replace(self, worker: Worker) -> Worker:
        if worker.role != "reader":
            return self.spawn(worker.role, worker.stream)
        reads = [e for w in self.workers if w.role == "reader" and w.stream == worker.stream
                 and not w.kind for e in w.log.poll() if e["ev"] == "msg"]  # fmt: skip
        return self.spawn("reader", worker.stream, *(["--after", reads[-1]["id"]] if reads else []))

    # -- the cluster --------------------------------------------------------------------

    def start(self) -> None:
        import streamlib

        self.sandbox.start()
        self.record("cluster-started", bookies=[b.address for b in self.sandbox.processes])
        client = streamlib.connect(self.sandbox.metadata_uri)
        try:
            for name, mode, ensemble, write_quorum, ack_quorum in STREAMS:
                client.streams.create(
                    name, ensemble, write_quorum, ack_quorum,
                    rollover={"max_entries": ROLL_ENTRIES}, mode=mode,
                )  # fmt: skip
        finally:
            client.close()
        for stream in self.streams:
            for role in ("producer", "consumer", "reader"):
                self.spawn(role, stream)

    def bookie_down(self, index: int) -> bool:
        process = self.sandbox.processes[index]
        return index in self.paused or process.proc is None or process.proc.poll() is not None

    def start_bookie(self, index: int) -> None:
        process = self.sandbox.processes[index]
        try:
            process.start()  # on its port and data directory again
            self.record("bookie-started", bookie=index)
        except BookieStartError as error:
            self.record("bookie-start-failed", bookie=index, error=str(error)[:300])

    def signal_bookie(self, index: int, sig: signal.Signals) -> None:
        proc = self.sandbox.processes[index].proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, sig)
        if sig == signal.SIGSTOP:
            self.paused.add(index)
        else:
            self.paused.discard(index)

    # -- the faults ---------------------------------------------------------------------

    def inject(self, faults: list[Fault], seconds: float) -> None:
        start = time.monotonic()
        for at_s, step, fault in [*timeline(faults, seconds), (seconds, "", None)]:
            while (left := start + at_s - time.monotonic()) > 0:
                time.sleep(min(left, POLL_S))  # the fault schedule's timer
                self.check_crashes()
                self.reap()
            if fault is not None:
                self.apply(step, fault)

    def apply(self, step: str, fault: Fault) -> None:
        if step in ("kill-bookie", "pause-bookie"):
            index = int(fault.target)
            down = sum(self.bookie_down(i) for i in range(self.bookies))
            if self.bookie_down(index) or down >= max_down(self.bookies):
                self.record("skipped", fault=step, bookie=index, down=down)
            else:
                if step == "kill-bookie":
                    self.sandbox.processes[index].kill()
                else:
                    self.signal_bookie(index, signal.SIGSTOP)
                self.record(step, bookie=index, for_s=fault.duration_s)
        elif step == "restart-bookie":
            if self.sandbox.processes[int(fault.target)].proc is None:
                self.start_bookie(int(fault.target))
        elif step == "resume-bookie":
            if int(fault.target) in self.paused:
                self.signal_bookie(int(fault.target), signal.SIGCONT)
                self.record(step, bookie=int(fault.target))
        elif step in ("kill-producer", "kill-consumer"):
            role = step.removeprefix("kill-")
            victims = self.running(role, fault.target)
            if victims:
                self.kill(victims[-1])
                self.record(step, worker=victims[-1].name)
            fresh = self.spawn(role, fault.target)
            self.record(f"{role}-started", worker=fresh.name)
        elif step == "duel":
            challenger = self.spawn("producer", fault.target)
            self.record("duel", worker=challenger.name, for_s=fault.duration_s)
        elif step == "end-duel":
            producers = self.running("producer", fault.target)
            if len(producers) > 1:
                loser = producers[0] if fault.survivor == "newer" else producers[-1]
                self.terminate(loser)
                self.record("end-duel", stopped=loser.name)

    # -- healing, draining, stopping ------------------------------------------------

    def heal(self) -> None:
        for index in range(self.bookies):
            if index in self.paused:
                self.signal_bookie(index, signal.SIGCONT)
            if self.bookie_down(index):
                self.start_bookie(index)
        stopped = []
        for stream in self.streams:
            producers = self.running("producer", stream)
            for extra in producers[:-1]:
                self.terminate(extra)
                stopped.append(extra)
            self.final_producer[stream] = (
                producers[-1] if producers else self.spawn("producer", stream)
            ).incarnation
        self.reap(wait=stopped)
        self.check_crashes()
        self.healed_at = time.time()
        down = [i for i in range(self.bookies) if self.bookie_down(i)]
        self.record("healed", bookies_down=down, producers=self.final_producer)

    def await_recovery(self, timeout_s: float) -> None:
        """Until each stream's producer has a send acknowledged after the heal."""
        deadline = time.monotonic() + timeout_s
        waiting = set(self.streams)
        while waiting and time.monotonic() < deadline:
            for stream in sorted(waiting):
                final = self.running("producer", stream)
                if final:  # (a crash replaced it: its replacement is the final one)
                    self.final_producer[stream] = final[-1].incarnation
                acked = [
                    e["t"]
                    for e in (final[-1].log.poll() if final else [])
                    if e["ev"] == "ack" and e["t"] >= self.healed_at
                ]
                if acked:
                    self.recovery_s[stream] = round(acked[0] - self.healed_at, 2)
                    waiting.discard(stream)
            time.sleep(POLL_S)  # re-check the logs
            self.check_crashes()
        for stream in waiting:
            self.recovery_s[stream] = None
            self.record("not-recovered", stream=stream, waited_s=timeout_s)

    def stop_producers(self) -> None:
        """Stop every producer; seal a stream whose last producer did not close cleanly
        (a takeover that closes at once), so what it acknowledged is readable."""
        producers = [w for w in self.workers if w.role == "producer" and w.alive and not w.kind]
        for worker in producers:
            self.terminate(worker)
        self.reap(wait=producers)
        for stream in self.streams:
            last = [w for w in producers if w.stream == stream]
            if (
                last
                and all(not w.killed and w.proc.returncode == 0 for w in last)
                and any(e["ev"] == "closed" for e in last[-1].log.poll())
            ):
                continue
            seal = self.spawn("producer", stream, "--seal", kind="seal")
            self.reap(wait=[seal], timeout_s=SCAN_TIMEOUT_S)
            closed = any(e["ev"] == "closed" for e in seal.log.poll())
            errors = [e["error"] for e in seal.log.events if "error" in e]
            why = errors[-1] if errors else seal.stderr_tail().strip()[-300:]
            self.sealed[stream] = (
                "sealed" if closed else f"seal failed (exit {seal.proc.returncode}): {why}"
            )
            self.record("seal", stream=stream, outcome=self.sealed[stream])

    def drain(self, timeout_s: float) -> None:
        """Until the reader and the consumer of each stream have every acknowledged
        message (bounded); a worker still missing some is asked where it waits. Then
        they are stopped."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_crashes()
            if not any(sum(self._missing(stream).values()) for stream in self.streams):
                self.drained = True
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)  # re-check the logs
        if not self.drained:
            missing = {s: self._missing(s) for s in self.streams}
            self.record("not-drained", waited_s=timeout_s, missing=missing)
            for stream, roles in missing.items():
                for role, count in roles.items():
                    for worker in self.running(role, stream) if count else []:
                        self.stalls.append(self._stacks_of(worker, count))
        others = [w for w in self.workers if w.alive]
        for worker in others:
            self.terminate(worker)
        self.reap(wait=others)

    def _missing(self, stream: str) -> dict[str, int]:
        """Acknowledged messages that the reader / the consumer has not had yet."""

        def payloads(role: str, event: str) -> set[str]:
            return {
                e["payload"]
                for w in self.workers
                if w.role == role and w.stream == stream and not w.kind
                for e in w.log.poll()
                if e["ev"] == event
            }

        acked = payloads("producer", "ack")
        return {role: len(acked - payloads(role, "msg")) for role in ("reader", "consumer")}

    def _stacks_of(self, worker: Worker, missing: int) -> dict[str, Any]:
        """Where a stalled worker waits: it logs its stacks on SIGUSR1 (asked twice,
        STALL_GAP_S apart: new task numbers in the second mean it spins, the same
        ones that it hangs)."""
        stacks: list[str] = []
        for _ in range(2):
            if stacks:
                time.sleep(STALL_GAP_S)  # the gap between the two looks
            worker.proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 5.0
            seen = len(stacks)
            while len(stacks) == seen and time.monotonic() < deadline:
                time.sleep(POLL_S)  # re-check its log
                stacks = [e["stacks"] for e in worker.log.poll() if e["ev"] == "stacks"]
        last_read = max((e["t"] for e in worker.log.events if e["ev"] == "msg"), default=0.0)
        return {
            "worker": worker.name,
            "missing": missing,
            "idle_s": round(time.time() - last_read, 1),
            "stacks": stacks or ["(no answer)"],
        }

    def final_scan(self) -> None:
        scans = [self.spawn("reader", s, "--scan", kind="scan") for s in self.streams]
        self.reap(wait=scans, timeout_s=SCAN_TIMEOUT_S)

    def shutdown(self) -> None:
        """Every process stopped: also after an error or Ctrl-C."""
        for worker in self.workers:
            self.terminate(worker)
        self.reap(wait=self.workers)
        for index in list(self.paused):
            self.signal_bookie(index, signal.SIGCONT)  # a stopped bookie cannot stop
        self.sandbox.stop()

    # -- the verdict ------------------------------------------------------------------

    def histories(self) -> dict[str, v.StreamHistory]:
        histories = {}
        for stream in self.streams:
            mine = sorted(
                (w for w in self.workers if w.stream == stream), key=lambda w: w.incarnation
            )
            history = v.StreamHistory(final_producer=self.final_producer.get(stream))
            for w in mine:
                events = w.log.poll()
                if w.kind == "scan":
                    done = any(e["ev"] == "done" for e in events)
                    history.scan = v.deliveries(events, "scan") if done else None
                elif w.role == "producer" and not w.kind:
                    if events:  # (one killed before its first line did nothing)
                        history.producers.append(v.producer_run(w.incarnation, events))
                elif w.role == "reader":
                    history.reads += v.deliveries(events, "reader")
                elif w.role == "consumer":
                    history.receipts += v.deliveries(events, f"{w.incarnation}")
                fails = [e for e in events if e["ev"] == "fail"] if w.role == "producer" else []
                role = f"{w.kind or w.role}"
                for e in [*fails, *v.errors_of(events)]:
                    history.errors.setdefault(role, []).append(e["error"])
                    if "traceback" in e:
                        history.tracebacks.setdefault(role, e["traceback"])
            histories[stream] = history
        return histories

    def report(self, verdict: v.Verdict, seconds: float) -> dict[str, Any]:
        replay = (
            f"streamlib chaos --seconds {seconds:g} --seed {self.seed} --bookies {self.bookies}"
        )
        if self.client_timeout_s != DEFAULT_CLIENT_TIMEOUT_S:
            replay += f" --client-timeout {self.client_timeout_s:g}"
        return {
            "seed": self.seed,
            "seconds": seconds,
            "bookies": self.bookies,
            "replay": replay,
            **verdict.to_json(),
            "ok": verdict.ok and not self.crashes,  # a crashed worker may have missed things
            "recovery_after_heal_s": self.recovery_s,
            "drained": self.drained,
            "sealed": self.sealed,
            "crashes": self.crashes,
            "stalls": self.stalls,
            "faults": [e for e in self.events if e["what"] != "cluster-started"],
        }


def print_report(report: dict[str, Any]) -> None:
    from streamlib.commands.common import print_fields, print_table

    print()
    print_table(
        ["stream", "acked", "lost(reader/consumer/scan)", "dup", "reorder", "misplaced",
         "redelivered", "failed sends", "longest unavail s (stream/producer)", "recovered"],
        [
            [
                name, s["acknowledged"],
                f"{s['lost_by_reader']['count']}/{s['lost_by_consumer']['count']}/"
                f"{'?' if s['lost_in_final_scan'] is None else s['lost_in_final_scan']['count']}",
                s["duplicated"]["count"], s["reordered"]["count"], s["misplaced"]["count"],
                s["redelivered"], s["failed_sends"],
                f"{s['longest_without_ack_s']}/{s['longest_unavailable_s']}",
                s["recovered_after_heal"],
            ]
            for name, s in report["streams"].items()
        ],
        title="per stream",
    )  # fmt: skip
    for name, s in report["streams"].items():
        for kind in ("lost_by_reader", "lost_by_consumer", "duplicated", "reordered", "misplaced"):
            if s[kind]["count"]:
                print(f"  {name} {kind}: {', '.join(s[kind]['examples'])}")
        for role, samples in s["error_samples"].items():
            print(f"  {name} {role} errors ({s['errors'][role]}): {' | '.join(samples)}")
    for crash in report["crashes"]:
        last = (crash["stderr"].strip().splitlines() or ["(no stderr)"])[-1]
        print(f"  crashed: {crash['worker']} (exit {crash['exit_code']}): {last}")
    for stall in report["stalls"]:
        print(
            f"  stalled: {stall['worker']}, {stall['missing']} acknowledged messages missing, "
            f"nothing new for {stall['idle_s']} s; waiting in:"
        )
        for number, stacks in enumerate(stall["stacks"], 1):
            print(f"   look {number}:\n    " + stacks.replace("\n", "\n    "))
    if report["lost"] and report["lost_in_final_scan"] == 0:
        print(
            "  every message lost was in the stream (a fresh reader found it): a reader or "
            "consumer stalled rather than data being lost"
        )
    safe = "SAFE" if report["safe"] else "UNSAFE"
    shown = ("acknowledged", "lost", "lost_in_final_scan", "duplicated", "reordered",
             "misplaced", "redelivered", "failed_sends", "never_recovered",
             "recovery_after_heal_s", "drained", "seed", "replay")  # fmt: skip
    print_fields(
        [("verdict", f"{'PASS' if report['ok'] else 'FAIL'} ({safe})")]
        + [(key.replace("_", " "), report[key]) for key in shown]
        + [("worker crashes", len(report["crashes"]))]
    )


def run(args: argparse.Namespace) -> int:
    if args.brokers < 0 or (args.brokers and args.brokers < 2):
        print("streamlib chaos: --brokers is 0 (direct mode) or at least 2", file=sys.stderr)
        return 2
    if args.brokers and args.seconds > 0 and args.bookies >= 3:
        from streamlib import chaos_service

        return chaos_service.run(args)
    if args.seconds <= 0 or args.bookies < 3:
        print("streamlib chaos: --seconds must be > 0 and --bookies >= 3", file=sys.stderr)
        return 2
    if args.data_dir is not None and args.data_dir.exists() and any(args.data_dir.iterdir()):
        print(f"streamlib chaos: {args.data_dir} is not empty", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="streamlib-chaos-"))

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too stops every process before exiting

    signal.signal(signal.SIGTERM, interrupted)
    chaos = ChaosRun(root, seed, args.bookies, args.client_timeout, say)
    try:
        chaos.start()
        faults = plan_faults(seed, args.seconds, args.bookies, chaos.streams)
        chaos.inject(faults, args.seconds)
        chaos.heal()
        chaos.await_recovery(args.recover_timeout)
        chaos.stop_producers()
        chaos.drain(args.drain_timeout)
        chaos.final_scan()
        verdict = v.judge(chaos.histories(), chaos.healed_at)
    except (SandboxError, BookieStartError) as error:
        print(f"streamlib chaos: the cluster could not run: {error}", file=sys.stderr)
        return 3
    finally:
        chaos.shutdown()
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    report = chaos.report(verdict, args.seconds)
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        print_report(report)
    return 0 if report["ok"] else 1


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "chaos", help="run a local cluster under injected faults and check what was kept"
    )
    parser.add_argument("--seconds", type=float, required=True, help="how long faults go on")
    parser.add_argument("--seed", type=int, help="the fault plan's seed (default: random)")
    parser.add_argument("--bookies", type=int, default=5, help="number of bookies (default 5)")
    parser.add_argument(
        "--brokers",
        type=int,
        default=0,
        help="broker mode: producers and shared consumers through N >= 2 brokers, which get "
        "killed and stopped (streamlib/chaos_service.py); 0 (default): direct mode",
    )
    parser.add_argument(
        "--data-dir", type=Path, help="keep the cluster and the workers' logs here (new or empty)"
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    parser.add_argument(
        "--recover-timeout", type=float, default=60.0,
        help="seconds the producers get to recover after the heal (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--drain-timeout", type=float, default=60.0,
        help="seconds the consumers and readers get to read everything (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--client-timeout", type=float, default=DEFAULT_CLIENT_TIMEOUT_S,
        help="the workers' bookie add / read timeout, seconds (default 3)",
    )  # fmt: skip
    parser.set_defaults(run=run)
