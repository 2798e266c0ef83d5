"""Recovery at the start of a term: taking over an unbounded ledger (unbounded-ledgers.txt;
ARCHITECTURE.md §5).

Theory of operation. Fencing becomes an integer term. A writer taking over CASes the
ledger metadata to IN_RECOVERY with term + 1, then runs the recovery of
:class:`LedgerRecovery` over the last fragment with the new term on every request
instead of the fence flag: bookies adopt a term >= theirs and refuse lower ones, so the
old writer (lower term) gets INVALID_TERM from every bookie that has seen the new one,
and coverage of them is what fencing was.

Two changes make reuse of entry ids across terms safe:
- every recovery write must reach EVERY bookie of its write set ("guaranteed write
  quorum"), not just Qa, and
- recovery ends with a no-op entry carrying the TRUNCATE flag at the first unrecoverable
  id, written to EVERY bookie of the last fragment: each bookie keeps lower ids, stores
  the no-op and deletes everything above it, so no dirty entry of the old term survives
  anywhere a reader could look. A bookie that cannot be reached is replaced (a local
  fragment from the no-op on) rather than skipped.
Only then is the ledger reopened (OPEN, new term) by CAS; the new writer continues after
the no-op. Without the truncate step the log can diverge (the counterexample in the
seed: a dirty entry 1 on b1 and a different committed entry 1 on b2, b3); the test-only
``unsafe_skip_truncate`` switch reproduces it for the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from streamlib.protocol.actions import (
    ADD_FLAG_RECOVERY,
    ADD_FLAG_TRUNCATE,
    Action,
    EntryData,
    Purpose,
    SendAdd,
    WriteMetadata,
)
from streamlib.protocol.digest import DigestManager
from streamlib.protocol.errors import REFUSALS, InvalidTermError, StatusCode, refusal
from streamlib.protocol.ledger_metadata import LedgerMetadata
from streamlib.protocol.recovery import LedgerRecovery, Phase, RecoveryOptions, _merge
from streamlib.protocol.states import LedgerState
from streamlib.protocol.terms import next_term


class TermRecovery(LedgerRecovery):
    def __init__(
        self,
        metadata: LedgerMetadata,
        version: int,
        *,
        master_key: bytes,
        digest: DigestManager,
        options: RecoveryOptions | None = None,
        unsafe_skip_truncate: bool = False,
    ) -> None:
        if not metadata.unbounded:
            raise ValueError(f"ledger {metadata.ledger_id} is bounded: use LedgerRecovery")
        super().__init__(metadata, version, master_key=master_key, digest=digest, options=options)
        self._write_back_quorum = metadata.write_quorum
        self._unsafe_skip_truncate = unsafe_skip_truncate  # tests only: the seed's bug
        self._noop: EntryData | None = None
        self._noop_acked: set[str] = set()
        self.term = 0

    @property
    def next_entry_id(self) -> int:
        """Where the new term's writer continues (after the no-op)."""
        assert self.last_entry_id is not None
        return self.last_entry_id + (1 if self._unsafe_skip_truncate else 2)

    @property
    def last_add_confirmed(self) -> int:
        return self.next_entry_id - 1

    # -- a new term, by CAS ---------------------------------------------------------------

    def start(self) -> list[Action]:
        if self.metadata.state is LedgerState.CLOSED:
            return self._done(self.metadata, self.version)
        self.term = next_term(self.metadata.term)
        claimed = self.metadata.in_recovery(term=self.term)
        return [WriteMetadata(claimed, self.version, Purpose.MARK_IN_RECOVERY)]

    def _fence_flag(self) -> bool:
        return False  # the term fences

    # -- the truncate no-op ---------------------------------------------------------------

    def _finish(self) -> list[Action]:
        assert self.last_entry_id is not None
        if self._unsafe_skip_truncate:
            return self._reopen_cas(self.metadata, self.version)
        self.phase = Phase.DRAIN  # until every bookie of the last fragment has the no-op
        noop_id = self.last_entry_id + 1
        self._noop = EntryData(
            noop_id,
            self.lac0,
            self.length,
            b"",
            self.digest.compute(noop_id, self.lac0, self.length, b""),
            ADD_FLAG_TRUNCATE,
        )
        return [self._send_noop(b) for b in self.metadata.last_fragment.ensemble]

    def _send_noop(self, bookie: str) -> SendAdd:
        assert self._noop is not None
        flags = ADD_FLAG_RECOVERY | ADD_FLAG_TRUNCATE
        return SendAdd(bookie, self.ledger_id, (self._noop,), self.master_key, flags, self.term)

    def on_add_result(self, bookie: str, entry_id: int, status: int | None) -> list[Action]:
        noop = self._noop
        if noop is None or entry_id != noop.entry_id:
            return super().on_add_result(bookie, entry_id, status)
        if self.phase is not Phase.DRAIN or bookie not in self.metadata.last_fragment.ensemble:
            return []
        if status == StatusCode.OK:
            self._noop_acked.add(bookie)
            if set(self.metadata.last_fragment.ensemble) <= self._noop_acked:
                return self._reopen_cas(self.metadata, self.version)
            return []
        if status == StatusCode.INVALID_TERM:
            return self._fail(InvalidTermError(f"bookie {bookie}: a newer term exists"))
        if status in REFUSALS:
            return self._fail(refusal(bookie, status))
        if status is None and self._retry(noop.entry_id, bookie):
            return [self._send_noop(bookie)]
        return self._bookie_failed(bookie)  # replaced locally; the replacement gets it

    def on_bookies_chosen(self, bookies: Sequence[str], now_ms: int = 0) -> list[Action]:
        actions = super().on_bookies_chosen(bookies, now_ms)
        if self._noop is not None and self.phase is Phase.DRAIN:
            actions.append(self._send_noop(bookies[0]))
        return actions

    # -- reopen under the new term --------------------------------------------------------

    def _done(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        recovered = self.last_entry_id
        actions = super()._done(metadata, version)
        if metadata.state is not LedgerState.CLOSED:
            self.last_entry_id = recovered  # an open ledger's metadata has no last entry
        return actions

    def _reopen_cas(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        self.phase = Phase.CLOSE
        fragments = _merge(metadata.fragments, self._local_fragments)
        reopened = replace(metadata, fragments=fragments).reopened()
        self.version = version
        return [WriteMetadata(reopened, version, Purpose.REOPEN)]

    def on_metadata_read(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        if self.phase is Phase.CLOSE:
            if metadata.term != self.term or metadata.state is not LedgerState.IN_RECOVERY:
                return self._fail(
                    InvalidTermError(
                        f"ledger {self.ledger_id}: term {metadata.term} replaced ours "
                        f"({self.term}) while we recovered"
                    )
                )
            return self._reopen_cas(metadata, version)
        return super().on_metadata_read(metadata, version)
