"""What a `streamlib chaos` run's processes hold while it goes on: the resident memory
(RSS) and the open file descriptors of every bookie, broker and worker, and of the
chaos process itself, sampled every --sample-interval seconds (default 60) while the
faults go on, during the heal and the drain.

A series is one incarnation of one process: "bookie-0#1", "producer P0#3" -- a
restarted process starts a new series. Every sample is also a line of
ROOT/logs/resources.jsonl.

The judgement (judge, pure: no clock, no /proc) looks past a warm-up -- the first five
minutes or the first third of the run, whichever is shorter, counted for each series
from the later of the run's start and its own first sample (a process started late
warms up too). A series is judged when it has at least MIN_JUDGED samples past its
warm-up; it grows if the median of its last three samples is above the median of its
first three past the warm-up by more than max(20 %, 32 MiB) of RSS or more than 50
descriptors. The run is flat when no judged series grows -- the chaos process's own
series is reported, not judged: it keeps every event of the run for the verdict, so it
grows with the messages by design. Only a run of at least
JUDGED_RUN_S (20 minutes) fails on it: a shorter one cannot tell a leak from a
warm-up.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WARMUP_MAX_S = 300.0
MIN_JUDGED = 3  # samples past the warm-up
RSS_GROWTH = 0.20  # of the first RSS past the warm-up ...
RSS_GROWTH_MIB = 32.0  # ... or this, whichever is more
FD_GROWTH = 50
JUDGED_RUN_S = 1200.0
VERIFIER = "chaos"  # the harness's own series (see above: reported, not judged)


@dataclass
class Series:
    """One incarnation of one process: (t, RSS MiB, fds) samples, t from the run's start."""

    name: str
    samples: list[tuple[float, float, int]] = field(default_factory=list)


def warmup_s(run_s: float) -> float:
    return min(WARMUP_MAX_S, run_s / 3)


def judge_series(series: Series, run_s: float) -> dict[str, Any]:
    """A series's figures; "grows" is None when it has too few samples past its warm-up."""
    rss = [r for _, r, _ in series.samples]
    fds = [f for _, _, f in series.samples]
    start = max(warmup_s(run_s), series.samples[0][0] + warmup_s(run_s))
    after = [(r, f) for t, r, f in series.samples if t >= start]
    figures: dict[str, Any] = {
        "samples": len(rss),
        "max_rss_mib": max(rss),
        "max_fds": max(fds),
        "grows": None,
    }
    if after:
        figures.update(
            first_rss_mib=after[0][0], last_rss_mib=after[-1][0],
            first_fds=after[0][1], last_fds=after[-1][1],
        )  # fmt: skip
    if len(after) >= MIN_JUDGED:
        rss_growth = statistics.median(r for r, _ in after[-3:]) - statistics.median(
            r for r, _ in after[:3]
        )
        fd_growth = statistics.median(f for _, f in after[-3:]) - statistics.median(
            f for _, f in after[:3]
        )
        allowed_mib = max(RSS_GROWTH * statistics.median(r for r, _ in after[:3]), RSS_GROWTH_MIB)
        figures.update(
            growth_rss_mib=round(rss_growth, 1),
            growth_fds=fd_growth,
            grows=rss_growth > allowed_mib or fd_growth > FD_GROWTH,
        )
    return figures


def judge(series: list[Series], run_s: float) -> dict[str, Any]:
    """The report's resources section: each series's figures and whether all are flat."""
    figures = {s.name: judge_series(s, run_s) for s in series if s.samples}
    growing = sorted(
        name for name, f in figures.items() if f["grows"] and name.split("#")[0] != VERIFIER
    )
    return {
        "warmup_s": round(warmup_s(run_s), 1),
        "judged": sum(f["grows"] is not None for f in figures.values()),
        "growing": growing,
        "flat": not growing,
        "series": figures,
    }


def sample_process(pid: int) -> tuple[float, int] | None:
    """(RSS MiB, open descriptors) of a live process; None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            resident_pages = int(f.read().split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None  # exited meanwhile (or a zombie's fds are gone)
    return round(resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1), fds


class Sampler:
    """The harness's side: samples the processes it is given, when one is due."""

    def __init__(self, path: Path, interval_s: float, t0: float) -> None:
        self.path, self.interval_s, self.t0 = path, interval_s, t0
        self.series: dict[str, Series] = {}
        self._keys: dict[tuple[str, int], str] = {}  # (name, pid): its series
        self._incarnations: dict[str, int] = {}  # of each name so far
        self._next = t0

    def due(self, now: float) -> bool:
        return now >= self._next

    def sample(self, now: float, processes: list[tuple[str, int]]) -> None:
        """One sample of each (name, pid); a new pid under a known name is a new series
        (two processes may share a name at once: a duel's two producers)."""
        self._next = now + self.interval_s
        t = round(now - self.t0, 2)
        lines = []
        for name, pid in processes:
            figures = sample_process(pid)
            if figures is None:
                continue
            key = self._keys.get((name, pid))
            if key is None:
                self._incarnations[name] = self._incarnations.get(name, 0) + 1
                key = self._keys[name, pid] = f"{name}#{self._incarnations[name]}"
            self.series.setdefault(key, Series(key)).samples.append((t, *figures))
            lines.append(
                json.dumps(
                    {"t": t, "series": key, "pid": pid, "rss_mib": figures[0], "fds": figures[1]}
                )
            )
        with self.path.open("a") as f:
            f.writelines(line + "\n" for line in lines)
