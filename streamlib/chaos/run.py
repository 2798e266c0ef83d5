"""What a `streamlib chaos` run does with its processes, in either mode: it starts the
workers (streamlib.chaos.workers) and follows their event logs, restarts a worker that
crashed (and a bookie that exited on its own), carries out the fault plan's timeline on
the sandbox's bookies and brokers and on the workers, heals, lets the consumers and
readers drain, scans each stream once more, stops everything and turns the logs into
the verdict's histories. Meanwhile it samples every process's memory and descriptors
(streamlib.chaos.resources).

Disk faults (--disk-faults): each bookie runs with BOOKIE_FAILPOINTS_DIR set to
ROOT/failpoints/bookie-I (kept for its restarts); a disk fault writes its failpoint
files there (each whole, renamed into place: bookie/failpoints.py reads an empty file
as "crash") and its end unlinks them. The heal unlinks every one first, then restarts
what is down.

The modes (direct.py, service.py) say which cluster runs, which workers it has and
how a worker reaches the stream; they share everything else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookie.launcher import BookieProcess, BookieStartError
from streamlib.broker.launcher import BrokerProcess, BrokerStartError
from streamlib.chaos import verdict as v
from streamlib.chaos.events import LogTail
from streamlib.chaos.plan import DISK_KINDS, Fault, max_down, timeline
from streamlib.chaos.resources import JUDGED_RUN_S, Sampler, judge
from streamlib.sandbox import Sandbox

STOP_TIMEOUT_S = 30.0  # a SIGTERMed process gets this long before SIGKILL
SCAN_TIMEOUT_S = 60.0
POLL_S = 0.2  # how often a bounded wait re-checks the logs
STALL_GAP_S = 3.0
MAX_RESTARTS = 5  # of crashed workers, per role and stream
NODES = ("bookie", "broker")  # what the faults stop and kill besides workers


@dataclass
class Worker:
    role: str
    stream: str
    incarnation: int
    proc: subprocess.Popen[bytes]
    log: LogTail
    slot: str = ""  # broker mode: which of its role's workers it is (P0, C1); a producer's name
    kind: str = ""  # "seal" / "scan": not part of the run's history
    stopping: float | None = None  # when it was sent SIGTERM
    killed: bool = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def name(self) -> str:
        name = f"{self.role} {self.incarnation} of {self.stream}"
        return f"{name} as {self.slot}" if self.slot else name

    def stderr_tail(self) -> str:
        path = self.log.path.with_suffix(".stderr")
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


class ChaosRun:
    """One run's processes and what they logged. A mode fills in worker_args()."""

    consumer_type = "failover"  # of the workers' subscription (the verdict asks)

    def __init__(
        self,
        root: Path,
        seed: int,
        say: Callable[[str], None],
        sandbox: Sandbox,
        streams: list[str],
        *,
        disk_faults: bool = False,
        sample_interval_s: float = 60.0,
    ) -> None:
        self.root, self.seed, self.say, self.sandbox, self.streams = (
            root,
            seed,
            say,
            sandbox,
            streams,
        )
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.workers: list[Worker] = []
        self.events: list[dict[str, Any]] = []
        self.crashes: list[dict[str, Any]] = []
        self.stalls: list[dict[str, Any]] = []  # not drained: where they wait
        self.final_producer: dict[str, int] = {}  # the incarnation a heal left running
        self.paused: set[tuple[str, int]] = set()  # SIGSTOPped nodes: (bookie|broker, index)
        self.disk_faulted: dict[int, Fault] = {}  # bookies whose failpoints are armed
        self.failpoint_dirs: list[Path] = []
        if disk_faults:  # (before the sandbox starts the bookies: it keeps .env for restarts)
            for index, bookie in enumerate(sandbox.processes):
                directory = root / "failpoints" / f"bookie-{index}"
                directory.mkdir(parents=True, exist_ok=True)
                bookie.env["BOOKIE_FAILPOINTS_DIR"] = str(directory)
                self.failpoint_dirs.append(directory)
        self.drained = False
        self.healed_at = 0.0
        self._counts: dict[tuple[str, str], int] = {}  # incarnations so far
        self._restarts: dict[tuple[str, str], int] = {}  # of crashed workers
        self._t0 = time.monotonic()
        self.sampler = Sampler(self.logs / "resources.jsonl", sample_interval_s, self._t0)

    def worker_args(self, role: str, slot: str) -> list[str]:
        """How a worker of that role reaches the stream (--url ...), and what it is."""
        raise NotImplementedError

    def create_streams(self, url: str, streams: list[tuple[list[Any], dict[str, Any]]]) -> None:
        """The run's streams (from here; with --partitions, from a client host)."""
        create_streams(url, streams)

    def placement(self, role: str, slot: str, kind: str) -> list[str]:
        """What a worker's command starts with to run elsewhere (a network-namespace
        host, with --partitions: streamlib.chaos.partitions); here: nothing."""
        return []

    # -- bookkeeping ------------------------------------------------------------------

    def record(self, what: str, **details: Any) -> None:
        # t: seconds since the start; wall: the workers' logs' clock, to line them up
        t = round(time.monotonic() - self._t0, 2)
        event = {"t": t, "wall": round(time.time(), 3), "what": what, **details}
        self.events.append(event)
        self.say(f"{t:7.2f}s  {what}  {' '.join(f'{k}={x}' for k, x in details.items())}")

    def spawn(self, role: str, stream: str, *extra: str, slot: str = "", kind: str = "") -> Worker:
        number = self._counts[role, stream] = self._counts.get((role, stream), 0) + 1
        log = self.logs / f"{kind or role}-{stream}-{number}.jsonl"
        command = [
            *self.placement(role, slot, kind),
            sys.executable, "-m", "streamlib.chaos.workers", role, "--stream", stream,
            "--log", str(log), "--incarnation", str(number), *self.worker_args(role, slot), *extra,
        ]  # fmt: skip
        with log.with_suffix(".stderr").open("ab") as stderr:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
        worker = Worker(role, stream, number, proc, LogTail(log), slot, kind)
        self.workers.append(worker)
        return worker

    def slot(self, role: str, target: str) -> list[Worker]:
        """Every worker of the run in that role, on that stream or in that slot, oldest
        first."""
        return [
            w
            for w in self.workers
            if w.role == role and target in (w.stream, w.slot) and not w.kind
        ]

    def running(self, role: str, target: str) -> list[Worker]:
        """Live workers of the run in that role (on that stream or in that slot), oldest
        first (not those told to stop)."""
        return [w for w in self.slot(role, target) if w.alive and not w.stopping]

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
        """A worker that exited without being told crashed: record it and start
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
        """A new worker in the old one's place (a reader goes on after what its
        predecessors read)."""
        if worker.role != "reader":
            return self.spawn(worker.role, worker.stream, slot=worker.slot)
        reads = [
            e for w in self.slot("reader", worker.stream) for e in w.log.poll() if e["ev"] == "msg"
        ]
        return self.spawn("reader", worker.stream, *(["--after", reads[-1]["id"]] if reads else []))

    def sample_if_due(self) -> None:
        """Every process's RSS and descriptors, if a sample is due."""
        now = time.monotonic()
        if not self.sampler.due(now):
            return
        processes = [("chaos", os.getpid())]
        for kind in NODES:
            for index in range(len(self.nodes(kind))):
                proc = self.nodes(kind)[index].proc
                if proc is not None and proc.poll() is None:
                    processes.append((f"{kind}-{index}", proc.pid))
        for w in self.workers:
            if w.alive and not w.kind:
                processes.append((f"{w.role} {w.slot or w.stream}", w.proc.pid))
        self.sampler.sample(now, processes)

    def tick(self) -> None:
        """What a wait does meanwhile: crashed workers replaced, a bookie that exited on
        its own restarted, stopped workers reaped, a resource sample if one is due."""
        self.check_crashes()
        self.check_bookies()
        self.reap()
        self.sample_if_due()

    # -- the bookies and brokers ------------------------------------------------------

    def nodes(self, kind: str) -> list[BookieProcess] | list[BrokerProcess]:
        return self.sandbox.processes if kind == "bookie" else self.sandbox.brokers

    def node_down(self, kind: str, index: int) -> bool:
        proc = self.nodes(kind)[index].proc
        return (kind, index) in self.paused or proc is None or proc.poll() is not None

    def max_down(self, kind: str) -> int:
        """Bookies: enough stay up for an ensemble; brokers: one stays up."""
        count = len(self.nodes(kind))
        return max_down(count) if kind == "bookie" else count - 1

    def check_bookies(self) -> None:
        """A bookie that exited without being killed (a disk fault may end it): record
        it and start it again (a failed start is recorded; the heal tries once more)."""
        for index, bookie in enumerate(self.sandbox.processes):
            if bookie.proc is not None and bookie.proc.poll() is not None:
                code = bookie.proc.returncode
                bookie.kill()  # (reaped: its proc is None from now on)
                self.paused.discard(("bookie", index))
                self.record("bookie-exited", bookie=index, exit_code=code,
                            stderr=bookie.stderr_tail(300).strip())  # fmt: skip
                self.start_node("bookie", index)

    def start_node(self, kind: str, index: int) -> None:
        try:
            self.nodes(kind)[index].start()  # on its port and data directory again
            self.record(f"{kind}-started", **{kind: index})
        except (BookieStartError, BrokerStartError) as error:
            self.record(f"{kind}-start-failed", **{kind: index}, error=str(error)[:300])

    def signal_node(self, kind: str, index: int, sig: signal.Signals) -> None:
        proc = self.nodes(kind)[index].proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, sig)
        if sig == signal.SIGSTOP:
            self.paused.add((kind, index))
        else:
            self.paused.discard((kind, index))

    def heal_nodes(self) -> list[int]:
        """Every disk healed, every bookie and broker running again; the bookies still
        down after it."""
        for index in list(self.disk_faulted):
            self.heal_disk(index)
        for kind in NODES:
            for index in range(len(self.nodes(kind))):
                if (kind, index) in self.paused:
                    self.signal_node(kind, index, signal.SIGCONT)
                if self.node_down(kind, index):
                    self.start_node(kind, index)
        return [i for i in range(len(self.sandbox.processes)) if self.node_down("bookie", i)]

    # -- the faults ---------------------------------------------------------------------

    def inject(self, faults: list[Fault], seconds: float) -> None:
        """The plan's steps at their offsets, until `seconds`; meanwhile crashed workers
        are replaced and stopped ones reaped."""
        start = time.monotonic()
        for at_s, step, fault in [*timeline(faults, seconds), (seconds, "", None)]:
            while (left := start + at_s - time.monotonic()) > 0:
                time.sleep(min(left, POLL_S))  # the fault schedule's timer
                self.tick()
            if fault is not None:
                self.apply(step, fault)

    def apply(self, step: str, fault: Fault) -> None:
        verb, _, what = step.partition("-")
        if what in NODES:
            self._apply_to_node(verb, what, int(fault.target), fault)
        elif step in ("kill-producer", "kill-consumer"):
            role = step.removeprefix("kill-")
            victims = self.running(role, fault.target)
            if victims:
                self.kill(victims[-1])
                self.record(step, worker=victims[-1].name)
            fresh = self.replace(self.slot(role, fault.target)[-1])
            self.record(f"{role}-started", worker=fresh.name)
        elif step == "duel":
            challenger = self.spawn("producer", fault.target)
            self.record("duel", worker=challenger.name, for_s=fault.duration_s)
        elif step in DISK_KINDS:
            self.fail_disk(int(fault.target), fault)
        elif step == "heal-disk":
            self.heal_disk(int(fault.target))
        elif step == "end-duel":
            producers = self.running("producer", fault.target)
            if len(producers) > 1:
                loser = producers[0] if fault.survivor == "newer" else producers[-1]
                self.terminate(loser)
                self.record("end-duel", stopped=loser.name)

    def _apply_to_node(self, verb: str, kind: str, index: int, fault: Fault) -> None:
        step = f"{verb}-{kind}"
        if verb in ("kill", "pause"):
            down = self.down_or_faulted(kind)
            if self.node_down(kind, index) or index in down or len(down) >= self.max_down(kind):
                self.record("skipped", fault=step, **{kind: index}, down=len(down))
            else:
                if verb == "kill":
                    self.nodes(kind)[index].kill()
                else:
                    self.signal_node(kind, index, signal.SIGSTOP)
                self.record(step, **{kind: index}, for_s=fault.duration_s)
        elif verb == "restart":
            if self.nodes(kind)[index].proc is None:
                self.start_node(kind, index)
        elif verb == "resume" and (kind, index) in self.paused:
            self.signal_node(kind, index, signal.SIGCONT)
            self.record(step, **{kind: index})

    def down_or_faulted(self, kind: str) -> set[int]:
        """The nodes of that kind down, and (bookies) those with a failing disk."""
        down = {i for i in range(len(self.nodes(kind))) if self.node_down(kind, i)}
        return down | set(self.disk_faulted) if kind == "bookie" else down

    def fail_disk(self, index: int, fault: Fault) -> None:
        """Arm a disk fault's failpoints on a bookie (unless too many are down)."""
        down = self.down_or_faulted("bookie")
        if index in down or len(down) >= self.max_down("bookie"):
            self.record("skipped", fault=fault.kind, bookie=index, down=len(down))
            return
        for step, action in fault.failpoints:
            armed = self.failpoint_dirs[index] / step
            pending = armed.with_name(f".{step}.new")  # (no failpoint has a name like it)
            pending.write_text(action)
            pending.replace(armed)  # the bookie reads all of it or nothing
        self.disk_faulted[index] = fault
        self.record(fault.kind, bookie=index, for_s=fault.duration_s,
                    failpoints=dict(fault.failpoints))  # fmt: skip

    def heal_disk(self, index: int) -> None:
        """Unlink every failpoint of a bookie; start it again if it is down and no
        planned outage has it (a disk fault and an outage never share a bookie)."""
        fault = self.disk_faulted.pop(index, None)
        if fault is None:
            return
        for armed in self.failpoint_dirs[index].iterdir():
            armed.unlink()
        self.record("heal-disk", bookie=index, fault=fault.kind)
        if self.node_down("bookie", index) and ("bookie", index) not in self.paused:
            self.start_node("bookie", index)

    # -- stopping, draining, scanning ---------------------------------------------------

    def stop_producers(self) -> list[Worker]:
        """Every producer stopped (a producer closes, or flushes, on SIGTERM); those that
        were running."""
        producers = [w for w in self.workers if w.role == "producer" and w.alive and not w.kind]
        for worker in producers:
            self.terminate(worker)
        self.reap(wait=producers)
        return producers

    def drain(self, timeout_s: float) -> None:
        """Until the readers and the consumers of each stream have every acknowledged
        message (bounded); a worker still missing some is asked where it waits. Then
        they are stopped."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_crashes()
            self.sample_if_due()
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
        """Acknowledged messages that the readers / the consumers (those of the run that
        has them) have not had yet."""

        def payloads(role: str, event: str) -> set[str]:
            return {
                e["payload"]
                for w in self.slot(role, stream)
                for e in w.log.poll()
                if e["ev"] == event
            }

        acked = payloads("producer", "ack")
        roles = [role for role in ("reader", "consumer") if self.slot(role, stream)]
        return {role: len(acked - payloads(role, "msg")) for role in roles}

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
        """Each stream read once more from EARLIEST by a fresh reader, to its end: for
        as long as the readers make progress, and at most SCAN_TIMEOUT_S without any (an
        hour's run stores millions of messages: a fixed bound cut its scan short)."""
        scans = [self.spawn("reader", s, "--scan", kind="scan") for s in self.streams]
        seen, deadline = 0, time.monotonic() + SCAN_TIMEOUT_S
        while any(w.alive for w in scans) and time.monotonic() < deadline:
            read = sum(len(w.log.poll()) for w in scans)
            if read > seen:
                seen, deadline = read, time.monotonic() + SCAN_TIMEOUT_S
            time.sleep(POLL_S)  # re-check the logs
        self.reap(wait=scans, timeout_s=POLL_S)

    def shutdown(self) -> None:
        """Every process stopped: also after an error or Ctrl-C."""
        for worker in self.workers:
            self.terminate(worker)
        self.reap(wait=self.workers)
        for kind, index in list(self.paused):
            self.signal_node(kind, index, signal.SIGCONT)  # a stopped process cannot stop
        self.sandbox.stop()

    # -- what both modes report besides the verdict -----------------------------------

    def extras_report(self, seconds: float) -> dict[str, Any]:
        """Disk faults by kind, bookies that exited on their own, the resources section
        (resources_ok: flat, or a run too short to judge)."""
        resources = judge(list(self.sampler.series.values()), seconds)
        return {
            "disk_faults": dict(Counter(e["what"] for e in self.events if e["what"] in DISK_KINDS)),
            "bookie_exits": sum(e["what"] == "bookie-exited" for e in self.events),
            "resources": resources,
            "resources_flat": resources["flat"],
            "resources_ok": resources["flat"] or seconds < JUDGED_RUN_S,
        }

    @staticmethod
    def print_extras(report: dict[str, Any]) -> None:
        from streamlib.commands.common import print_table

        resources = report["resources"]
        if resources["series"]:
            print_table(
                ["process", "samples", "RSS MiB first/last/max", "fds first/last/max", "growth"],
                [
                    [
                        name, f["samples"],
                        f"{f.get('first_rss_mib', '-')}/{f.get('last_rss_mib', '-')}/{f['max_rss_mib']}",
                        f"{f.get('first_fds', '-')}/{f.get('last_fds', '-')}/{f['max_fds']}",
                        "-" if f["grows"] is None
                        else f"{f['growth_rss_mib']:+} MiB {f['growth_fds']:+g} fds"
                        + (" GROWS" if f["grows"] else ""),
                    ]
                    for name, f in resources["series"].items()
                ],
                title=f"resources (past a {resources['warmup_s']:g} s warm-up)",
            )  # fmt: skip
        judged = resources["judged"]
        if not judged:
            verdict = "not judged (no process lived 3 samples past the warm-up)"
        elif resources["flat"]:
            verdict = f"flat ({judged} processes judged)"
        else:
            verdict = f"GROWING: {', '.join(resources['growing'])} ({judged} judged)"
        if not report["resources_ok"]:
            verdict += ": the run fails"
        elif not resources["flat"]:
            verdict += ": not failed (a run under 20 minutes cannot tell a leak from a warm-up)"
        print(f"resources: {verdict}")
        print(f"disk faults: {report['disk_faults'] or 'none'}; "
              f"bookies that exited on their own: {report['bookie_exits']}")  # fmt: skip

    # -- the verdict's histories ------------------------------------------------------

    def histories(self) -> dict[str, v.StreamHistory]:
        histories = {}
        for stream in self.streams:
            mine = sorted(
                (w for w in self.workers if w.stream == stream), key=lambda w: w.incarnation
            )
            readers = self.slot("reader", stream)  # (none beside the faults: the scan reads)
            history = v.StreamHistory(
                reads=[d for w in readers for d in v.deliveries(w.log.poll(), "reader")]
                if readers
                else None,
                final_producer=self.final_producer.get(stream),
                consumer_type=self.consumer_type,
            )
            for w in mine:
                events = w.log.poll()
                if w.kind == "scan":
                    done = any(e["ev"] == "done" for e in events)
                    history.scan = v.deliveries(events, "scan") if done else None
                elif w.role == "producer" and not w.kind:
                    if events:  # (one killed before its first line did nothing)
                        history.producers.append(v.producer_run(w.incarnation, events))
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


def create_streams(url: str, streams: list[tuple[list[Any], dict[str, Any]]]) -> None:
    """The run's streams, made through the public client at url: each (args, kwargs) of
    client.streams.create."""
    import streamlib

    client = streamlib.connect(url)
    try:
        for args, kwargs in streams:
            client.streams.create(*args, **kwargs)
    finally:
        client.close()
