"""The faults of a `streamlib chaos` run, planned from its seed alone: the same seed
gives the same plan, whatever happens while it runs (replaying a seed replays the
faults, at the same offsets; the cluster's timing still varies).

Pure: no clock, no processes (streamlib.chaos carries the plan out).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("kill-bookie", "pause-bookie", "kill-producer", "duel", "kill-consumer")
WEIGHTS = (3, 2, 2, 2, 1)
RESTART_SLACK_S = 1.5  # a bookie restart takes about this long: planned outages keep clear


def max_down(bookies: int) -> int:
    """Bookies that may be down at once: E=3 must still find 3 writable ones."""
    return max(0, min(2, bookies - 3))


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the faults began
    kind: str  # one of KINDS
    target: str  # a bookie index, or a stream name
    duration_s: float = 0.0  # until the restart / SIGCONT / the end of the duel
    survivor: str = ""  # a duel's end keeps the "older" or the "newer" producer


def plan_faults(seed: int, seconds: float, bookies: int, streams: list[str]) -> list[Fault]:
    """The faults of a run, from its seed alone (the same seed, the same plan). Bookie
    outages (with their restart time) never overlap on one bookie nor exceed max_down;
    a stream has one duel at a time."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy_until = [0.0] * bookies
    duel_until = dict.fromkeys(streams, 0.0)
    t = rng.uniform(1.0, 2.0)
    while t < seconds:
        kind = rng.choices(KINDS, WEIGHTS)[0]
        stream = rng.choice(streams)
        duration = round(rng.uniform(1.0, 5.0), 3)
        if kind in ("kill-bookie", "pause-bookie"):
            idle = [i for i in range(bookies) if busy_until[i] <= t]
            if bookies - len(idle) < max_down(bookies):
                target = rng.choice(idle)
                busy_until[target] = t + duration + RESTART_SLACK_S
                faults.append(Fault(round(t, 3), kind, str(target), duration))
        elif kind == "duel":
            if duel_until[stream] <= t:
                duel_until[stream] = t + duration + 1.0
                survivor = rng.choice(("older", "newer"))
                faults.append(Fault(round(t, 3), kind, stream, duration, survivor))
        else:
            faults.append(Fault(round(t, 3), kind, stream))
        t += rng.uniform(0.5, 2.0)
    return faults


def timeline(faults: list[Fault], seconds: float) -> list[tuple[float, str, Fault]]:
    """Each fault's start and, for outages and duels, its end; before `seconds` only
    (the heal ends whatever is still going on then)."""
    ends = {"kill-bookie": "restart-bookie", "pause-bookie": "resume-bookie", "duel": "end-duel"}
    steps = [(f.at_s, f.kind, f) for f in faults]
    steps += [(f.at_s + f.duration_s, ends[f.kind], f) for f in faults if f.kind in ends]
    return sorted((s for s in steps if s[0] < seconds), key=lambda s: s[0])
