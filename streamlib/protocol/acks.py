"""Add acknowledgement tracking with in-order completion (protocol.txt "Writing to
ledgers").

An entry is acknowledged to the caller when Qa bookies of its write set have persisted
it AND every lower entry has been acknowledged. The last add confirmed (LAC) is the
highest entry acknowledged so far; it travels with later entries (piggyback).

Bookies are ensemble indexes. After an ensemble change replaces the bookie at index i,
the acks that index gave to still-pending entries no longer count (the entry now lives
on the new bookie at that index, per the metadata) and the caller resends those entries
to the replacement: :meth:`AckTracker.replace_bookie` says which.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class PendingAdd:
    entry_id: int
    write_set: tuple[int, ...]
    mask: int = 0  # bit i: the bookie at ensemble index i acked
    acks: int = 0  # bits set in mask

    def ack(self, index: int) -> None:
        bit = 1 << index
        if not self.mask & bit:
            self.mask |= bit
            self.acks += 1

    def unack(self, index: int) -> None:
        bit = 1 << index
        if self.mask & bit:
            self.mask &= ~bit
            self.acks -= 1


class AckTracker:
    """Pending adds of one writer, completed strictly in entry order."""

    def __init__(self, ack_quorum: int, last_add_confirmed: int = -1) -> None:
        if ack_quorum < 1:
            raise ValueError(f"ack quorum must be >= 1, got {ack_quorum}")
        self.ack_quorum = ack_quorum
        self.last_add_confirmed = last_add_confirmed
        self._pending: dict[int, PendingAdd] = {}
        self._next_entry_id = last_add_confirmed + 1
        # While an ensemble change is in flight, acks are recorded but nothing completes:
        # the new fragment starts at LAC + 1, so the LAC must not move until the new
        # ensemble is in the metadata (else an entry acked by the replaced bookie would
        # count as acknowledged while the metadata places it on the replacement).
        self.holding = False

    @property
    def next_entry_id(self) -> int:
        """The id the next add will get (entry ids are consecutive)."""
        return self._next_entry_id

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def pending_entry_ids(self) -> list[int]:
        return sorted(self._pending)

    def pending(self, entry_id: int) -> PendingAdd | None:
        return self._pending.get(entry_id)

    def add_pending(self, entry_id: int, write_set: tuple[int, ...]) -> None:
        """Register an entry as sent. Ids must come in order without gaps."""
        if entry_id != self._next_entry_id:
            raise ValueError(f"expected entry {self._next_entry_id}, got {entry_id}")
        if len(write_set) < self.ack_quorum:
            raise ValueError(f"write set {write_set} smaller than ack quorum {self.ack_quorum}")
        self._pending[entry_id] = PendingAdd(entry_id, tuple(write_set))
        self._next_entry_id += 1

    def add_pending_range(
        self, first: int, end: int, write_sets: Sequence[tuple[int, ...]]
    ) -> None:
        """add_pending for entries first..end-1, entry e with write_sets[e % len]."""
        if first != self._next_entry_id:
            raise ValueError(f"expected entry {self._next_entry_id}, got {first}")
        if any(len(ws) < self.ack_quorum for ws in write_sets):
            raise ValueError(f"a write set of {write_sets} is smaller than the ack quorum")
        pending = self._pending
        n = len(write_sets)
        for entry_id in range(first, end):
            pending[entry_id] = PendingAdd(entry_id, write_sets[entry_id % n])
        self._next_entry_id = max(end, first)

    def on_ack(self, entry_id: int, bookie_index: int) -> list[int]:
        """Record a bookie's durable ack; return the entries newly acknowledged, in order.

        An ack for an entry already acknowledged, or from a bookie outside the entry's
        write set (a stale ack from a replaced bookie) changes nothing."""
        add = self._pending.get(entry_id)
        if add is None or bookie_index not in add.write_set:
            return []
        add.ack(bookie_index)
        if entry_id != self.last_add_confirmed + 1 or add.acks < self.ack_quorum:
            return []  # nothing can complete before this entry's predecessor does
        return self._complete_in_order()

    def on_acks(self, entry_ids: Iterable[int], bookie_index: int) -> list[int]:
        """on_ack for many entries of one bookie at once (the same outcome as one call
        per entry in any order: completion only ever walks forward from the LAC)."""
        pending = self._pending
        bit = 1 << bookie_index
        for entry_id in entry_ids:
            add = pending.get(entry_id)
            if add is not None and not add.mask & bit and bookie_index in add.write_set:
                add.mask |= bit
                add.acks += 1
        return self._complete_in_order()

    def release(self) -> list[int]:
        """Stop holding completions; return the entries that complete now."""
        self.holding = False
        return self._complete_in_order()

    def _complete_in_order(self) -> list[int]:
        if self.holding:
            return []
        pending, quorum = self._pending, self.ack_quorum
        first = lac = self.last_add_confirmed
        while True:
            add = pending.get(lac + 1)
            if add is None or add.acks < quorum:
                break
            lac += 1
            del pending[lac]
        self.last_add_confirmed = lac
        return list(range(first + 1, lac + 1))

    def replace_bookie(self, bookie_index: int) -> list[int]:
        """The bookie at bookie_index was replaced: forget its acks on pending entries and
        return the pending entries whose write set includes it (to resend there)."""
        resend: list[int] = []
        for entry_id in sorted(self._pending):
            add = self._pending[entry_id]
            if bookie_index in add.write_set:
                add.unack(bookie_index)
                resend.append(entry_id)
        return resend

    def fail_all(self) -> list[int]:
        """Drop every pending entry (the ledger can take no more adds); return their ids."""
        failed = sorted(self._pending)
        self._pending.clear()
        return failed
