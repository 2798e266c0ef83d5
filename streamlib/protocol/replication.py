"""The decisions of auto-recovery (ARCHITECTURE.md §6, autorecovery.txt), with no I/O.

Theory of operation. A fragment i of a ledger holds the entries from its first entry up
to the next fragment's first entry - 1; the last fragment of a CLOSED ledger ends at
last_entry_id, and the last fragment of an OPEN (or IN_RECOVERY) ledger has no end yet:
its writer still owns it. A bookie of a fragment's ensemble holds exactly the entries
of the range whose write set includes it.

When bookies are lost, every fragment with one of them in its ensemble is
under-replicated. A worker re-replicates a fragment whose range is known by copying the
lost bookie's entries from surviving replicas to a replacement bookie and swapping the
bookie in the metadata. It must not touch an OPEN ledger's last fragment while the
writer may still be adding to it (the writer would keep writing to the bookie the
metadata no longer names): it waits out a grace period for the writer's own ensemble
change or close, then fences and recovers the ledger (which CLOSEs it, fixing the
range) and plans again.

The I/O layer (streamlib.autorecovery) asks these functions and carries out the answer.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from streamlib.protocol.errors import NotEnoughBookiesError
from streamlib.protocol.ledger_metadata import LedgerMetadata
from streamlib.protocol.states import LedgerState


@dataclass(frozen=True)
class FragmentRange:
    """Fragment `index` covers entries first..last; last is None while a writer owns it."""

    index: int
    first: int
    last: int | None
    ensemble: tuple[str, ...]

    @property
    def is_sealed(self) -> bool:
        return self.last is not None

    @property
    def is_empty(self) -> bool:
        return self.last is not None and self.last < self.first


def fragment_ranges(md: LedgerMetadata) -> list[FragmentRange]:
    """Every fragment's entry range. Entries below md.first_entry_id were dropped by
    retention and are not part of any range."""
    ranges = []
    for index, fragment in enumerate(md.fragments):
        last: int | None
        if index + 1 < len(md.fragments):
            last = md.fragments[index + 1].first_entry_id - 1
        elif md.state is LedgerState.CLOSED:
            last = md.last_entry_id
        else:
            last = None
        first = max(fragment.first_entry_id, md.first_entry_id)
        ranges.append(FragmentRange(index, first, last, fragment.ensemble))
    return ranges


def entries_on_bookie(
    md: LedgerMetadata, fragment: FragmentRange, bookie: str
) -> range | list[int]:
    """The entries of a sealed fragment that `bookie` must hold (those whose write set
    includes it)."""
    if fragment.last is None:
        raise ValueError(f"fragment {fragment.index} of ledger {md.ledger_id} is not sealed")
    position = fragment.ensemble.index(bookie)
    span = range(fragment.first, fragment.last + 1)
    if md.write_quorum == md.ensemble_size:
        return span  # every entry is on every bookie of the ensemble
    return [e for e in span if position in md.write_set(e)]


@dataclass(frozen=True)
class FragmentCopy:
    """Copy `entries` of fragment `fragment_index` to a replacement of `bookie`."""

    fragment_index: int
    bookie: str
    entries: range | list[int]


@dataclass(frozen=True)
class ReplicationPlan:
    """What a worker does next for one ledger.

    - copies: sealed fragments to re-replicate now (each then swapped by CAS);
    - recover: fence and recover the ledger first (its last fragment is under-replicated
      and the writer's grace period is over, or a recovery was left unfinished);
    - wait_until_ms: the writer's grace period ends then; come back to the last fragment.
    Nothing to do at all (no copies, no recover, no wait) means the ledger is healthy.
    """

    copies: tuple[FragmentCopy, ...] = ()
    recover: bool = False
    wait_until_ms: int | None = None

    @property
    def is_done(self) -> bool:
        return not self.copies and not self.recover and self.wait_until_ms is None


def plan_replication(
    md: LedgerMetadata,
    missing: Collection[str],
    *,
    now_ms: int,
    marked_ms: int,
    grace_period_ms: int,
) -> ReplicationPlan:
    """Decide what to do for a ledger whose `missing` bookies lost (or never had) their
    data. `marked_ms` is when the ledger was marked: the writer's grace starts there."""
    copies: list[FragmentCopy] = []
    writer_owned = False
    for fragment in fragment_ranges(md):
        for bookie in fragment.ensemble:
            if bookie not in missing:
                continue
            if fragment.is_sealed:
                copies.append(
                    FragmentCopy(fragment.index, bookie, entries_on_bookie(md, fragment, bookie))
                )
            else:
                writer_owned = True
    if md.state is LedgerState.IN_RECOVERY and (copies or writer_owned):
        # A recovery is running or was abandoned; the state table allows no swap until
        # it ends, and finishing it is safe (recoveries converge on one CLOSED).
        return ReplicationPlan(recover=True)
    recover = False
    wait_until_ms = None
    if writer_owned:
        deadline = marked_ms + grace_period_ms
        if now_ms >= deadline:
            recover = True
        else:
            wait_until_ms = deadline
    return ReplicationPlan(tuple(copies), recover, wait_until_ms)


def choose_replacement(candidates: Sequence[str], ensemble: Sequence[str], ledger_id: int) -> str:
    """A writable bookie not already in the fragment's ensemble. The choice is
    deterministic per ledger (a retried copy goes to the same bookie) and spreads
    ledgers over the candidates."""
    eligible = sorted(set(candidates) - set(ensemble))
    if not eligible:
        raise NotEnoughBookiesError(
            f"no writable bookie outside ensemble {list(ensemble)} to re-replicate "
            f"ledger {ledger_id} to; start another bookie"
        )
    return eligible[ledger_id % len(eligible)]


def still_referenced(md: LedgerMetadata, bookies: Collection[str]) -> set[str]:
    """Which of `bookies` the ledger's metadata still names."""
    return set(bookies) & md.bookies()
