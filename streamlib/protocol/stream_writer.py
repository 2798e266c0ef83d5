"""The single writer of a stream as a state machine (protocol.txt "Ledgers to logs":
"Opening a log", "Rolling ledgers"; unbounded-ledgers.txt for one-ledger streams).

Theory of operation. The machine decides WHICH ledger of the stream's list appends go
to and how the list changes; the appends themselves go through that ledger's
:class:`~streamlib.protocol.writer.LedgerWriter`. Its outputs are composite operations
the driver carries out (read or CAS the list, recover, create, close, take over a
ledger) and two outcomes: ``Serve(ledger)`` (appends go there from now on) and
``GiveUp(error)``. Its inputs, taken one at a time by ``step``, are the answers to
those operations and the failures of its ledgers' writers; start / roll / replace are
the driver's commands.

- Takeover (bounded): read the list; recover (fence + close) its LAST TWO ledgers, one
  after the other; create a ledger; CAS the list with it appended. Nothing is served
  before that CAS succeeds. A CAS conflict means someone else moved: discard the new
  ledger and start again (up to ``max_takeover_attempts``).
- Takeover (unbounded): the stream lives in one ledger; take it over by term (creating
  it first on a new stream, by CAS of the list; a conflict means another writer created
  it: take that one over).
- Rolling: create a ledger, CAS it into the list after the current one, serve it, and
  only then close the old one (appends flow meanwhile). If the list no longer ends with
  our ledger, it moved on without us: we are fenced. A roll starts only once the ledger
  rolled away from before is closed (``stream_rules.may_roll``), so at most the last two
  ledgers of a list are open.
- A ledger that fails WITHOUT being fenced (no bookie left for an ensemble change, too
  many changes, a metadata error) makes the writer BROKEN: nothing is served until a
  ``replace()`` (the driver's next append asks for it, and retries it while it fails):
  close the ledger at its LAC, then roll as above; an unbounded stream takes its ledger
  over again instead. Fenced anywhere (a ledger fenced, a term taken, the list moved on)
  means another writer has the stream: GiveUp.
- A fail-stop writer (``fail_stop``: a broker's, whose producers resend by sequence id)
  gives up at a ledger's first failure instead, fenced or not: a resend is deduplicated
  against the highest sequence id stored, so nothing may be stored after an entry that
  failed -- the next owner's takeover decides what of the failed ledger is kept. (The
  driver keeps the other half of that rule for it: appends go to one ledger at a time, so
  a roll's new ledger takes nothing until every entry of the old one is acknowledged.)
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from streamlib.protocol.errors import (
    InvalidTermError,
    LedgerFencedError,
    NoSuchLedgerError,
    StreamFencedError,
    StreamlibError,
)
from streamlib.protocol.stream_rules import (
    LedgerSpan,
    gives_up_on_failure,
    ledgers_to_recover,
    may_roll,
)

LIST_CAS_ATTEMPTS = 20  # a roll's list CAS retried this often (retention, cursor moves)


# -- outputs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadList:
    """Read the stream's ledger list: ListRead, or ListFailed."""


@dataclass(frozen=True)
class WriteList:
    """CAS the list: ListWritten, ListConflict, or ListFailed."""

    ledgers: tuple[LedgerSpan, ...]
    expected_version: int


@dataclass(frozen=True)
class RecoverLedger:
    """Open with recovery (fence + close): LedgerRecovered, or LedgerRecoveryFailed."""

    ledger_id: int


@dataclass(frozen=True)
class CreateLedger:
    """Create a ledger for the stream: LedgerCreated, or LedgerCreateFailed."""

    unbounded: bool = False


@dataclass(frozen=True)
class CloseLedger:
    """Close one of our ledgers at its LAC once its pending appends are done:
    LedgerClosed, or LedgerCloseFailed."""

    ledger_id: int


@dataclass(frozen=True)
class TakeOverLedger:
    """Take an unbounded ledger over by term: LedgerTakenOver, or LedgerRecoveryFailed."""

    ledger_id: int


