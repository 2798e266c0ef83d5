"""The decisions of compaction (Pulsar's topic compaction, Kafka's compacted topics), as
pure functions. The I/O is streamlib/stream/compaction.py (the compactor) and
streamlib/stream/compacted.py (reading the compacted view).

Theory of operation.

A stream used as a changelog keeps the latest message of every key. A compactor makes
the *compacted view* of the stream up to a *horizon* H (a position of the stream): the
latest message of every key among the messages at or before H, in stream order, in a
closed ledger of its own. It reads the previous view (up to its horizon H0) followed by
the stream's messages after H0 up to H -- exactly what a compacted reader reads -- twice,
as Pulsar's two-phase compactor does: phase one folds every key to the position of its
latest message (``LatestByKey``: memory is one position per key, not the messages);
phase two writes the messages found there, entry by entry, into a new ledger
(``kept_runs``). Then one CAS of the stream's metadata installs the new view -- only if
the view it started from is still the installed one (``may_install``) -- and only then
is the previous view's ledger deleted. A compactor that dies before the CAS leaves the
installed view whole (its ledger is a leak the sweeper collects); one that dies after it
leaks the previous view's ledger, never a view that names a missing ledger.

Rules of the view:
  * A message without a key is not kept (there is nothing to keep it as the latest of).
  * A message with a key and an empty payload is a tombstone: its key is left out of the
    view (and the tombstone itself too: the key is gone, not kept as empty).
  * A message keeps its position: a reader of the view sees the ids the stream gave, so
    a cursor's mark-delete means the same in the view and in the stream.
  * A chunked message (its pieces are consecutive entries) is one message at its last
    piece's position; when it is kept, every piece is kept. A horizon never splits one:
    pieces still unfinished at the stream's end move the horizon back before the first.

Reading compacted (``reads_view``): a reader after position S reads the view's messages
after S when S is before the horizon, then the stream after the horizon; otherwise the
stream after S. Each message it delivers is acknowledged over everything since the one
before it, so the messages compacted out are acknowledged with the next kept one.

Retention of a compacted stream (``retention_marks``). The horizon holds the stream
like a durable cursor at H: what comes after it is not compacted yet. A cursor that
reads compacted needs the stream only from max(its mark-delete, H). With retention
``compacted`` (Kafka's cleanup.policy=compact) the ledgers below every such mark go,
whatever their age and size; with time / size retention they go when that rule says.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

# Positions as (ledger id, entry id, batch index) tuples: the core imports nothing of
# the stream layer (MessageId is such a tuple).
Position = tuple[int, int, int]


class Run(NamedTuple):
    """Batch indexes first..last of one entry, all kept."""

    first: int
    last: int


@dataclass
class LatestByKey:
    """Phase one: every key's latest message so far (its position; None when that latest
    is a tombstone), and the entries of each kept chunked message's pieces."""

    latest: dict[str, Position | None] = field(default_factory=dict)
    # The position of a chunked message (its last piece) -> its pieces' entries.
    pieces: dict[Position, list[tuple[int, int]]] = field(default_factory=dict)

    def observe(self, key: str | None, position: Position, tombstone: bool) -> None:
        if key is None:
            return  # no key: not kept
        superseded = self.latest.get(key)
        if superseded is not None:
            self.pieces.pop(superseded, None)  # (memory: one entry per key, not per update)
        self.latest[key] = None if tombstone else position

    def observe_chunked(
        self, key: str | None, entries: Sequence[tuple[int, int]], tombstone: bool
    ) -> None:
        """A whole chunked message, its pieces in `entries` (the last one its position)."""
        if key is None:
            return
        position = (*entries[-1], 0)
        self.observe(key, position, tombstone)
        if not tombstone:
            self.pieces[position] = list(entries)

    def kept(self) -> KeptMessages:
        positions = {p for p in self.latest.values() if p is not None}
        piece_entries = {
            entry for position, entries in self.pieces.items() if position in positions
            for entry in entries
        }  # fmt: skip
        keys = sum(1 for p in self.latest.values() if p is not None)
        return KeptMessages(positions, piece_entries, keys)


class KeptMessages(NamedTuple):
    """What phase two writes: the positions of the kept messages, and the entries of the
    kept chunked messages' pieces (kept whole)."""

    positions: set[Position]
    piece_entries: set[tuple[int, int]]
    keys: int


