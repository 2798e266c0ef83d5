"""Run the deterministic simulator over many seeds, or replay one.

python -m tests.sim --seeds 20000            # the long run
python -m tests.sim --seed 1234 --trace      # replay one seed and print its trace
python -m tests.sim --seeds 2000 --mutation skip_fencing   # must find a violation
python -m tests.sim --streams --seeds 2000   # stream writers dueling, readers, outages
python -m tests.sim --service --seeds 5000   # brokers owning a stream: kills, stops, cuts
python -m tests.sim --compaction --seeds 2000   # compactors racing and dying, retention, readers
python -m tests.sim --compaction --compaction-as-is own_node --seed 0   # a bug of streamlib
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tests.sim.compaction import FIXES, GRACES, run_compaction_seed
from tests.sim.compaction import MUTATIONS as COMPACTION_MUTATIONS
from tests.sim.placement import run_placement_seed
from tests.sim.scenario import MUTATIONS, InvariantViolation, run_seed
from tests.sim.service import MUTATIONS as SERVICE_MUTATIONS
from tests.sim.service import run_service_seed
from tests.sim.streams import run_stream_seed
from tests.sim.unbounded import run_unbounded_seed


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=2000, help="run seeds 0..N-1")
    parser.add_argument("--first", type=int, default=0, help="first seed of the range")
    parser.add_argument("--seed", type=int, help="replay just this seed")
    parser.add_argument("--mutation", choices=sorted(MUTATIONS), default="none")
    parser.add_argument("--trace", action="store_true", help="print the trace of --seed")
    parser.add_argument("--unbounded", action="store_true", help="term mode scenarios")
    parser.add_argument(
        "--skip-truncate", action="store_true", help="with --unbounded: the unsafe variant"
    )
    parser.add_argument("--placement", action="store_true", help="repeated bookie failures")
    parser.add_argument("--streams", action="store_true", help="stream writers and readers")
    parser.add_argument(
        "--reader-fences", action="store_true", help="with --streams: the unsafe variant"
    )
    parser.add_argument("--service", action="store_true", help="brokers owning a stream")
    parser.add_argument(
        "--service-mutation", choices=SERVICE_MUTATIONS, default="none",
        help="with --service: an unsafe variant",
    )  # fmt: skip
    parser.add_argument(
        "--compaction", action="store_true", help="compactors, retention, compacted readers"
    )
    parser.add_argument(
        "--compaction-mutation", choices=COMPACTION_MUTATIONS, default="none",
        help="with --compaction: an unsafe variant",
    )  # fmt: skip
    parser.add_argument(
        "--compaction-grace", type=int, default=None,
        help="with --compaction: the sweeper's grace in steps "
        f"(default: each seed picks one of {GRACES})",
    )  # fmt: skip
    parser.add_argument(
        "--compaction-as-is", choices=sorted(FIXES), action="append", default=[],
        help="with --compaction: model this bug as streamlib has it (the model assumes "
        "it fixed otherwise; repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--keep-failed", action="store_true", help="with --placement: the unsafe variant"
    )
    args = parser.parse_args()
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    start = time.perf_counter()
    scenario: Any
    missed = 0
    for count, seed in enumerate(seeds, start=1):
        try:
            if args.compaction:
                scenario = run_compaction_seed(
                    seed, args.compaction_mutation, args.compaction_grace, args.compaction_as_is
                )
                missed += scenario.missed_deletions
            elif args.service:
                scenario = run_service_seed(seed, args.service_mutation)
            elif args.streams:
                scenario = run_stream_seed(seed, reader_fences=args.reader_fences)
            elif args.placement:
                scenario = run_placement_seed(seed, keep_failed=args.keep_failed)
            elif args.unbounded:
                scenario = run_unbounded_seed(seed, skip_truncate=args.skip_truncate)
            else:
                scenario = run_seed(seed, args.mutation)
        except InvariantViolation as violation:
            print(violation)
            print(f"FAILED at seed {seed} after {count} seeds")
            return 1
        if args.trace:
            trace = scenario.trace if args.service or args.compaction else scenario.world.trace
            print("\n".join(trace))
        if count % 1000 == 0:
            print(f"{count} seeds ok ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"all {count} seeds passed in {time.perf_counter() - start:.1f} s")
    if args.compaction:
        print(f"(compacted readers that lagged behind a compaction missed {missed} deletions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
