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
- either mode, with --disk-faults (plan_disk_faults, merged into the mode's plan): a
  bookie's disk fails for a while through its failpoints directory (bookie/failpoints.py)
  -- eio-write (journal writes fail with EIO), eio-sync (the journal's or the entry
  log's fsync fails with EIO), enospc (journal and entry-log writes fail with ENOSPC),
  slow-sync (every journal fsync takes 0.2-0.5 s longer). A bookie with a failing disk
  counts as down: outages and disk faults together never exceed max_down() at once.
  They are drawn from a generator of their own (seeded with seed ^ DISK_SEED), after
  and around the mode's plan, which stays what the seed always gave.

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

# Disk faults (--disk-faults), drawn uniformly, and the failpoints each arms.
DISK_KINDS = ("eio-write", "eio-sync", "enospc", "slow-sync")
DISK_SEED = 0x5EED_D15C  # their generator's seed is the run's seed ^ this
SYNC_STEPS = ("journal-sync", "entrylog-sync")  # eio-sync fails one of them
DISK_SLACK_S = 0.5  # a bookie takes writes again this soon after its disk does (its probe)

# A fault that takes something away, and the step that gives it back.
ENDS = {
    "kill-bookie": "restart-bookie",
    "pause-bookie": "resume-bookie",
    "kill-broker": "restart-broker",
    "pause-broker": "resume-broker",
    "duel": "end-duel",
    **dict.fromkeys(DISK_KINDS, "heal-disk"),
}


def max_down(bookies: int) -> int:
    """Bookies that may be down at once: E=3 must still find 3 writable ones."""
    return max(0, min(2, bookies - 3))


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the faults began
    kind: str  # one of KINDS, SERVICE_KINDS or DISK_KINDS
    target: str  # a bookie or broker index, a stream, or a worker's name
    duration_s: float = 0.0  # until the restart / SIGCONT / the end of the duel / the heal
    survivor: str = ""  # a duel's end keeps the "older" or the "newer" producer
    failpoints: tuple[tuple[str, str], ...] = ()  # a disk fault's (step, action) pairs


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


def plan_disk_faults(seed: int, seconds: float, bookies: int, outages: list[Fault]) -> list[Fault]:
    """Disk faults on the bookies for about `seconds`, from the seed alone, fitted around
    the bookie outages already planned (kill-bookie, pause-bookie): one lasts 1-3 s; a
    bookie has one outage or disk fault at a time, and the bookies with either, from a
    fault's start to its end (plus RESTART_SLACK_S or DISK_SLACK_S), stay within
    max_down()."""
    rng = random.Random(seed ^ DISK_SEED)
    busy = [  # (from, until, bookie) of what is planned so far
        (f.at_s, f.at_s + f.duration_s + RESTART_SLACK_S, int(f.target))
        for f in outages
        if f.kind in ("kill-bookie", "pause-bookie")
    ]
    faults: list[Fault] = []
    t = rng.uniform(1.0, 3.0)
    while t < seconds:
        kind, draw = rng.choice(DISK_KINDS), rng.randrange(1 << 16)
        duration, slow_s = round(rng.uniform(1.0, 3.0), 3), round(rng.uniform(0.2, 0.5), 2)
        until = t + duration + DISK_SLACK_S
        taken = {b for start, end, b in busy if start < until and t < end}
        free = [b for b in range(bookies) if b not in taken]
        if free and len(taken) < max_down(bookies):
            target = free[draw % len(free)]
            failpoints = {
                "eio-write": (("journal-write", "EIO"),),
                "eio-sync": ((SYNC_STEPS[draw % 2], "EIO"),),
                "enospc": (("journal-write", "ENOSPC"), ("entrylog-write", "ENOSPC")),
                "slow-sync": (("journal-sync", f"slow={slow_s}"),),
            }[kind]
            busy.append((t, until, target))
            faults.append(Fault(round(t, 3), kind, str(target), duration, failpoints=failpoints))
        t += rng.uniform(0.5, 2.0)
    return faults


def with_disk_faults(faults: list[Fault], seed: int, seconds: float, bookies: int) -> list[Fault]:
    """A mode's plan with plan_disk_faults merged in, in the order of their starts."""
    disk = plan_disk_faults(seed, seconds, bookies, faults)
    return sorted([*faults, *disk], key=lambda f: f.at_s)


def timeline(faults: list[Fault], seconds: float) -> list[tuple[float, str, Fault]]:
    """Each fault's start and, for outages, duels and disk faults, its end; up to `seconds` only
    (the heal ends whatever is still going on then)."""
    steps = [(f.at_s, f.kind, f) for f in faults]
    steps += [(f.at_s + f.duration_s, ENDS[f.kind], f) for f in faults if f.kind in ENDS]
    return sorted((s for s in steps if s[0] <= seconds), key=lambda s: s[0])


def last_end_s(faults: list[Fault]) -> float:
    """When the last of the faults is over (a plan that is not cut short by a heal)."""
    return max((f.at_s + f.duration_s for f in faults), default=0.0)
