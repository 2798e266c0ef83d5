"""`streamlib chaos --brokers N`: broker mode, clients of the stream service.

A sandbox with N brokers (streamlib/sandbox.py) and its bookies; two named producers
publish to one stream through the stream service with deduplication (each numbers its
messages; a restarted one goes on after the last its name published), and two shared
consumers split the stream. For --seconds, faults planned from --seed
(streamlib.chaos.plan.plan_service_faults) hit one process at a time: a broker
SIGKILLed and restarted, a broker SIGSTOPped past its metadata session and continued,
a producer SIGKILLed and restarted under the same name, a consumer SIGKILLed and
restarted; with --disk-faults, bookies' disks fail for a while besides (they may overlap
the others, never more than max_down() bookies at once: --bookies 4 for one; three
bookies get none). Then the producers stop (flushing), the consumers drain, and a reader reads
the stream from the start directly from the bookies: in this mode it is the verdict's
reader (streamlib.chaos.verdict).

The verdict: every acknowledged message is in the stream (nothing lost), none is in it
twice (deduplication across failovers), each producer's messages are in its order, and
the consumers received every acknowledged message at least once; and a run of at least
20 minutes fails if a process's resources grew (streamlib.chaos.resources).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamlib.chaos import verdict as v
from streamlib.chaos.events import producer_and_seq
from streamlib.chaos.plan import SESSION_S, last_end_s, plan_service_faults, with_disk_faults
from streamlib.chaos.run import ChaosRun
from streamlib.sandbox import Sandbox

STREAM = "chaos-service"
PRODUCERS = ["P0", "P1"]
CONSUMERS = ["C0", "C1"]
SUBSCRIPTION = "workers"
SHOWN = 20  # of each kind of violation, in the report
# The report's names of the faults (the plan's kill-broker is its broker-kill).
REPORTED = {"kill-broker": "broker-kill", "pause-broker": "broker-stop",
            "kill-producer": "producer-kill", "kill-consumer": "consumer-kill"}  # fmt: skip


class ServiceRun(ChaosRun):
    """Broker mode: brokers over the bookies, one stream, named producers, shared consumers."""

    temp_prefix = "streamlib-chaos-service-"
    consumer_type = "shared"

    def __init__(
        self, root: Path, seed: int, args: argparse.Namespace, say: Callable[[str], None]
    ) -> None:
        sandbox = Sandbox(root / "cluster", bookies=args.bookies, port_base=0, brokers=args.brokers)
        for broker in sandbox.brokers:
            broker.extra += ["--session-timeout", str(SESSION_S)]
        super().__init__(
            root, seed, say, sandbox, [STREAM],
            disk_faults=args.disk_faults, sample_interval_s=args.sample_interval,
        )  # fmt: skip
        self.stored = 0  # messages the final scan read

    def worker_args(self, role: str, slot: str) -> list[str]:
        if role == "reader":  # (directly from the bookies: no broker in the way)
            return ["--url", self.sandbox.metadata_uri]
        service = ["--url", self.sandbox.service_url]
        if role == "producer":
            return [*service, "--name", slot]
        return [*service, "--subscription", SUBSCRIPTION, "--type", self.consumer_type]

    def play(self, args: argparse.Namespace) -> v.Verdict:
        self.say(f"chaos (broker mode): seed {self.seed}, {args.brokers} brokers, "
                 f"{args.bookies} bookies, {args.seconds:.0f} s of faults")  # fmt: skip
        self.sandbox.start()
        self.record("cluster-started", brokers=[b.address for b in self.sandbox.brokers])
        # (the consumers start first: a subscription does not create its stream)
        self.create_streams(self.sandbox.service_url, [([STREAM], {})])
        for name in CONSUMERS:
            self.spawn("consumer", STREAM, slot=name)
        for name in PRODUCERS:
            self.spawn("producer", STREAM, slot=name)
        faults = plan_service_faults(self.seed, args.seconds, args.brokers, PRODUCERS, CONSUMERS)
        if args.disk_faults:
            faults = with_disk_faults(faults, self.seed, args.seconds, args.bookies)
        self.inject(faults, last_end_s(faults))  # every fault ends on its own: no heal cuts it
        self.heal_nodes()
        self.stop_producers()
        self.drain(args.drain_timeout)
        self.final_scan()
        histories = self.histories()
        self.stored = len(histories[STREAM].scan or ())
        return v.judge(histories, healed_at=None)

    def report(self, verdict: v.Verdict, args: argparse.Namespace) -> dict[str, Any]:
        stream = verdict.streams[STREAM]
        disordered = {producer_and_seq(f.payload) for f in stream.reordered}
        extras = self.extras_report(args.seconds)
        return {
            "ok": verdict.safe and stream.acknowledged > 0 and extras["resources_ok"],
            "acknowledged": stream.acknowledged,
            "stored": self.stored,
            "lost": sorted(stream.lost_by_reader)[:SHOWN],
            "duplicated": sorted({f.payload for f in stream.duplicated})[:SHOWN],
            "disordered_producers": sorted({sent[0] for sent in disordered if sent}),
            "not_received": sorted(stream.lost_by_consumer)[:SHOWN],
            "redeliveries": stream.redelivered,
            "faults": Counter(REPORTED[e["what"]] for e in self.events if e["what"] in REPORTED),
            "seed": self.seed,
            "replay": f"streamlib chaos --brokers {args.brokers} --bookies {args.bookies} "
            f"--seconds {args.seconds:g} --seed {self.seed}"
            + (" --disk-faults" if args.disk_faults else ""),
            **extras,
        }

    @staticmethod
    def print_report(report: dict[str, Any]) -> None:
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
        ChaosRun.print_extras(report)
