"""Choosing bookies for new ensembles and for replacements.

Default: uniformly at random among writable bookies, avoiding ones that failed
recently: those come last, the longest-ago failure first, and only as many of them as
the request needs beyond the healthy ones (a failure is a reason to prefer others, never
a ban: a cluster that had a few failures must still place ensembles). Rack-aware (BookKeeper's RackawareEnsemblePlacementPolicy in spirit): every
write set should span at least two racks when the cluster has two; a new ensemble
interleaves racks so that neighbours (and so every striped write set) differ, and a
replacement prefers a rack that keeps the write sets around its slot mixed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from streamlib.protocol import ensemble_write_sets
from streamlib.protocol.errors import NotEnoughBookiesError


@dataclass(frozen=True)
class Candidate:
    bookie_id: str
    rack: str = ""


class PlacementPolicy:
    def __init__(
        self,
        *,
        rack_aware: bool = False,
        failure_memory_s: float = 60.0,
        rnd: random.Random | None = None,
    ) -> None:
        self.rack_aware = rack_aware
        self.failure_memory_s = failure_memory_s
        self._rnd = rnd or random.Random()
        self._failed_at: dict[str, tuple[float, int]] = {}  # (when, order of failures)
        self._failures = 0

    def record_failure(self, bookie_id: str) -> None:
        self._failures += 1
        self._failed_at[bookie_id] = (time.monotonic(), self._failures)

    def _usable(
        self, writable: Iterable[Candidate], exclude: Iterable[str], count: int
    ) -> list[Candidate]:
        """The candidates to choose `count` from: every healthy one, topped up with the
        recently failed ones that failed longest ago when the healthy are too few."""
        now = time.monotonic()
        excluded = set(exclude)
        fresh = [c for c in writable if c.bookie_id not in excluded]
        healthy: list[Candidate] = []
        failed: list[tuple[tuple[float, int], Candidate]] = []
        for c in fresh:
            when = self._failed_at.get(c.bookie_id)
            if when is None or now - when[0] > self.failure_memory_s:
                healthy.append(c)
            else:
                failed.append((when, c))
        failed.sort(key=lambda pair: pair[0])
        return healthy + [c for _, c in failed[: max(0, count - len(healthy))]]

    def new_ensemble(
        self, writable: Sequence[Candidate], ensemble_size: int, write_quorum: int
    ) -> list[str]:
        pool = self._usable(writable, (), ensemble_size)
        if len(pool) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies, {len(pool)} available"
            )
        chosen = self._rnd.sample(pool, ensemble_size)
        if self.rack_aware:
            chosen = self._interleave_racks(pool, ensemble_size)
        return [c.bookie_id for c in chosen]

    def _interleave_racks(self, pool: list[Candidate], size: int) -> list[Candidate]:
        by_rack: dict[str, list[Candidate]] = {}
        for candidate in self._rnd.sample(pool, len(pool)):
            by_rack.setdefault(candidate.rack, []).append(candidate)
        racks = sorted(by_rack.values(), key=len, reverse=True)
        picked: list[Candidate] = []
        while len(picked) < size:
            for group in racks:
                if group and len(picked) < size:
                    picked.append(group.pop())
        return picked

    def replacements(
        self,
        writable: Sequence[Candidate],
        count: int,
        exclude: Iterable[str],
        ensemble: Sequence[str] = (),
        slots: Sequence[int] = (),
        write_quorum: int = 0,
        racks: dict[str, str] | None = None,
    ) -> list[str]:
        pool = self._usable(writable, exclude, count)
        if len(pool) < count:
            raise NotEnoughBookiesError(f"need {count} replacement bookies, {len(pool)} available")
        if not (self.rack_aware and ensemble and slots and write_quorum):
            return [c.bookie_id for c in self._rnd.sample(pool, count)]
        rack_of = dict(racks or {})
        rack_of.update({c.bookie_id: c.rack for c in pool})
        current = list(ensemble)
        chosen: list[str] = []
        for slot in list(slots)[:count]:
            sets = [ws for ws in ensemble_write_sets(len(current), write_quorum) if slot in ws]

            def mixed(
                candidate: Candidate, sets: list[tuple[int, ...]] = sets, slot: int = slot
            ) -> int:
                score = 0
                for ws in sets:
                    members = {rack_of.get(current[i], "") for i in ws if i != slot}
                    score += len(members | {candidate.rack}) >= 2
                return score

            options = [c for c in pool if c.bookie_id not in chosen]
            self._rnd.shuffle(options)
            best = max(options, key=mixed)
            chosen.append(best.bookie_id)
            current[slot] = best.bookie_id
        return chosen
