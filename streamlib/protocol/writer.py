"""The ledger writer as a state machine (protocol.txt "Writing to ledgers", "Closing a
ledger as a writer").

Theory of operation. The writer owns an OPEN ledger. Each append gets the next entry id
and goes to the Qw bookies of its write set in the last fragment, carrying the LAC at send
time and the ledger length so far. Acks are counted by :class:`AckTracker`; entries
complete in order, advancing the LAC.

When a bookie of the last fragment fails (an error answer or a timeout reported by the
driver), the writer makes an ensemble change: it asks for replacement bookies, holds
completions (so the LAC stays put), builds a new fragment starting at LAC + 1 with the
failed indexes replaced and CASes it into the metadata. On success it resends every
pending entry of the replaced indexes to the replacement and releases completions. On a
CAS conflict it re-reads the metadata: still OPEN -> re-apply the replacement to the fresh
metadata; no longer OPEN (a recovery started) -> fail every outstanding add. Failures
that arrive during a change are merged into the next change; the number of changes is
capped.

FENCED, UNAUTHORIZED or INVALID_TERM from any bookie ends the writer: every pending add
fails with that error (an add failing with LedgerFencedError may or may not be in the
ledger; only the recovered ledger's last entry tells).

Closing waits for pending adds, then CASes CLOSED at the LAC; a CAS conflict is resolved
by the table in :func:`streamlib.protocol.states.on_writer_close_conflict`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from streamlib.protocol.acks import AckTracker
from streamlib.protocol.actions import (
    Action,
    ChooseBookies,
    Closed,
    CloseFailed,
    CompleteAdds,
    EntryData,
    FailAdds,
    Purpose,
    ReadMetadata,
    SendAdd,
    WriteMetadata,
)
from streamlib.protocol.digest import DigestManager
from streamlib.protocol.errors import (
    REFUSALS,
    BadRequestError,
    InvalidTermError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerStateConflictError,
    StatusCode,
    StreamlibError,
    TooLargeError,
    TooManyEnsembleChangesError,
    UnauthorizedError,
    refusal,
)
from streamlib.protocol.events import (
    AddOk,
    AddResults,
    BookiesChosen,
    BookiesUnavailable,
    Event,
    MetadataConflict,
    MetadataFailed,
    MetadataRead,
    MetadataWritten,
)
from streamlib.protocol.ledger_metadata import LedgerMetadata
from streamlib.protocol.quorum import ensemble_write_sets
from streamlib.protocol.states import (
    CloseConflictOutcome,
    EnsembleChangeConflictOutcome,
    LedgerState,
    on_ensemble_change_conflict,
    on_writer_close_conflict,
)

# Answers after which this writer may not go on: the ledger belongs to someone else now.
_FATAL: dict[int, type[StreamlibError]] = {
    StatusCode.FENCED: LedgerFencedError,
    StatusCode.INVALID_TERM: InvalidTermError,
    StatusCode.TOO_LARGE: TooLargeError,
    StatusCode.BAD_REQUEST: BadRequestError,
}


class WriterState(enum.Enum):
    WRITING = "writing"
    CLOSING = "closing"  # close requested; waiting for pending adds, then the CAS
    CLOSED = "closed"
    FAILED = "failed"  # no more adds (fenced, unauthorized, out of bookies, ...)


_ACKING = (WriterState.WRITING, WriterState.CLOSING)


class LedgerWriter:
    def __init__(
        self,
        metadata: LedgerMetadata,
        version: int,
        *,
        master_key: bytes,
        digest: DigestManager,
        max_ensemble_changes: int = 32,
        term: int = 0,
        last_add_confirmed: int = -1,
        length: int = 0,
        unsafe_keep_failed: bool = False,
    ) -> None:
        if metadata.state is not LedgerState.OPEN:
            raise LedgerClosedError(f"ledger {metadata.ledger_id} is {metadata.state.value}")
        self.metadata = metadata
        self.version = version
        self.master_key = master_key
        self.digest = digest
        self.term = term
        self.max_ensemble_changes = max_ensemble_changes
        self.unsafe_keep_failed = unsafe_keep_failed  # tests only: the old ban, for the sim
        self.state = WriterState.WRITING
        self.error: StreamlibError | None = None
        self.tracker = AckTracker(metadata.ack_quorum, last_add_confirmed)
        self.length = length  # ledger length including every entry handed out
        self._lac_length = length  # length up to the LAC
        self._entries: dict[int, EntryData] = {}  # pending entries, kept for resends
        self._failed: dict[int, str] = {}  # ensemble index -> failed bookie, not yet replaced
        # The change in flight: the slots it replaces, then (once placement answered) the
        # replacement per slot. Failures arriving meanwhile wait for the next change.
        self._changing: dict[int, str | None] | None = None
        # Bookies that failed since the last completed ensemble change, kept out of its
        # replacements. Cleared once a change completes: a bookie that failed earlier and
        # came back is a candidate again (placement still prefers others for a while);
        # a writer that banned every failure forever would run out of bookies.
        self._recently_failed: set[str] = set()
        self.ensemble_changes = 0
        self.fragment_rolls = 0
        self._planned = False  # the change in flight is a fragment roll, not a failure
        self._change_time_ms = 0  # when placement answered for the change in flight
        self._close_requested = False
        # Write sets repeat every E entries: compute them once.
        self._write_sets = ensemble_write_sets(metadata.ensemble_size, metadata.write_quorum)

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self.tracker.last_add_confirmed

    @property
    def ensemble(self) -> tuple[str, ...]:
        return self.metadata.last_fragment.ensemble

    # -- inputs -------------------------------------------------------------------------

    def step(self, event: Event) -> list[Action]:
        """Take the answer to one of this writer's actions (events.py)."""
        match event:
            case AddOk(bookie, entry_ids):
                return self.on_add_ok(bookie, entry_ids)
            case AddResults(bookie, results):
                return self.on_add_results(bookie, results)
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
        raise TypeError(f"a ledger writer takes no {type(event).__name__} ({event!r})")

    # -- appends ------------------------------------------------------------------------

    def append(self, payloads: Sequence[bytes]) -> tuple[int, list[Action]]:
        """Assign ids to payloads and send them; return (first entry id, actions)."""
        if self.state is not WriterState.WRITING or self._close_requested:
            raise self.error or LedgerClosedError(f"ledger {self.ledger_id} is closing or closed")
        for payload in payloads:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise BadRequestError(f"entry payload must be bytes, got {type(payload).__name__}")
        tracker = self.tracker
        first = tracker.next_entry_id
        lac = tracker.last_add_confirmed
        ensemble_size = self.metadata.ensemble_size
        write_sets = self._write_sets
        compute = self.digest.compute
        failed = self._failed
        entries = self._entries
        per_slot: dict[int, list[EntryData]] = {i: [] for i in range(ensemble_size)}
        length = self.length
        entry_id = first
        for payload in payloads:
            if type(payload) is not bytes:
                payload = bytes(payload)
            length += len(payload)
            entry = EntryData(
                entry_id, lac, length, payload, compute(entry_id, lac, length, payload)
            )
            write_set = write_sets[entry_id % ensemble_size]
            entries[entry_id] = entry
            for index in write_set:
                if index not in failed:
                    per_slot[index].append(entry)
            entry_id += 1
        tracker.add_pending_range(first, entry_id, write_sets)
        self.length = length
        return first, self._sends(per_slot) + self._maybe_change_ensemble()

    def _sends(self, per_slot: dict[int, list[EntryData]]) -> list[Action]:
        """One batch per bookie."""
        return [
            SendAdd(self.ensemble[i], self.ledger_id, tuple(es), self.master_key, 0, self.term)
            for i, es in sorted(per_slot.items())
            if es
        ]

    def on_add_results(
        self, bookie: str, results: Sequence[tuple[int, int | None]]
    ) -> list[Action]:
        """A bookie answered a batch of adds: (entry id, status), status None when it
        timed out or the connection broke. Completions are merged into one action."""
        index = self._index_of(bookie)
        completed: list[int] = []
        actions: list[Action] = []
        for entry_id, status in results:
            if status == StatusCode.OK and index is not None and self.state in _ACKING:
                completed += self.tracker.on_ack(entry_id, index)
            elif status != StatusCode.OK:
                actions += self._completed(completed)
                completed = []
                actions += self.on_add_result(bookie, entry_id, status)
        return actions + self._completed(completed)

    def on_add_ok(self, bookie: str, entry_ids: Sequence[int]) -> list[Action]:
        """A bookie stored these entries durably: on_add_results with every status OK,
        in one go (the hot path)."""
        index = self._index_of(bookie)
        if index is None or self.state not in _ACKING:
            return []  # a replaced bookie's late acks, or the writer is done
        return self._completed(self.tracker.on_acks(entry_ids, index))

    def on_add_result(self, bookie: str, entry_id: int, status: int | None) -> list[Action]:
        """A bookie answered an add (status None: it timed out or the connection broke).
        Non-fatal errors count as that bookie failing."""
        if self.state in (WriterState.FAILED, WriterState.CLOSED):
            return []
        if status is None:
            return self.on_bookie_failed(bookie)
        if status == StatusCode.OK:
            index = self._index_of(bookie)
            if index is None:
                return []  # a replaced bookie's late ack
            return self._completed(self.tracker.on_ack(entry_id, index))
        if status in REFUSALS:
            return self._fail(refusal(bookie, status))
        fatal = _FATAL.get(status)
        if fatal is not None:
            return self._fail(
                fatal(
                    f"bookie {bookie} answered {StatusCode(status).name} "
                    f"for ledger {self.ledger_id} entry {entry_id}"
                )
            )
        return self.on_bookie_failed(bookie)

    def on_bookie_failed(self, bookie: str) -> list[Action]:
        """The bookie timed out, dropped the connection or answered a retryable error."""
        if self.state is not WriterState.WRITING:
            return []  # closing (the close CAS is in flight), closed or failed
        index = self._index_of(bookie)
        if index is None or index in self._failed:
            return []
        self._failed[index] = bookie
        self._recently_failed.add(bookie)
        return self._maybe_change_ensemble()

    def _maybe_change_ensemble(self) -> list[Action]:
        """Start a change when a pending entry needs a failed slot. A failure that no
        pending entry needs (a late answer for an entry already acknowledged) waits for
        the next append, as BookKeeper's delayed write failures do. A failure during a
        change is merged into the next one."""
        if self._changing is not None or not self._failed:
            return []
        needed = any(
            index in self._failed
            for entry_id in self.tracker.pending_entry_ids()
            for index in self.tracker.pending(entry_id).write_set  # type: ignore[union-attr]
        )
        return self._start_ensemble_change() if needed else []

    def _index_of(self, bookie: str) -> int | None:
        try:
            return self.ensemble.index(bookie)
        except ValueError:
            return None

    def _completed(self, entry_ids: list[int]) -> list[Action]:
        if not entry_ids:
            return []
        entries = self._entries
        for entry_id in entry_ids:
            self._lac_length = entries.pop(entry_id).length
        actions: list[Action] = [CompleteAdds(entry_ids[0], entry_ids[-1])]
        return actions + self._maybe_close()

    def _fail(self, error: StreamlibError) -> list[Action]:
        self._planned = False
        self.state = WriterState.FAILED
        self.error = error
        failed = self.tracker.fail_all()
        self._entries.clear()
        actions: list[Action] = []
        if failed:
            actions.append(FailAdds(tuple(failed), error))
        if self._close_requested:
            actions.append(CloseFailed(error))
        return actions

    # -- ensemble change ----------------------------------------------------------------

    def _start_ensemble_change(self) -> list[Action]:
        if self.ensemble_changes >= self.max_ensemble_changes:
            return self._fail(
                TooManyEnsembleChangesError(
                    f"ledger {self.ledger_id}: {self.ensemble_changes} ensemble changes, "
                    "the cap; close and start a new ledger"
                )
            )
        self.tracker.holding = True
        self._changing = dict.fromkeys(sorted(self._failed))
        exclude = frozenset(self.ensemble) | frozenset(self._recently_failed)
        return [
            ChooseBookies(
                len(self._changing), exclude, Purpose.ENSEMBLE_CHANGE, tuple(self._changing)
            )
        ]

    def roll_fragment(self) -> list[Action]:
        """Start a new fragment on bookies chosen by placement (unbounded ledgers roll
        fragments by size or age, so retention can drop old ones). A voluntary ensemble
        change: it waits its turn, counts against no cap, and if placement finds nothing
        the writer simply stays on its ensemble."""
        if self.state is not WriterState.WRITING or self._close_requested:
            return []
        if self._changing is not None or self._failed:
            return []
        self._planned = True
        self.tracker.holding = True
        slots = tuple(range(self.metadata.ensemble_size))
        self._changing = dict.fromkeys(slots)
        exclude = frozenset(self._recently_failed)
        return [ChooseBookies(len(slots), exclude, Purpose.FRAGMENT_ROLL, slots)]

    def on_bookies_chosen(self, bookies: Sequence[str], now_ms: int = 0) -> list[Action]:
        """Placement answered; now_ms (the driver's clock) dates the new fragment."""
        if self._changing is None or self.state is WriterState.FAILED:
            return []
        self._change_time_ms = now_ms
        slots = sorted(self._changing)
        overlap = set(bookies) & set(self.ensemble) if not self._planned else set()
        if len(bookies) != len(slots) or overlap or len(set(bookies)) != len(bookies):
            raise BadRequestError(f"placement returned {list(bookies)} for {len(slots)} slots")
        self._changing = dict(zip(slots, bookies, strict=True))
        return [self._ensemble_change_cas()]

    def on_bookies_unavailable(self, error: StreamlibError) -> list[Action]:
        """Placement found no replacement: the writer cannot go on (a planned fragment
        roll is just called off)."""
        if self._changing is None:
            return []
        self._changing = None
        if self._planned:
            self._planned = False
            return self._completed(self.tracker.release())
        return self._fail(error)

    def _ensemble_change_cas(self) -> WriteMetadata:
        assert self._changing is not None
        replacements = {i: b for i, b in self._changing.items() if b is not None}
        new = self.metadata.with_ensemble_change(
            self.tracker.last_add_confirmed + 1,
            replacements,
            created_time_ms=self._change_time_ms,
            start_length=self._lac_length,  # the new fragment starts after the LAC
            term=self.term,
        )
        return WriteMetadata(new, self.version, self._change_purpose())

    def _change_purpose(self) -> Purpose:
        return Purpose.FRAGMENT_ROLL if self._planned else Purpose.ENSEMBLE_CHANGE

    def on_metadata_written(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        if self.state is WriterState.FAILED:
            return []
        if self.state is WriterState.CLOSING:  # (no change starts once closing)
            self.metadata, self.version = metadata, version
            self.state = WriterState.CLOSED
            return [Closed(metadata, version)]
        if self._changing is not None:
            return self._ensemble_changed(metadata, version)
        return []

    def _ensemble_changed(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        self._changing = None
        if self._planned:
            self._planned = False
            self.fragment_rolls += 1
        else:
            self.ensemble_changes += 1
        actions = self._adopt(metadata, version)
        if not self.unsafe_keep_failed:
            self._recently_failed = set(self._failed.values())  # (failures meanwhile)
        if self._failed:  # failures that arrived during the change
            return actions + self._start_ensemble_change()
        return actions + self._completed(self.tracker.release())

    def _adopt(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        """Take fresh metadata; every slot of the last ensemble that now holds another
        bookie loses its acks on pending entries, which are resent to the new bookie."""
        old = self.ensemble
        self.metadata, self.version = metadata, version
        per_slot: dict[int, list[EntryData]] = {}
        for index, (before, after) in enumerate(zip(old, self.ensemble, strict=True)):
            if before == after:
                continue
            self._failed.pop(index, None)
            per_slot[index] = [self._entries[e] for e in self.tracker.replace_bookie(index)]
        return self._sends(per_slot)

    def on_metadata_conflict(self) -> list[Action]:
        """The CAS failed on a version mismatch: re-read before deciding."""
        if self.state is WriterState.CLOSING:
            return [ReadMetadata(Purpose.WRITER_CLOSE)]
        if self._changing is not None:
            return [ReadMetadata(self._change_purpose())]
        return []

    def on_metadata_read(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        if self.state is WriterState.CLOSING:
            return self._close_conflict(metadata, version)
        if self._changing is not None:
            same_term = metadata.term == self.metadata.term
            outcome = on_ensemble_change_conflict(metadata.state, same_term=same_term)
            if outcome is EnsembleChangeConflictOutcome.FAIL_ADDS:
                self._changing = None
                if not same_term:
                    return self._fail(
                        InvalidTermError(
                            f"ledger {self.ledger_id}: term {metadata.term} took over from "
                            f"term {self.metadata.term}"
                        )
                    )
                return self._fail(
                    LedgerFencedError(f"ledger {self.ledger_id} is {metadata.state.value}")
                )
            actions = self._adopt(metadata, version)
            if self._planned:  # a fragment roll: try again on the fresh metadata
                return [*actions, self._ensemble_change_cas()]
            # Slots someone else already changed need no replacement from us.
            self._changing = {i: b for i, b in self._changing.items() if i in self._failed}
            if not self._changing:
                return actions + self._ensemble_changed(metadata, version)
            return [*actions, self._ensemble_change_cas()]
        return []

    def on_metadata_error(self, error: StreamlibError) -> list[Action]:
        """The metadata store failed (not a version conflict). The change or close may or
        may not have happened; fail rather than guess."""
        self._changing = None
        return self._fail(error)

    # -- close --------------------------------------------------------------------------

    def close(self) -> list[Action]:
        if self.state is WriterState.CLOSED:
            return [Closed(self.metadata, self.version)]
        if self.state is WriterState.FAILED:
            if isinstance(self.error, LedgerFencedError | InvalidTermError | UnauthorizedError):
                return [CloseFailed(self.error)]
            # Out of bookies or too many changes: our own LAC is still a safe end.
            self.state = WriterState.WRITING
        self._close_requested = True
        return self._maybe_close()

    def _maybe_close(self) -> list[Action]:
        if not self._close_requested or self.state is not WriterState.WRITING:
            return []
        if self.tracker.pending_count or self._changing is not None:
            return []
        self.state = WriterState.CLOSING
        return [self._close_cas()]

    def _close_cas(self) -> WriteMetadata:
        closed = self.metadata.closed_by_writer(self.tracker.last_add_confirmed, self._lac_length)
        return WriteMetadata(closed, self.version, Purpose.WRITER_CLOSE)

    def _close_conflict(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        lac = self.tracker.last_add_confirmed
        outcome = on_writer_close_conflict(
            metadata.state,
            metadata.last_entry_id,
            lac,
            same_term=metadata.term == self.metadata.term,
        )
        if outcome is CloseConflictOutcome.RETRY:
            self.metadata, self.version = metadata, version
            return [self._close_cas()]
        if outcome is CloseConflictOutcome.SUCCESS:
            self.metadata, self.version = metadata, version
            self.state = WriterState.CLOSED
            return [Closed(metadata, version)]
        error: StreamlibError
        if outcome is CloseConflictOutcome.FAIL_IN_RECOVERY:
            error = LedgerFencedError(f"ledger {self.ledger_id} is being recovered")
        else:
            error = LedgerStateConflictError(
                f"ledger {self.ledger_id} was closed at entry {metadata.last_entry_id}, "
                f"this writer's LAC is {lac}"
            )
        self.state = WriterState.FAILED
        self.error = error
        return [CloseFailed(error)]
