"""`streamlib chaos`: its flags, and what both modes do around a run -- the seed, the
data directory, stopping every process however the run ends, printing the verdict.

Exit code: 0 if the run passed (direct.py and service.py say what that takes); 1 if
not; 2 for usage errors; 3 if the cluster could not be run at all.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from bookie.launcher import BookieStartError
from streamlib.broker.launcher import BrokerStartError
from streamlib.chaos.direct import DEFAULT_CLIENT_TIMEOUT_S, DirectRun
from streamlib.chaos.hosts import NetnsUnavailableError, WorkerError
from streamlib.chaos.service import ServiceRun
from streamlib.sandbox import SandboxError


def run(args: argparse.Namespace) -> int:
    if args.brokers < 0 or (args.brokers and args.brokers < 2):
        print("streamlib chaos: --brokers is 0 (direct mode) or at least 2", file=sys.stderr)
        return 2
    if args.sample_interval <= 0:
        print("streamlib chaos: --sample-interval must be > 0", file=sys.stderr)
        return 2
    if args.seconds <= 0 or args.bookies < 3:
        print("streamlib chaos: --seconds must be > 0 and --bookies >= 3", file=sys.stderr)
        return 2
    if args.data_dir is not None and args.data_dir.exists() and any(args.data_dir.iterdir()):
        print(f"streamlib chaos: {args.data_dir} is not empty", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    mode: type[DirectRun] | type[ServiceRun] = ServiceRun if args.brokers else DirectRun
    if args.partitions:  # the same mode, on network-namespace hosts
        from streamlib.chaos.partitions import PartitionedDirectRun, PartitionedServiceRun

        mode = PartitionedServiceRun if args.brokers else PartitionedDirectRun
    root = args.data_dir or Path(tempfile.mkdtemp(prefix=mode.temp_prefix))

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too stops every process before exiting

    signal.signal(signal.SIGTERM, interrupted)
    chaos = mode(root, seed, args, say)
    try:
        verdict = chaos.play(args)
    except (SandboxError, BookieStartError, BrokerStartError, WorkerError) as error:
        print(f"streamlib chaos: the cluster could not run: {error}", file=sys.stderr)
        return 3
    except NetnsUnavailableError as error:
        print(f"streamlib chaos: --partitions needs network namespaces: {error}", file=sys.stderr)
        return 3
    finally:
        chaos.shutdown()
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    report = chaos.report(verdict, args)
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        chaos.print_report(report)
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
        "killed and stopped (streamlib/chaos/service.py); 0 (default): direct mode",
    )
    parser.add_argument(
        "--partitions",
        action="store_true",
        help="run ZooKeeper, each bookie, each broker and the clients on hosts of their own "
        "(Linux network namespaces; root) and partition them too: a host cut off, a majority "
        "of the bookies, a client from one broker, one direction only, ZooKeeper from a broker",
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
    parser.add_argument(
        "--disk-faults", action="store_true",
        help="also fail the bookies' disks for a while (EIO, ENOSPC, a slow fsync) through "
        "their failpoints (streamlib/chaos/plan.py)",
    )  # fmt: skip
    parser.add_argument(
        "--sample-interval", type=float, default=60.0,
        help="seconds between samples of every process's RSS and open descriptors (default 60)",
    )  # fmt: skip
    parser.set_defaults(run=run)
