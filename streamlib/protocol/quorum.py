"""Write sets and quorum coverage (protocol.txt "Write quorums"; closing-ledgers-safely.txt
"Quorum Coverage").

Bookies are named by their INDEX in a fragment's ensemble, so this module knows nothing
of addresses. Two formulations of quorum coverage appear in the sources:

- "a property is satisfied by at least one bookie from every possible ack quorum
  within the cohort" (:func:`covers_every_ack_quorum`, the definition), and
- "(cohort size - ack quorum) + 1 bookies satisfy it" (:func:`coverage_threshold`,
  the count recovery uses).

tests/unit/test_quorum.py shows them equivalent exhaustively for every E <= 6.

Fencing and the recovery LAC read use coverage over the whole ensemble: every write
set (and so every ack quorum a writer could complete) must hold (Qw - Qa) + 1
responders (:class:`EnsembleCoverage`, BookKeeper's RRQuorumCoverageSet). Deciding an
entry is unrecoverable uses coverage over the entry's write set: (Qw - Qa) + 1
negatives (:func:`negative_read_threshold`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from itertools import combinations

from streamlib.protocol.errors import InvalidLedgerConfigError


def validate_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Ledger creation rule: E >= Qw >= Qa >= 1 (protocol.txt "Ledger metadata")."""
    for name, value in (
        ("ensemble size", ensemble_size),
        ("write quorum", write_quorum),
        ("ack quorum", ack_quorum),
    ):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidLedgerConfigError(f"{name} must be an int, got {value!r}")
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise InvalidLedgerConfigError(
            f"need ensemble >= write quorum >= ack quorum >= 1, got E={ensemble_size} "
            f"Qw={write_quorum} Qa={ack_quorum}"
        )


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Ensemble indexes of entry_id's write quorum: Qw bookies from index entry_id mod E."""
    if entry_id < 0:
        raise ValueError(f"entry id must be >= 0, got {entry_id}")
    start = entry_id % ensemble_size
    return tuple((start + i) % ensemble_size for i in range(write_quorum))


def coverage_threshold(cohort_size: int, ack_quorum: int) -> int:
    """How many bookies of a cohort must satisfy a property so that no ack quorum of the
    cohort is left without one: (cohort - Qa) + 1."""
    return cohort_size - ack_quorum + 1


def negative_read_threshold(write_quorum: int, ack_quorum: int) -> int:
    """Negative recovery-read responses that make an entry unrecoverable: (Qw - Qa) + 1."""
    return coverage_threshold(write_quorum, ack_quorum)


def covers_every_ack_quorum(
    cohort: Collection[int], satisfied: Collection[int], ack_quorum: int
) -> bool:
    """The definition: every ack-quorum-sized subset of the cohort has a satisfying bookie."""
    good = set(satisfied)
    return all(any(b in good for b in aq) for aq in combinations(cohort, ack_quorum))


def covers_by_count(cohort: Collection[int], satisfied: Collection[int], ack_quorum: int) -> bool:
    """The count: at least (cohort - Qa) + 1 bookies of the cohort satisfy the property."""
    good = set(satisfied)
    count = sum(1 for b in cohort if b in good)
    return count >= coverage_threshold(len(cohort), ack_quorum)


def ensemble_write_sets(ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """The E distinct write sets of a striped ensemble (one per starting index)."""
    return [write_set(i, ensemble_size, write_quorum) for i in range(ensemble_size)]


class EnsembleCoverage:
    """Tracks which ensemble members satisfy a property (fenced / answered the LAC read)
    and says when coverage is reached: in EVERY write set, (Qw - Qa) + 1 satisfy it, so
    no ack quorum a writer could complete is left untouched."""

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
        validate_quorums(ensemble_size, write_quorum, ack_quorum)
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self._write_sets = ensemble_write_sets(ensemble_size, write_quorum)
        self._threshold = negative_read_threshold(write_quorum, ack_quorum)
        self.satisfied: set[int] = set()

    def add(self, bookie_index: int) -> bool:
        """Record one satisfying bookie; return whether coverage is now reached."""
        if not 0 <= bookie_index < self.ensemble_size:
            raise ValueError(
                f"bookie index {bookie_index} outside ensemble of {self.ensemble_size}"
            )
        self.satisfied.add(bookie_index)
        return self.is_covered()

    def add_all(self, bookie_indexes: Iterable[int]) -> bool:
        for index in bookie_indexes:
            self.add(index)
        return self.is_covered()

    def is_covered(self) -> bool:
        return all(
            sum(1 for b in ws if b in self.satisfied) >= self._threshold for ws in self._write_sets
        )
