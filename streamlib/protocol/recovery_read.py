"""Deciding, per entry, what recovery reads say (closing-ledgers-safely.txt, "Deciding
when an entry is recoverable" and Figs. 7-10c).

Theory of operation: recovery reads an entry from every bookie of its write set and
classifies each answer as POSITIVE (the bookie has it), NEGATIVE (the bookie's index
says it has no such entry / ledger) or UNKNOWN (any error or timeout: it may exist).
Recovery is "generous on positive, strict on close":

- one POSITIVE makes the entry recoverable;
- (Qw - Qa) + 1 NEGATIVEs (quorum coverage of "does not have it" over the write set)
  make it unrecoverable, so the ledger closes before it;
- when every bookie has answered and neither holds, recovery ABORTS: an ack quorum
  might still hold the entry and closing would truncate committed data;
- otherwise WAIT for more answers.

Counting an UNKNOWN as NEGATIVE is the known-unsafe variant (ARCHITECTURE.md §3); the
simulator has a test-only switch for it (``unknown_counts_as_negative``) and must catch it.
"""

from __future__ import annotations

import enum

from streamlib.protocol.errors import StatusCode
from streamlib.protocol.quorum import negative_read_threshold, validate_quorums


class ReadOutcome(enum.Enum):
    POSITIVE = "positive"
    NEGATIVE = "negative"
    UNKNOWN = "unknown"


class RecoveryDecision(enum.Enum):
    RECOVERABLE = "recoverable"
    UNRECOVERABLE = "unrecoverable"
    WAIT = "wait"
    ABORT = "abort"


# The only statuses that are evidence of absence. Everything else, IO_ERROR above all,
# is UNKNOWN: a bookie whose index has the entry must never be counted as not having it.
_NEGATIVE_STATUSES = frozenset({StatusCode.NO_SUCH_ENTRY, StatusCode.NO_SUCH_LEDGER})


def classify_read_status(
    status: int, *, digest_ok: bool = True, stale: bool = False
) -> ReadOutcome:
    """Classify one recovery-read answer. A timeout has no status: it is UNKNOWN.

    A copy stored under a term older than its fragment (``stale``: see
    ledger_metadata.Fragment) is NEGATIVE: the bookie had adopted no term of the fragment
    when it stored it -- once it has, it refuses older-term adds -- so it has never held
    a copy that this fragment's writers could have had acknowledged."""
    if status == StatusCode.OK:
        if not digest_ok:
            return ReadOutcome.UNKNOWN
        return ReadOutcome.NEGATIVE if stale else ReadOutcome.POSITIVE
    if status in _NEGATIVE_STATUSES:
        return ReadOutcome.NEGATIVE
    return ReadOutcome.UNKNOWN


def decide(
    positives: int, negatives: int, unknowns: int, write_quorum: int, ack_quorum: int
) -> RecoveryDecision:
    """The decision table, in order (first matching row wins):

    | condition                                   | decision      |
    |---------------------------------------------|---------------|
    | positives >= 1                              | RECOVERABLE   |
    | negatives >= (Qw - Qa) + 1                  | UNRECOVERABLE |
    | positives + negatives + unknowns >= Qw      | ABORT         |
    | otherwise                                   | WAIT          |
    """
    if positives >= 1:
        return RecoveryDecision.RECOVERABLE
    if negatives >= negative_read_threshold(write_quorum, ack_quorum):
        return RecoveryDecision.UNRECOVERABLE
    if positives + negatives + unknowns >= write_quorum:
        return RecoveryDecision.ABORT
    return RecoveryDecision.WAIT


class EntryRecoveryRead:
    """Collects the recovery-read answers for one entry from its write set.

    The first decisive outcome is kept: later answers (Fig. 7's "further responses are
    ignored") do not change it. A second answer from the same bookie is ignored.
    """

    def __init__(
        self,
        entry_id: int,
        write_set: tuple[int, ...],
        ack_quorum: int,
        *,
        unknown_counts_as_negative: bool = False,
    ) -> None:
        validate_quorums(len(write_set), len(write_set), ack_quorum)
        self.entry_id = entry_id
        self.write_set = write_set
        self.ack_quorum = ack_quorum
        self._unknown_counts_as_negative = unknown_counts_as_negative  # unsafe; tests only
        self.outcomes: dict[int, ReadOutcome] = {}
        self.decision = RecoveryDecision.WAIT

    def on_response(self, bookie_index: int, outcome: ReadOutcome) -> RecoveryDecision:
        if bookie_index not in self.write_set:
            raise ValueError(f"bookie {bookie_index} is not in write set {self.write_set}")
        if self.decision is not RecoveryDecision.WAIT or bookie_index in self.outcomes:
            return self.decision
        if self._unknown_counts_as_negative and outcome is ReadOutcome.UNKNOWN:
            outcome = ReadOutcome.NEGATIVE
        self.outcomes[bookie_index] = outcome
        counts = {kind: 0 for kind in ReadOutcome}
        for seen in self.outcomes.values():
            counts[seen] += 1
        self.decision = decide(
            counts[ReadOutcome.POSITIVE],
            counts[ReadOutcome.NEGATIVE],
            counts[ReadOutcome.UNKNOWN],
            len(self.write_set),
            self.ack_quorum,
        )
        return self.decision
