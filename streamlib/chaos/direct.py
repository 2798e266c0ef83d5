"""`streamlib chaos` in direct mode: clients that reach the bookies themselves.

A local cluster (a Sandbox of `bookie serve` processes over the embedded sqlite store,
on free ports), a managed and an unbounded stream with small rollover, and per stream a
producer, a durable consumer and a reader (streamlib.chaos.workers). For --seconds it
injects faults planned from --seed (streamlib.chaos.plan.plan_faults): bookies
SIGKILLed and restarted or SIGSTOPped and continued (never more than max_down() at
once), producers SIGKILLed and replaced, duels (a second producer takes the stream over
while the first runs), consumers SIGKILLed and restarted; with --disk-faults, bookies'
disks failing for a while too (EIO on journal writes, EIO on a journal or entry-log
fsync, ENOSPC on writes, a slow journal fsync; plan.plan_disk_faults), a bookie with a
failing disk counting as down. Then it heals (every failpoint unlinked, every bookie
up, one producer per stream), waits (bounded) until each producer has a send
acknowledged again, stops the producers, lets the consumers and readers drain
(bounded), reads each stream once more from EARLIEST with a fresh reader, stops
everything and prints the verdict of streamlib.chaos.verdict.

Exit code: 0 if the run was safe, every producer recovered after the heal, no worker
crashed (a crashed worker may have missed what it should have seen) and, in a run of at
least 20 minutes, the processes' resources stayed flat (streamlib.chaos.resources); 1
if not.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamlib.chaos import verdict as v
from streamlib.chaos.plan import plan_faults, with_disk_faults
from streamlib.chaos.run import POLL_S, SCAN_TIMEOUT_S, ChaosRun, Worker
from streamlib.sandbox import Sandbox

# (name, mode, ensemble, write quorum, ack quorum): Qw = Qa stalls on one slow bookie
# until an ensemble change; Qw > Qa rides over it. Both roll every ROLL_ENTRIES entries.
STREAMS = (("chaos-managed", "managed", 3, 2, 2), ("chaos-unbounded", "unbounded", 3, 3, 2))
ROLL_ENTRIES = 25
# A short metadata session, so a killed bookie's registration goes away soon.
BOOKIE_FLAGS = ["--session-timeout", "3", "--disk-check-interval", "0.5"]
DEFAULT_CLIENT_TIMEOUT_S = 3.0  # the workers' bookie add / read timeout


class DirectRun(ChaosRun):
    """Direct mode: the bookies, two streams, per stream a producer, a consumer and a reader."""

    temp_prefix = "streamlib-chaos-"

    def __init__(
        self, root: Path, seed: int, args: argparse.Namespace, say: Callable[[str], None]
    ) -> None:
        sandbox = Sandbox(
            root / "cluster", bookies=args.bookies, port_base=0, extra_bookie_args=BOOKIE_FLAGS
        )
        super().__init__(
            root, seed, say, sandbox, [name for name, *_ in STREAMS],
            disk_faults=args.disk_faults, sample_interval_s=args.sample_interval,
        )  # fmt: skip
        self.bookies = args.bookies
        self.client_timeout_s = args.client_timeout
        self.sealed: dict[str, str] = {}
        self.recovery_s: dict[str, float | None] = {}

    def worker_args(self, role: str, slot: str) -> list[str]:
        return ["--url", self.sandbox.metadata_uri, "--client-timeout", str(self.client_timeout_s)]

    def play(self, args: argparse.Namespace) -> v.Verdict:
        self.start()
        faults = plan_faults(self.seed, args.seconds, self.bookies, self.streams)
        if args.disk_faults:
            faults = with_disk_faults(faults, self.seed, args.seconds, self.bookies)
        self.inject(faults, args.seconds)
        self.heal()
        self.await_recovery(args.recover_timeout)
        self.seal(self.stop_producers())
        self.drain(args.drain_timeout)
        self.final_scan()
        return v.judge(self.histories(), self.healed_at)

    def start(self) -> None:
        self.sandbox.start()
        self.record("cluster-started", bookies=[b.address for b in self.sandbox.processes])
        self.create_streams(self.sandbox.metadata_uri, self.stream_specs())
        for stream in self.streams:
            for role in ("producer", "consumer", "reader"):
                self.spawn(role, stream)

    def stream_specs(self) -> list[tuple[list[Any], dict[str, Any]]]:
        """The streams, as client.streams.create's arguments."""
        return [([name, ensemble, write_quorum, ack_quorum],
                 {"rollover": {"max_entries": ROLL_ENTRIES}, "mode": mode})
                for name, mode, ensemble, write_quorum, ack_quorum in STREAMS]  # fmt: skip

    def heal(self) -> None:
        """Every bookie up, and one producer per stream (the newest)."""
        down = self.heal_nodes()
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
            self.sample_if_due()
        for stream in waiting:
            self.recovery_s[stream] = None
            self.record("not-recovered", stream=stream, waited_s=timeout_s)

    def seal(self, producers: list[Worker]) -> None:
        """Seal a stream whose last producer (of those just stopped) did not close
        cleanly (a takeover that closes at once), so what it acknowledged is readable."""
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

    def report(self, verdict: v.Verdict, args: argparse.Namespace) -> dict[str, Any]:
        seconds = args.seconds
        replay = (
            f"streamlib chaos --seconds {seconds:g} --seed {self.seed} --bookies {self.bookies}"
        )
        if self.client_timeout_s != DEFAULT_CLIENT_TIMEOUT_S:
            replay += f" --client-timeout {self.client_timeout_s:g}"
        if args.disk_faults:
            replay += " --disk-faults"
        extras = self.extras_report(args.seconds)
        return {
            "seed": self.seed,
            "seconds": seconds,
            "bookies": self.bookies,
            "replay": replay,
            **verdict.to_json(),
            # a crashed worker may have missed things; a leak fails a long run
            "ok": verdict.ok and not self.crashes and extras["resources_ok"],
            "recovery_after_heal_s": self.recovery_s,
            "drained": self.drained,
            "sealed": self.sealed,
            "crashes": self.crashes,
            "stalls": self.stalls,
            "faults": [e for e in self.events if e["what"] != "cluster-started"],
            **extras,
        }

    @staticmethod
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
            for kind in (
                "lost_by_reader",
                "lost_by_consumer",
                "duplicated",
                "reordered",
                "misplaced",
            ):
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
        ChaosRun.print_extras(report)
