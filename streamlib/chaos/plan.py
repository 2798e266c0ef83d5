"""The faults of a `streamlib chaos` run, planned from its seed alone: the same seed
gives the same plan, whatever happens while it runs (replaying a seed replays the
faults, at the same offsets; the cluster's timing still varies).

One Fault type and one timeline for both modes; each mode has its own menu of faults:

- direct mode (plan_faults): bookies SIGKILLed and restarted or SIGSTOPped and
  continued, never more than max_down() at once and possibly overlapping; producers
  SIGKILLed; duels (a second producer takes the stream over while the first runs);
  consumers SIGKILLed.
- broker mode (plan_service_faults): one fault at a time -- a broker SIGKILLed and
  restarted, a broker SIGSTOPped past its metadata session and continued, a named
  producer or a shared consumer SIGKILLed and restarted.

Pure: no clock, no processes (streamlib.chaos.run carries the plan out).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("kill-bookie", "pause-bookie", "kill-producer", "duel", "kill-consumer")
WEIGHTS = (3, 2, 2, 2, 1)
RESTART_SLACK_S = 1.5  # a bookie restart takes about this long: planned outages keep clear

# Broker mode, drawn uniformly (the order is part of what a seed means).
SERVICE_KINDS = ("kill-broker", "pause-broker", "kill-producer", "kill-consumer")
SERVICE_RESTART_S = 1.0  # a restart (of a broker or a worker) takes about this long
SESSION_S = 3.0  # the brokers' metadata session: a SIGSTOP lasts longer than this

# A fault that takes something away, and the step that gives it back.
ENDS = {
    "kill-bookie": "restart-bookie",
    "pause-bookie": "resume-bookie",
    "kill-broker": "restart-broker",
    "pause-broker": "resume-broker",
    "duel": "end-duel",
}


def max_down(bookies: int) -> int:
    """Bookies that may be down at once: E=3 must still find 3 writable ones."""
    return max(0, min(2, bookies - 3))


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the faults began
    kind: str  # one of KINDS or SERVICE_KINDS
    target: str  # a bookie or broker index, a stream, or a worker's name
    duration_s: float = 0.0  # until the restart / SIGCONT / the end of the duel
    survivor: str = ""  # a duel's end keeps the "older" or the "newer" producer


def plan_faults(seed: int, seconds: float, bookies: int, streams: list[str]) -> list[Fault]:
    """Direct mode's faults, from its seed alone (the same seed, the same plan). Bookie
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


def plan_service_faults(
    seed: int, seconds: float, brokers: int, producers: list[str], consumers: list[str]
) -> list[Fault]:
    """Broker mode's faults, from its seed alone: one at a time, each 1-3 s after the
    previous one is over, filling about `seconds` (the last one may end after it). A
    stopped broker stays stopped past its metadata session, so another takes its
    streams over; a killed one is down 0.5-2 s. Workers are named by the plan."""
    rng = random.Random(seed)
    workers = {"kill-producer": producers, "kill-consumer": consumers}
    faults: list[Fault] = []
    elapsed = 0.0
    while elapsed < seconds:
        pause, kind, draw = rng.uniform(1.0, 3.0), rng.choice(SERVICE_KINDS), rng.randrange(1 << 16)
        # (a hold is drawn for every kind, as it always was: a seed keeps its plan)
        hold = rng.uniform(0.5, 2.0) if kind == "kill-broker" else SESSION_S + rng.uniform(1.0, 3.0)
        if kind in workers:
            target, hold = workers[kind][draw % len(workers[kind])], 0.0
        else:
            target = str(draw % brokers)
        faults.append(Fault(round(elapsed + pause, 3), kind, target, round(hold, 3)))
        elapsed += pause + hold + (SERVICE_RESTART_S if kind != "pause-broker" else 0.0)
    return faults


def timeline(faults: list[Fault], seconds: float) -> list[tuple[float, str, Fault]]:
    """Each fault's start and, for outages and duels, its end; up to `seconds` only
    (the heal ends whatever is still going on then)."""
    steps = [(f.at_s, f.kind, f) for f in faults]
    steps += [(f.at_s + f.duration_s, ENDS[f.kind], f) for f in faults if f.kind in ENDS]
    return sorted((s for s in steps if s[0] <= seconds), key=lambda s: s[0])


def last_end_s(faults: list[Fault]) -> float:
    """When the last of the faults is over (a plan that is not cut short by a heal)."""
    return max((f.at_s + f.duration_s for f in faults), default=0.0)
