"""Ledger recovery as a state machine: open with fencing, find the last entry, close
(protocol.txt "Closing a ledger as a reader"; fencing.txt "Fencing internals";
closing-ledgers-safely.txt "Ledger Recovery"; ARCHITECTURE.md §3).

Theory of operation, one phase after another:

1. MARK: CAS the metadata to IN_RECOVERY (skipped if it already is; a CLOSED ledger is
   done at once). From now on the old writer's ensemble change fails its CAS and, on
   re-reading, it stops.
2. FENCE: a fencing LAC read to every bookie of the last fragment. Each OK answer is a
   bookie that is now fenced (durably, before it answered) and tells its LAC. Fencing is
   complete at ensemble coverage: (Qw - Qa) + 1 fenced bookies in EVERY write set, so the
   old writer can complete no ack quorum. lac0 = the highest LAC seen then; it is fixed
   for the rest of this recovery.
3. READ FORWARD from max(lac0, first entry of the last fragment - 1) + 1, a window of
   entries at a time, each with the fence flag, from every bookie of its write set.
   Per entry :class:`EntryRecoveryRead` decides (one Positive -> recoverable; (Qw - Qa) + 1
   Negatives -> unrecoverable; out of answers -> ABORT). Decisions are taken in entry
   order: the first unrecoverable entry e makes e - 1 the last entry.
4. WRITE BACK every recovered entry to its whole write set with the RECOVERY_ADD flag
   (which passes the fence), carrying lac0 as its LAC (never a later one: with concurrent
   recoveries a later LAC would let bookies report a LAC past the sealed end). A write
   back needs Qa acks; a bookie that fails is replaced LOCALLY (a new fragment in this
   recovery's copy of the metadata, written only by the close).
5. CLOSE: CAS CLOSED at the last entry with its length. On a conflict re-read: CLOSED by
   someone else -> adopt it (concurrent recoveries converge); still IN_RECOVERY -> CAS
   again on the fresh version.

Unknown answers never close a ledger: they wait, and when nothing else will come, abort.

Test-only switches (``RecoveryOptions``) turn off the safety of each known-unsafe
variant so the simulator can show it catches them. Never set them elsewhere.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from streamlib.protocol.actions import (
    Action,
    ChooseBookies,
    EntryData,
    Purpose,
    ReadEntry,
    ReadLac,
    ReadMetadata,
    RecoveryDone,
    RecoveryFailed,
    SendAdd,
    WriteMetadata,
    rewrite_flags,
)
from streamlib.protocol.digest import DigestManager
from streamlib.protocol.errors import (
    REFUSALS,
    IllegalTransitionError,
    InvalidTermError,
    RecoveryAbortedError,
    StatusCode,
    StreamlibError,
    refusal,
)
from streamlib.protocol.events import (
    AddOk,
    AddResults,
    BookiesChosen,
    BookiesUnavailable,
    Event,
    LacResult,
    MetadataConflict,
    MetadataFailed,
    MetadataRead,
    MetadataWritten,
    ReadResult,
)
from streamlib.protocol.ledger_metadata import Fragment, LedgerMetadata
from streamlib.protocol.quorum import EnsembleCoverage
from streamlib.protocol.recovery_read import (
    EntryRecoveryRead,
    RecoveryDecision,
    classify_read_status,
)
from streamlib.protocol.states import LedgerState


@dataclass(frozen=True)
class RecoveryOptions:
    """Knobs of a recovery. The ``unsafe_*`` ones exist for the simulator's mutation
    checks only: each reproduces a variant the TLA+ models showed to lose data."""

    read_window: int = 64  # entries read ahead at once
    unsafe_skip_fencing: bool = False  # no fence flag on the LAC read and the reads
    unsafe_unknown_as_negative: bool = False
    unsafe_skip_write_back: bool = False


WRITE_BACK_RETRIES = 3  # per entry and bookie, on timeouts


class Phase(enum.Enum):
    MARK = "mark"
    FENCE = "fence"
    READ = "read"
    LENGTH = "length"  # nothing recovered by reading forward: read the last entry for its length
    DRAIN = "drain"  # last entry known; waiting for write-backs
    CLOSE = "close"
    DONE = "done"
    FAILED = "failed"


class LedgerRecovery:
    def __init__(
        self,
        metadata: LedgerMetadata,
        version: int,
        *,
        master_key: bytes,
        digest: DigestManager,
        options: RecoveryOptions | None = None,
    ) -> None:
        self.metadata = metadata
        self.version = version
        self.master_key = master_key
        self.digest = digest
        self.options = options or RecoveryOptions()
        self.phase = Phase.MARK
        self.error: StreamlibError | None = None
        self.lac0 = -1
        self.last_entry_id: int | None = None
        self.length = 0
        self._coverage: EnsembleCoverage | None = None
        self._lac_answers: set[str] = set()
        self._read_ensemble: tuple[str, ...] = metadata.last_fragment.ensemble
        self._reads: dict[int, EntryRecoveryRead] = {}
        self._read_entries: dict[int, EntryData] = {}
        self._next_read = 0
        self._frontier = 0  # lowest entry not yet decided
        self._recovered: dict[int, EntryData] = {}  # written back, as rewritten
        self._wb_acks: dict[int, set[str]] = {}
        self._wb_pending: set[int] = set()  # not yet on Qa of their current write set
        self._wb_tries: dict[tuple[int, str], int] = {}  # (entry, bookie) -> timeouts
        self._failed_bookies: set[str] = set()
        self._replacing: str | None = None
        self._local_fragments: list[Fragment] = []  # replacements made by this recovery
        # Bookies of a write set a write-back must reach before it counts: Qa here; term
        # mode (unbounded ledgers) needs the whole write set (guaranteed write quorum).
        self._write_back_quorum = metadata.ack_quorum
        self._length_answers: set[str] = set()

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    # -- inputs -------------------------------------------------------------------------

    def step(self, event: Event) -> list[Action]:
        """Take the answer to one of this recovery's actions (events.py)."""
        match event:
            case ReadResult(bookie, entry_id, status, entry):
                return self.on_read_result(bookie, entry_id, status, entry)
            case AddOk(bookie, entry_ids):
                return self.on_add_results(bookie, [(e, StatusCode.OK) for e in entry_ids])
            case AddResults(bookie, results):
                return self.on_add_results(bookie, results)
            case LacResult(bookie, status, lac):
                return self.on_lac_result(bookie, status, lac)
            case BookiesChosen(bookies, now_ms):
                return self.on_bookies_chosen(bookies, now_ms)
            case BookiesUnavailable(error):
                return self.on_bookies_unavailable(error)
            case MetadataWritten(metadata, version):
                return self.on_metadata_written(metadata, version)
            case MetadataConflict():
                return self.on_metadata_conflict()
            case MetadataRead(metadata, version):
                return self.on_metadata_read(metadata, version)
            case MetadataFailed(error):
                return self.on_metadata_error(error)
        raise TypeError(f"a ledger recovery takes no {type(event).__name__} ({event!r})")

    # -- 1. mark IN_RECOVERY ------------------------------------------------------------

    def start(self) -> list[Action]:
        if self.metadata.state is LedgerState.CLOSED:
            return self._done(self.metadata, self.version)
        if self.metadata.state is LedgerState.IN_RECOVERY:
            return self._start_fencing()
        return [WriteMetadata(self.metadata.in_recovery(), self.version, Purpose.MARK_IN_RECOVERY)]

    def on_metadata_written(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        if self.phase is Phase.MARK:
            self.metadata, self.version = metadata, version
            return self._start_fencing()
        if self.phase is Phase.CLOSE:
            return self._done(metadata, version)
        return []

    def on_metadata_conflict(self) -> list[Action]:
        if self.phase is Phase.MARK:
            return [ReadMetadata(Purpose.MARK_IN_RECOVERY)]
        if self.phase is Phase.CLOSE:
            return [ReadMetadata(Purpose.RECOVERY_CLOSE)]
        return []

    def on_metadata_read(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        if metadata.state is LedgerState.CLOSED:
            return self._done(metadata, version)  # another recovery (or the writer) closed it
        if self.phase is Phase.MARK:
            self.metadata, self.version = metadata, version
            self._read_ensemble = metadata.last_fragment.ensemble
            return self.start()
        if self.phase is Phase.CLOSE:
            if metadata.state is not LedgerState.IN_RECOVERY:
                return self._fail(
                    IllegalTransitionError(
                        f"ledger {self.ledger_id} left IN_RECOVERY while being recovered"
                    )
                )
            return [self._close_cas(metadata, version)]
        return []

    def on_metadata_error(self, error: StreamlibError) -> list[Action]:
        return self._fail(error)

    # -- 2. fence and read the LAC ------------------------------------------------------

    def _start_fencing(self) -> list[Action]:
        self.phase = Phase.FENCE
        md = self.metadata
        self._read_ensemble = md.last_fragment.ensemble
        self._coverage = EnsembleCoverage(md.ensemble_size, md.write_quorum, md.ack_quorum)
        fence = self._fence_flag()
        return [
            ReadLac(bookie, self.ledger_id, fence, self.master_key, md.term)
            for bookie in self._read_ensemble
        ]

    def _fence_flag(self) -> bool:
        """Bounded ledgers fence with the flag; term mode fences with the term instead."""
        return not self.options.unsafe_skip_fencing

    def on_lac_result(self, bookie: str, status: int | None, lac: int = -1) -> list[Action]:
        """A fencing LAC read answered (status None = timed out / unreachable)."""
        if self.phase is not Phase.FENCE or bookie in self._lac_answers:
            return []
        assert self._coverage is not None
        self._lac_answers.add(bookie)
        if status in REFUSALS:
            return self._fail(refusal(bookie, status))
        if status == StatusCode.INVALID_TERM:
            return self._fail(InvalidTermError(f"bookie {bookie}: a newer term exists"))
        if status == StatusCode.OK:
            self.lac0 = max(self.lac0, lac)
            self._coverage.add(self._read_ensemble.index(bookie))
        if self._coverage.is_covered():
            return self._start_reading()
        if len(self._lac_answers) == len(self._read_ensemble):
            return self._fail(
                RecoveryAbortedError(
                    f"ledger {self.ledger_id}: could not fence enough bookies "
                    f"({sorted(self._lac_answers)} answered, not all OK)"
                )
            )
        return []

    # -- 3. read forward ----------------------------------------------------------------

    def _start_reading(self) -> list[Action]:
        self.phase = Phase.READ
        first = max(self.lac0, self.metadata.last_fragment.first_entry_id - 1) + 1
        self._next_read = self._frontier = first
        return self._read_more()

    def _read_more(self) -> list[Action]:
        actions: list[Action] = []
        fence = self._fence_flag()
        window = self.options.read_window
        if self._next_read - self._frontier > window // 2:
            return actions  # top up in chunks, so reads travel as ranges
        while self._next_read < self._frontier + window:
            entry_id = self._next_read
            self._next_read += 1
            write_set = self.metadata.write_set(entry_id)
            self._reads[entry_id] = EntryRecoveryRead(
                entry_id,
                write_set,
                self.metadata.ack_quorum,
                unknown_counts_as_negative=self.options.unsafe_unknown_as_negative,
            )
            for index in write_set:
                actions.append(
                    ReadEntry(
                        self._read_ensemble[index],
                        self.ledger_id,
                        entry_id,
                        fence,
                        self.master_key,
                        self.metadata.term,
                    )
                )
        return actions

    def on_read_result(
        self, bookie: str, entry_id: int, status: int | None, entry: EntryData | None = None
    ) -> list[Action]:
        """A recovery read answered (status None = timed out / unreachable)."""
        if self.phase is Phase.LENGTH:
            return self._on_length_read(bookie, entry_id, status, entry)
        read = self._reads.get(entry_id)
        if self.phase is not Phase.READ or read is None:
            return []
        if status == StatusCode.INVALID_TERM:
            return self._fail(InvalidTermError(f"bookie {bookie}: a newer term exists"))
        digest_ok = self._digest_ok(entry_id, entry)
        stale = entry is not None and not self.metadata.copy_is_current(entry_id, entry.term)
        outcome = classify_read_status(
            StatusCode.STATUS_UNSPECIFIED if status is None else status,
            digest_ok=digest_ok,
            stale=stale,
        )
        index = self._read_ensemble.index(bookie)
        before = read.decision
        read.on_response(index, outcome)
        if before is RecoveryDecision.WAIT and read.decision is RecoveryDecision.RECOVERABLE:
            assert entry is not None
            self._read_entries[entry_id] = entry
        return self._advance()

    def _advance(self) -> list[Action]:
        actions: list[Action] = []
        while self.phase is Phase.READ:
            read = self._reads.get(self._frontier)
            if read is None or read.decision is RecoveryDecision.WAIT:
                break
            entry_id = self._frontier
            if read.decision is RecoveryDecision.ABORT:
                return actions + self._fail(
                    RecoveryAbortedError(
                        f"ledger {self.ledger_id} entry {entry_id}: no bookie said whether it "
                        "exists (timeouts / errors); recovery aborted, retry later"
                    )
                )
            if read.decision is RecoveryDecision.UNRECOVERABLE:
                self.last_entry_id = entry_id - 1
                self._reads.clear()
                if self._frontier_first_read():
                    return actions + self._read_length()
                self.phase = Phase.DRAIN
                return actions + self._maybe_close()
            entry = self._read_entries.pop(entry_id)
            del self._reads[entry_id]
            self.length = entry.length
            self._frontier += 1
            actions += self._write_back(entry)
            actions += self._read_more()
        return actions

    def _frontier_first_read(self) -> bool:
        """True when no entry was recovered by reading forward, so the last entry is the
        one before the read start and its length is still unknown."""
        first = max(self.lac0, self.metadata.last_fragment.first_entry_id - 1) + 1
        return self._frontier == first

    # -- the length of a ledger whose last entry was not read forward ------------------

    def _read_length(self) -> list[Action]:
        """The last entry is committed (<= a LAC); one good copy of it gives the length."""
        assert self.last_entry_id is not None
        if self.last_entry_id < 0:
            self.length = 0
            self.phase = Phase.DRAIN
            return self._maybe_close()
        self.phase = Phase.LENGTH
        last = self.last_entry_id
        bookies = self.metadata.write_set_bookies(last)
        return [
            ReadEntry(b, self.ledger_id, last, False, self.master_key, self.metadata.term)
            for b in bookies
        ]

    def _digest_ok(self, entry_id: int, entry: EntryData | None) -> bool:
        return entry is not None and self.digest.is_valid(
            entry_id, entry.last_add_confirmed, entry.length, entry.payload, entry.digest
        )

    def _good_copy(self, entry_id: int, entry: EntryData) -> bool:
        """A copy that can be the entry: its digest holds, and it is no leftover of a term
        older than its fragment (a dirty entry a replaced bookie kept)."""
        return self._digest_ok(entry_id, entry) and self.metadata.copy_is_current(
            entry_id, entry.term
        )

    def _on_length_read(
        self, bookie: str, entry_id: int, status: int | None, entry: EntryData | None
    ) -> list[Action]:
        if entry_id != self.last_entry_id:
            return []
        self._length_answers.add(bookie)
        if status == StatusCode.OK and entry is not None and self._good_copy(entry_id, entry):
            self.length = entry.length
            self.phase = Phase.DRAIN
            return self._maybe_close()
        if len(self._length_answers) >= self.metadata.write_quorum:
            return self._fail(
                RecoveryAbortedError(
                    f"ledger {self.ledger_id}: last entry {entry_id} could not be read"
                )
            )
        return []

    # -- 4. write back ------------------------------------------------------------------

    def _write_back(self, entry: EntryData) -> list[Action]:
        if self.options.unsafe_skip_write_back:
            return []
        # Carry lac0, not the entry's own (possibly later) LAC: re-digest.
        rewritten = EntryData(
            entry.entry_id,
            self.lac0,
            entry.length,
            entry.payload,
            self.digest.compute(entry.entry_id, self.lac0, entry.length, entry.payload),
            entry.flags,
        )
        self._recovered[entry.entry_id] = rewritten
        self._wb_acks[entry.entry_id] = set()
        self._wb_pending.add(entry.entry_id)
        bookies = self.metadata.write_set_bookies(entry.entry_id)
        return [self._recovery_add(b, rewritten) for b in bookies]

    def _recovery_add(self, bookie: str, entry: EntryData) -> SendAdd:
        return SendAdd(
            bookie,
            self.ledger_id,
            (entry,),
            self.master_key,
            rewrite_flags(entry.flags),
            self.metadata.term,
        )

    def on_add_results(
        self, bookie: str, results: Sequence[tuple[int, int | None]]
    ) -> list[Action]:
        actions: list[Action] = []
        for entry_id, status in results:
            actions += self.on_add_result(bookie, entry_id, status)
        return actions

    def _written_back(self, entry_id: int) -> bool:
        """Qa bookies of the entry's CURRENT write set (local fragments included) have it."""
        holders = self._wb_acks[entry_id] & set(self.metadata.write_set_bookies(entry_id))
        return len(holders) >= self._write_back_quorum

    def on_add_result(self, bookie: str, entry_id: int, status: int | None) -> list[Action]:
        """A write-back answered (status None = timed out / unreachable)."""
        if entry_id not in self._wb_pending or self.phase in (Phase.DONE, Phase.FAILED):
            return []
        if bookie not in self.metadata.write_set_bookies(entry_id):
            return []  # a replaced bookie's late answer
        if status == StatusCode.OK:
            self._wb_acks[entry_id].add(bookie)
            if self._written_back(entry_id):
                self._wb_pending.discard(entry_id)
                return self._maybe_close()
            return []
        if status in REFUSALS:
            return self._fail(refusal(bookie, status))
        if status == StatusCode.INVALID_TERM:
            return self._fail(InvalidTermError(f"bookie {bookie}: a newer term exists"))
        if status is None and self._retry(entry_id, bookie):
            return [self._recovery_add(bookie, self._recovered[entry_id])]
        return self._bookie_failed(bookie)

    def _retry(self, entry_id: int, bookie: str) -> bool:
        """A timeout may be a lost message, not a dead bookie: send again a few times
        before replacing the bookie."""
        tries = self._wb_tries.get((entry_id, bookie), 0)
        self._wb_tries[(entry_id, bookie)] = tries + 1
        return tries < WRITE_BACK_RETRIES

    def _bookie_failed(self, bookie: str) -> list[Action]:
        if bookie in self._failed_bookies or self._replacing is not None:
            self._failed_bookies.add(bookie)
            return []
        if bookie not in self.metadata.last_fragment.ensemble:
            return []
        self._failed_bookies.add(bookie)
        self._replacing = bookie
        # Like the writer's ensemble change: not a bookie of the current ensemble, nor one
        # that failed us (a bookie of an older fragment may serve again).
        exclude = frozenset(self.metadata.last_fragment.ensemble) | frozenset(self._failed_bookies)
        slot = self.metadata.last_fragment.ensemble.index(bookie)
        return [ChooseBookies(1, exclude, Purpose.RECOVERY_REPLACEMENT, (slot,))]

    def on_bookies_chosen(self, bookies: Sequence[str], now_ms: int = 0) -> list[Action]:
        if self._replacing is None or self.phase in (Phase.DONE, Phase.FAILED):
            return []
        failed, self._replacing = self._replacing, None
        replacement = bookies[0]
        index = self.metadata.last_fragment.ensemble.index(failed)
        # A local fragment from the lowest entry still being written back (or the next to
        # recover). Every recovered entry from there on is checked against its new write
        # set: the replacement must get those it is now responsible for, finished or not.
        start = min(self._wb_pending, default=self._frontier)
        self.metadata = self._with_local_fragment(start, index, replacement, now_ms)
        actions: list[Action] = []
        for entry_id in sorted(e for e in self._recovered if e >= start):
            if replacement in self.metadata.write_set_bookies(entry_id):
                if not self._written_back(entry_id):
                    self._wb_pending.add(entry_id)
                actions.append(self._recovery_add(replacement, self._recovered[entry_id]))
        # Another bookie may have failed while we were choosing.
        for other in sorted(self._failed_bookies):
            if other in self.metadata.last_fragment.ensemble:
                self._failed_bookies.discard(other)
                return actions + self._bookie_failed(other)
        return actions

    def _with_local_fragment(
        self, start: int, index: int, bookie: str, now_ms: int
    ) -> LedgerMetadata:
        last = self.metadata.last_fragment
        ensemble = list(last.ensemble)
        ensemble[index] = bookie
        first = max(start, last.first_entry_id)
        if first == last.first_entry_id:  # it takes the last fragment's place: its
            # entries keep the terms they were written in, and so does the fragment
            fragment = replace(last, ensemble=tuple(ensemble))
        else:  # a new fragment: only this term (and later ones) write its entries
            length = self._length_before(first)
            fragment = Fragment(first, tuple(ensemble), now_ms, length, self.metadata.term)
        self._local_fragments.append(fragment)
        # Local until the close writes it (ARCHITECTURE.md §3): no state change here.
        return replace(self.metadata, fragments=_merge(self.metadata.fragments, [fragment]))

    def _length_before(self, entry_id: int) -> int | None:
        """The ledger's length before entry_id, when a recovered entry tells it."""
        entry = self._recovered.get(entry_id)
        if entry is not None:
            return entry.length - len(entry.payload)
        previous = self._recovered.get(entry_id - 1)
        return previous.length if previous is not None else None

    def on_bookies_unavailable(self, error: StreamlibError) -> list[Action]:
        if self._replacing is None:
            return []
        return self._fail(error)

    # -- 5. close -----------------------------------------------------------------------

    def _maybe_close(self) -> list[Action]:
        if self.phase is not Phase.DRAIN or self._wb_pending:
            return []
        assert self.last_entry_id is not None
        return self._finish()

    def _finish(self) -> list[Action]:
        """The last entry is known and written back: seal the ledger."""
        self.phase = Phase.CLOSE
        return [self._close_cas(self.metadata, self.version)]

    def _close_cas(self, metadata: LedgerMetadata, version: int) -> WriteMetadata:
        assert self.last_entry_id is not None
        # Fragments this recovery added locally go on top of the (possibly fresh) metadata.
        fragments = _merge(metadata.fragments, self._local_fragments)
        base = replace(metadata, fragments=fragments)
        closed = base.closed_by_recovery(self.last_entry_id, self.length)
        self.version = version
        return WriteMetadata(closed, version, Purpose.RECOVERY_CLOSE)

    # -- endings ------------------------------------------------------------------------

    def _done(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        self.phase = Phase.DONE
        self.metadata, self.version = metadata, version
        self.last_entry_id = metadata.last_entry_id
        return [RecoveryDone(metadata, version)]

    def _fail(self, error: StreamlibError) -> list[Action]:
        if self.phase in (Phase.DONE, Phase.FAILED):
            return []
        self.phase = Phase.FAILED
        self.error = error
        return [RecoveryFailed(error)]


def _merge(fragments: tuple[Fragment, ...], local: list[Fragment]) -> tuple[Fragment, ...]:
    """Apply local fragments in order: one starting where the last starts replaces it (it
    holds no entry yet in the metadata's view); a later one is appended."""
    merged = list(fragments)
    for fragment in local:
        if fragment.first_entry_id == merged[-1].first_entry_id:
            merged[-1] = fragment
        elif fragment.first_entry_id > merged[-1].first_entry_id:
            merged.append(fragment)
    return tuple(merged)