@dataclass(frozen=True)
class DiscardLedger:
    """Delete a ledger we created that never made it into the list."""

    ledger_id: int


@dataclass(frozen=True)
class RecordSize:
    """A closed ledger's final size, for the list (retention reads it)."""

    ledger_id: int
    entries: int
    size_bytes: int


@dataclass(frozen=True)
class Serve:
    """Appends go to this ledger from now on (its writer is the driver's)."""

    ledger_id: int


@dataclass(frozen=True)
class Rolled:
    """A roll finished: the ledger rolled away from is closed (retention may run)."""


@dataclass(frozen=True)
class GiveUp:
    """The writer is done: fenced out, or the takeover failed."""

    error: StreamlibError


@dataclass(frozen=True)
class ReplaceFailed:
    """A replace() did not get through (retry it later)."""

    error: StreamlibError


StreamAction = (
    ReadList
    | WriteList
    | RecoverLedger
    | CreateLedger
    | CloseLedger
    | TakeOverLedger
    | DiscardLedger
    | RecordSize
    | Serve
    | Rolled
    | GiveUp
    | ReplaceFailed
)


# -- inputs: the answers to the outputs above, and a ledger writer's failure ------------


@dataclass(frozen=True)
class ListRead:
    ledgers: Sequence[LedgerSpan]
    version: int
    unbounded: bool


@dataclass(frozen=True)
class ListWritten:
    version: int


@dataclass(frozen=True)
class ListConflict:
    """The list CAS failed on a version mismatch."""


@dataclass(frozen=True)
class ListFailed:
    """Reading or writing the list failed (not a version conflict)."""

    error: StreamlibError


@dataclass(frozen=True)
class LedgerRecovered:
    ledger_id: int
    entries: int
    size_bytes: int


@dataclass(frozen=True)
class LedgerRecoveryFailed:
    """Recovering (RecoverLedger) or taking over (TakeOverLedger) the ledger failed."""

    ledger_id: int
    error: StreamlibError


@dataclass(frozen=True)
class LedgerTakenOver:
    ledger_id: int


@dataclass(frozen=True)
class LedgerCreated:
    ledger_id: int


@dataclass(frozen=True)
class LedgerCreateFailed:
    error: StreamlibError


@dataclass(frozen=True)
class LedgerClosed:
    ledger_id: int
    entries: int
    size_bytes: int


@dataclass(frozen=True)
class LedgerCloseFailed:
    """fenced: the ledger was recovered by another writer."""

    ledger_id: int
    error: StreamlibError
    fenced: bool


@dataclass(frozen=True)
class LedgerFailed:
    """The writer of one of our ledgers failed (fenced: by another writer)."""

    ledger_id: int
    error: StreamlibError
    fenced: bool


StreamEvent = (
    ListRead
    | ListWritten
    | ListConflict
    | ListFailed
    | LedgerRecovered
    | LedgerRecoveryFailed
    | LedgerTakenOver
    | LedgerCreated
    | LedgerCreateFailed
    | LedgerClosed
    | LedgerCloseFailed
    | LedgerFailed
)