def kept_indexes(
    kept: KeptMessages, ledger_id: int, entry_id: int, count: int, chunk_piece: bool
) -> list[int]:
    """The batch indexes of an entry of `count` messages that the view keeps."""
    if chunk_piece:
        return [0] if (ledger_id, entry_id) in kept.piece_entries else []
    return [i for i in range(count) if (ledger_id, entry_id, i) in kept.positions]


def kept_runs(indexes: Iterable[int]) -> list[Run]:
    """Sorted indexes as runs of consecutive ones (each becomes a compacted entry)."""
    runs: list[Run] = []
    for index in sorted(indexes):
        if runs and runs[-1].last + 1 == index:
            runs[-1] = Run(runs[-1].first, index)
        else:
            runs.append(Run(index, index))
    return runs


def horizon_of(end: Position, unfinished_chunk_before: Position | None) -> Position:
    """The horizon of a compaction that read up to `end`: `end`, or -- when the last
    entries were pieces of a chunked message not finished yet -- the position before
    its first piece (the rest of it comes after the horizon, with the stream's tail)."""
    return end if unfinished_chunk_before is None else unfinished_chunk_before


def may_install(installed_ledger: int | None, started_from_ledger: int | None) -> bool:
    """Whether a compactor may CAS its view in: only over the view it was built from
    (None: none). Another compactor's view installed meanwhile wins; this one is
    discarded (both are right; this keeps one compaction at a time per stream)."""
    return installed_ledger == started_from_ledger


def reads_view(start_after: Position, horizon: Position | None) -> bool:
    """Whether a compacted reader after `start_after` starts in the view."""
    return horizon is not None and start_after < horizon


def first_index_after(
    ledger_id: int, entry_id: int, first_index: int, start_after: Position
) -> int | None:
    """The first index of a compacted entry (a run from first_index) a reader after
    `start_after` reads (None: none of the run, which ends at the entry's last index,
    unknown here: the caller compares with it)."""
    if (ledger_id, entry_id) < start_after[:2]:
        return None
    if (ledger_id, entry_id) == start_after[:2]:
        if start_after[2] < 0:
            return first_index
        return max(first_index, start_after[2] + 1)
    return first_index


def retention_marks(
    cursors: Iterable[tuple[Position, bool]], horizon: Position | None
) -> list[int]:
    """The ledger ids that bound retention (retention_plan's mark_delete_ledgers): each
    durable cursor's mark-delete -- for one that reads compacted, the later of it and
    the horizon -- and the horizon itself, which holds what is not compacted yet.
    cursors: (mark-delete position, reads compacted)."""
    marks = []
    for mark, compacted in cursors:
        if compacted and horizon is not None:
            mark = max(mark, horizon)
        marks.append(mark[0])
    if horizon is not None:
        marks.append(horizon[0])
    return marks


def fragment_retention_marks(
    cursors: Iterable[tuple[Position, bool]], horizon: Position | None, ledger_id: int
) -> list[int]:
    """The same for an unbounded stream's one ledger (fragment_retention_plan's
    mark_delete_entries): entry ids; a mark on another ledger, or at the start, is -1."""
    marks = []
    for mark, compacted in cursors:
        if compacted and horizon is not None:
            mark = max(mark, horizon)
        marks.append(entry_in(mark, ledger_id))
    if horizon is not None:
        marks.append(entry_in(horizon, ledger_id))
    return marks


def entry_in(position: Position, ledger_id: int) -> int:
    """A position's entry id in an unbounded stream's one ledger (-1: another ledger's
    position, or the start)."""
    return position[1] if position[0] == ledger_id else -1


def backlog_bytes(ledgers: Sequence[tuple[int, int]], horizon: Position | None) -> int:
    """What the compaction policy measures: the bytes of the stream's rolled ledgers
    (all but the last: the open one's size is known only to its writer) after the
    horizon's ledger (all of them, with no horizon). ledgers: (id, size_bytes)."""
    after = -1 if horizon is None else horizon[0]
    return sum(size for ledger_id, size in ledgers[:-1] if ledger_id > after)


def should_compact(threshold_bytes: int, backlog: int) -> bool:
    """The policy: compact when the backlog passes the threshold (0: never by policy)."""
    return threshold_bytes > 0 and backlog > threshold_bytes