class State(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    BROKEN = "broken"  # the current ledger failed, not fenced: replace() before appends
    FENCED = "fenced"  # another writer has the stream (or the takeover failed)
    CLOSED = "closed"


class Op(enum.Enum):
    TAKEOVER = "takeover"
    ROLL = "roll"
    REPLACE = "replace"


class StreamWriterMachine:
    def __init__(
        self, name: str, *, max_takeover_attempts: int = 10, fail_stop: bool = False
    ) -> None:
        self.name = name
        self.max_takeover_attempts = max_takeover_attempts
        self.fail_stop = fail_stop
        self.state = State.STARTING
        self.error: StreamlibError | None = None
        self.current: int | None = None  # the ledger served
        self.unbounded = False
        self.takeover_attempts = 0
        self.rolls = 0
        self.op: Op | None = None
        self._list: list[LedgerSpan] = []
        self._version = -1
        self._to_recover: list[int] = []
        self._new: int | None = None  # created, not yet in the list
        self._old: int | None = None  # the ledger a roll or replace moves away from
        self._unclosed: int | None = None  # rolled away from; its close failed
        self._cas_attempts = 0

    # -- inputs -------------------------------------------------------------------------

    def step(self, event: StreamEvent) -> list[StreamAction]:
        """Take one input (the answer to an output, or a ledger writer's failure)."""
        if self.state in (State.FENCED, State.CLOSED):
            return self._after_the_end(event)
        match event:
            case ListRead(ledgers, version, unbounded):
                return self.on_list_read(ledgers, version, unbounded)
            case ListWritten(version):
                return self.on_list_written(version)
            case ListConflict():
                return self.on_list_conflict()
            case ListFailed(error):
                return self.on_list_failed(error)
            case LedgerRecovered(ledger_id, entries, size_bytes):
                return self.on_recovered(ledger_id, entries, size_bytes)
            case LedgerRecoveryFailed(ledger_id, error):
                return self.on_recovery_failed(ledger_id, error)
            case LedgerTakenOver(ledger_id):
                return self.on_taken_over(ledger_id)
            case LedgerCreated(ledger_id):
                return self.on_created(ledger_id)
            case LedgerCreateFailed(error):
                return self.on_create_failed(error)
            case LedgerClosed(ledger_id, entries, size_bytes):
                return self.on_closed(ledger_id, entries, size_bytes)
            case LedgerCloseFailed(ledger_id, error, fenced):
                return self.on_close_failed(ledger_id, error, fenced)
            case LedgerFailed(ledger_id, error, fenced):
                return self.on_ledger_failed(ledger_id, error, fenced)
        raise TypeError(f"a stream writer takes no {type(event).__name__} ({event!r})")

    def _after_the_end(self, event: StreamEvent) -> list[StreamAction]:
        """A writer that gave up or closed serves nothing again, whatever its operations
        in flight answer (a roll's list CAS that succeeds after a fail-stop writer gave
        up would otherwise serve the new ledger, and take appends after the failure):
        their answers only clean up. A ledger made and not in the list is discarded; one
        the list took stays, for the next writer's takeover to recover."""
        match event:
            case LedgerCreated(ledger_id):
                return [DiscardLedger(ledger_id)]
            case ListRead() | ListConflict():  # (before the CAS, or the CAS failed)
                new, self._new = self._new, None
                return [DiscardLedger(new)] if new is not None else []
            case ListWritten() | ListFailed():  # (in the list, or maybe: left there)
                self._new = None
        return []

    # -- takeover -----------------------------------------------------------------------

    def start(self) -> list[StreamAction]:
        self.op = Op.TAKEOVER
        self.takeover_attempts += 1
        return [ReadList()]

    def on_list_read(
        self, ledgers: Sequence[LedgerSpan], version: int, unbounded: bool
    ) -> list[StreamAction]:
        self._list, self._version, self.unbounded = list(ledgers), version, unbounded
        if self.op is Op.TAKEOVER:
            if unbounded:
                if ledgers:
                    return [TakeOverLedger(ledgers[0].ledger_id)]
                return [CreateLedger(unbounded=True)]
            self._to_recover = ledgers_to_recover([span.ledger_id for span in ledgers])
            return self._recover_next()
        if self.op in (Op.ROLL, Op.REPLACE) and self._new is not None:
            if not ledgers or ledgers[-1].ledger_id != self._old:
                new, self._new = self._new, None
                return [DiscardLedger(new), *self._fenced("the ledger list moved on without us")]
            spans = (*ledgers, LedgerSpan(self._new))
            return [WriteList(spans, version)]
        return []

    def on_list_failed(self, error: StreamlibError) -> list[StreamAction]:
        """Reading or writing the list failed (not a version conflict)."""
        new, self._new = self._new, None
        discard: list[StreamAction] = [DiscardLedger(new)] if new is not None else []
        if self.op is Op.TAKEOVER:
            return discard + self._give_up(error)
        if self.op is Op.REPLACE:
            return discard + self._replace_failed(error)
        return discard + self._roll_off()

    def _recover_next(self) -> list[StreamAction]:
        if self._to_recover:
            return [RecoverLedger(self._to_recover[0])]
        return [CreateLedger()]

    def on_recovered(self, ledger_id: int, entries: int, size_bytes: int) -> list[StreamAction]:
        if self.op is not Op.TAKEOVER or not self._to_recover:
            return []
        self._to_recover.pop(0)
        self._list = [
            LedgerSpan(s.ledger_id, entries, size_bytes, s.created_time_ms)
            if s.ledger_id == ledger_id
            else s
            for s in self._list
        ]
        return self._recover_next()

    def on_recovery_failed(self, ledger_id: int, error: StreamlibError) -> list[StreamAction]:
        if self.op is Op.REPLACE:
            return self._replace_failed(error)
        if self.op is not Op.TAKEOVER:
            return []
        if isinstance(error, NoSuchLedgerError) and self._to_recover:
            return self.on_recovered(ledger_id, 0, 0)  # deleted meanwhile: nothing to fence
        return self._give_up(error)

    def on_taken_over(self, ledger_id: int) -> list[StreamAction]:
        if self.op not in (Op.TAKEOVER, Op.REPLACE):
            return []
        return self._serve(ledger_id)

    def on_created(self, ledger_id: int) -> list[StreamAction]:
        self._new = ledger_id
        if self.op is Op.TAKEOVER:
            return [WriteList((*self._list, LedgerSpan(ledger_id)), self._version)]
        if self.op in (Op.ROLL, Op.REPLACE):
            self._cas_attempts = 0
            return [ReadList()]
        return []

    def on_create_failed(self, error: StreamlibError) -> list[StreamAction]:
        if self.op is Op.TAKEOVER:
            return self._give_up(error)
        if self.op is Op.REPLACE:
            return self._replace_failed(error)
        self.op = None  # a roll is tried again on a later append
        return []

    def on_list_written(self, version: int) -> list[StreamAction]:
        new, self._new = self._new, None
        self._version = version
        if new is None:
            return []
        if self.op is Op.ROLL:
            old, self._unclosed = self._old, self._old
            self.current = new
            self.rolls += 1
            assert old is not None
            return [Serve(new), CloseLedger(old)]  # from here on appends go to `new`
        return self._serve(new)

    def on_list_conflict(self) -> list[StreamAction]:
        new = self._new
        if self.op is Op.TAKEOVER:
            self._new = None
            discard: list[StreamAction] = [DiscardLedger(new)] if new is not None else []
            if self.takeover_attempts >= self.max_takeover_attempts:
                return discard + self._give_up(
                    StreamFencedError(
                        f"stream {self.name!r}: could not take over in "
                        f"{self.takeover_attempts} attempts; another writer keeps moving "
                        "the ledger list"
                    )
                )
            return discard + self.start()  # someone else moved: start again
        self._cas_attempts += 1
        if self._cas_attempts >= LIST_CAS_ATTEMPTS:
            self._new = None
            error = StreamlibError(f"stream {self.name!r}: the list CAS kept conflicting")
            fail = self._replace_failed(error) if self.op is Op.REPLACE else self._roll_off()
            return ([DiscardLedger(new)] if new is not None else []) + fail
        return [ReadList()]  # e.g. retention trimmed the front meanwhile: re-read

    def _serve(self, ledger_id: int) -> list[StreamAction]:
        self.current = ledger_id
        self.state = State.SERVING
        self.op = None
        return [Serve(ledger_id)]

    # -- rolling ------------------------------------------------------------------------

    def roll(self) -> list[StreamAction]:
        """Roll to a new ledger (the driver asks when the rollover policy says so)."""
        if self.state is not State.SERVING or self.op is not None or self.unbounded:
            return []
        self.op = Op.ROLL
        self._old = self.current
        if not may_roll(previous_closed=self._unclosed is None):
            assert self._unclosed is not None
            return [CloseLedger(self._unclosed)]  # first the one before
        return [CreateLedger()]

    def on_closed(self, ledger_id: int, entries: int, size_bytes: int) -> list[StreamAction]:
        actions: list[StreamAction] = [RecordSize(ledger_id, entries, size_bytes)]
        if ledger_id == self._unclosed:
            self._unclosed = None
        if self.op is Op.ROLL and ledger_id != self._old:  # the one before: now roll
            return [*actions, CreateLedger()]
        if self.op is Op.ROLL:  # the ledger rolled away from
            self.op = None
            return [*actions, Rolled()]
        if self.op is Op.REPLACE:  # the one before first (may_roll), then the broken one
            assert self._old is not None
            return [*actions, CreateLedger() if ledger_id == self._old else CloseLedger(self._old)]
        return actions

    def on_close_failed(
        self, ledger_id: int, error: StreamlibError, fenced: bool
    ) -> list[StreamAction]:
        if fenced:  # a takeover recovered it
            if ledger_id == self._unclosed:
                self._unclosed = None
            return self._fenced(f"ledger {ledger_id} was recovered by another writer ({error})")
        if self.op is Op.REPLACE:
            return self._replace_failed(error)
        if self.op is Op.ROLL:
            return self._roll_off()  # _unclosed stays: the next roll closes it first
        return []

    def _roll_off(self) -> list[StreamAction]:
        self.op = None
        return []

    # -- a broken ledger ----------------------------------------------------------------

    def on_ledger_failed(
        self, ledger_id: int, error: StreamlibError, fenced: bool
    ) -> list[StreamAction]:
        """The writer of one of our ledgers failed."""
        if self.state in (State.FENCED, State.CLOSED):
            return []
        if fenced:
            return self._fenced(f"stream {self.name!r} was taken over by another writer ({error})")
        if gives_up_on_failure(fenced, self.fail_stop):  # (any ledger: a rolled-from one too)
            return self._give_up(
                StreamFencedError(f"stream {self.name!r}: ledger {ledger_id} failed ({error})")
            )
        if ledger_id == self.current and self.state is State.SERVING:
            self.state = State.BROKEN
            self.error = error
        return []

    def replace(self) -> list[StreamAction]:
        """Replace the broken current ledger (see the module docstring)."""
        if self.state is not State.BROKEN or self.op is not None:
            return []
        self.op = Op.REPLACE
        self._old = self.current
        assert self._old is not None
        if self.unbounded:
            return [TakeOverLedger(self._old)]
        if not may_roll(previous_closed=self._unclosed in (None, self._old)):
            assert self._unclosed is not None
            return [CloseLedger(self._unclosed)]  # a replacement rolls too: never past it
        return [CloseLedger(self._old)]  # at its LAC: what failed after it is not in it

    def _replace_failed(self, error: StreamlibError) -> list[StreamAction]:
        self.op = None
        if self.state is State.FENCED:
            return []
        return [ReplaceFailed(error)]

    # -- endings ------------------------------------------------------------------------

    def _fenced(self, why: str) -> list[StreamAction]:
        return self._give_up(StreamFencedError(f"stream {self.name!r}: {why}"))

    def _give_up(self, error: StreamlibError) -> list[StreamAction]:
        if self.state is State.FENCED:
            return []
        if isinstance(error, LedgerFencedError | InvalidTermError):  # lost a takeover race
            error = StreamFencedError(f"stream {self.name!r} was taken over ({error})")
        self.state = State.FENCED
        self.error = error
        self.op = None
        return [GiveUp(error)]

    def close(self) -> None:
        """The driver stops (it closes or releases the current ledger itself)."""
        if self.state is not State.FENCED:
            self.state = State.CLOSED
