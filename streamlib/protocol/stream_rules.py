"""The decisions of a log of ledgers (protocol.txt "Ledgers to logs";
closing-ledgers-safely.txt; ARCHITECTURE.md §4), as pure functions.

Taking over a stream: read the ledger list, recover (fence + close) the LAST TWO
ledgers -- the old writer may still be writing to the second-to-last while it adds the
last one to the list -- create a new ledger and CAS the list. No write is served before
that CAS succeeds; a CAS failure means someone else moved: start again.

Rolling: create the new ledger, CAS it into the list, and only then close the old one,
so writes continue during the metadata update (safe because takeover fences two).

Readers never fence (ARCHITECTURE.md §4: only a writer taking over may fence). Readers,
consumers, Spark and admin tools open every ledger without recovery and read up to what
its metadata or LAC confirms. A ledger that is no longer last but still open is being
rolled away from: its writer closes it right after the roll's CAS. The reader reads it
up to its LAC and waits (the ledger's metadata watch and the bookies' long poll) for
that close; it never moves past an open ledger, because more of its entries may still
be acknowledged and they come before anything in the next ledger. If the writer died
between the CAS and the close, the ledger stays open until the next writer takes the
stream over (which recovers the last two ledgers): its readers wait, as the readers of
a Pulsar topic wait for its next owner. A reader cannot prove a writer gone -- a
stopped process or a partitioned host looks exactly like a dead one -- so there is no
timeout after which it recovers. The same rule bounds what is "confirmed now": the
confirmed prefix of a stream ends at the first ledger that is still open (at its LAC).
A writer closes ledger n before it rolls away from ledger n+1 (see ``may_roll``), so
only the last two ledgers can be open: the same fact takeover relies on.

Retention (the exact rule). A ledger L of the list may be deleted iff ALL hold:
  1. L is not the current (last) ledger of the list;
  2. every durable cursor has consumed L: L comes before the ledger of the cursor's
     mark-delete position (with no durable cursor, every ledger counts as consumed);
  3. L is outside retention: retention time T > 0 and L was closed at least T ago
     (a ledger's close time is the creation time of the next ledger), OR retention
     size S > 0 and L together with every newer ledger holds more than S bytes, OR
     retention is `compacted` and L comes before the compaction horizon's ledger (its
     keys live on in the compacted view: streamlib/protocol/compaction.py, which also
     says which marks bound rule 2 for a compacted stream).
     With T = 0 and S = 0 and not compacted, retention is unlimited: nothing goes.
The list is CASed FIRST, and only then are the ledgers deleted: a crash in between
leaks ledgers (the sweeper collects them), it never leaves the list pointing at a
deleted ledger.

Fragment retention (unbounded streams live in ONE ledger, so retention works on its
fragments instead; the exact rule). Fragment F_i of the ledger may be dropped iff ALL
hold:
  1. F_i is not the last fragment (the writer's);
  2. every durable cursor has consumed it: F_(i+1) starts at or before the entry of the
     cursor's mark-delete position (the mark's own entry may be partly consumed, so it
     is never counted; with no durable cursor every fragment counts as consumed);
  3. F_i is outside retention: retention time T > 0 and F_(i+1) began at least T ago
     (a fragment ends when the next begins; an unknown start time is never old), OR
     retention size S > 0 and the bytes from F_i's first entry to the start of the last
     fragment exceed S (the last fragment's growth is not known to the trimmer, so the
     figure is a lower bound; an unknown start length never counts as big).
Only a prefix is dropped: the first fragment that must stay keeps every later one. The
ledger's metadata is CASed (fragments dropped, first_entry_id advanced) and only then
do bookies delete those entries, in their garbage collection, from first_entry_id's
new value down: an entry the metadata still lists is never deleted.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LedgerSpan:
    """What the stream's list knows of one ledger."""

    ledger_id: int
    entries: int = 0
    size_bytes: int = 0
    created_time_ms: int = 0


def ledgers_to_recover(ledger_ids: Sequence[int]) -> list[int]:
    """Takeover fences and closes the last two ledgers of the list."""
    return list(ledger_ids[-2:])


READERS_MAY_RECOVER = False  # the rule above; the scanner asserts it at the open


class ReaderStep(enum.Enum):
    """What a reader does at a ledger once it has read it up to what is confirmed."""

    MOVE_ON = "move_on"  # closed and read to its last entry: the next ledger
    WAIT = "wait"  # open: wait for more entries, or for its writer's close
    STOP = "stop"  # a reader of what is confirmed now (no tailing) ends here


def reader_step(closed: bool, tail: bool) -> ReaderStep:
    """After reading a ledger up to its last entry (closed) or LAC (open)."""
    if closed:
        return ReaderStep.MOVE_ON
    return ReaderStep.WAIT if tail else ReaderStep.STOP


OPEN_TAIL = 2  # at most this many ledgers at the end of a list can be open


@dataclass(frozen=True)
class LedgerEnd:
    """What a reader knows of one ledger's end (opened without recovery)."""

    ledger_id: int
    closed: bool
    last_entry_id: int  # the last entry when closed, else the LAC (-1: none)
    first_entry_id: int = 0  # the first retained entry


def confirmed_end(tail: Sequence[LedgerEnd]) -> tuple[int, int] | None:
    """The (ledger id, entry id) of the last entry confirmed now, given the last
    OPEN_TAIL ledgers of the list (oldest first); None when they hold no confirmed entry
    (look at the ledgers before them). Nothing after an open ledger is confirmed."""
    end = None
    for ledger in tail:
        if ledger.last_entry_id >= ledger.first_entry_id:
            end = (ledger.ledger_id, ledger.last_entry_id)
        if not ledger.closed:
            break
    return end


def may_roll(previous_closed: bool) -> bool:
    """A writer rolls away from its current ledger only once the ledger before it is
    closed (its close is retried first): that keeps at most OPEN_TAIL ledgers open."""
    return previous_closed


def may_append(ledger_id: int, in_flight_on: int | None) -> bool:
    """Appends go to one ledger at a time: a ledger takes an append only while no entry
    of another is in flight (in_flight_on: the ledger of the last entry in flight, None
    when none is). A roll's new ledger waits for the old one's entries: were one of those
    to fail, what went to the new ledger would be stored after it."""
    return in_flight_on is None or in_flight_on == ledger_id


def gives_up_on_failure(fenced: bool, fail_stop: bool) -> bool:
    """Whether a writer whose ledger failed gives the stream up (rather than replacing
    the ledger): when it was fenced (another writer has the stream), and -- fail-stop
    writers, a broker's -- at any failure. A broker deduplicates a resend against the
    highest sequence id stored, so nothing may be stored after an entry that failed:
    the next owner's takeover (fence, recover) decides what of it is kept."""
    return fenced or fail_stop


@dataclass(frozen=True)
class RolloverPolicy:
    max_entries: int = 0  # 0 = no limit
    max_bytes: int = 0
    max_age_ms: int = 0


def roll_deadline_ms(created_ms: int, policy: RolloverPolicy, rnd: random.Random) -> int | None:
    """When age makes the ledger roll, with up to 10% jitter so streams created together
    do not all roll at once. None = no age limit."""
    if policy.max_age_ms <= 0:
        return None
    return created_ms + policy.max_age_ms - int(rnd.random() * policy.max_age_ms * 0.1)


def should_roll(
    entries: int, size_bytes: int, now_ms: int, deadline_ms: int | None, policy: RolloverPolicy
) -> bool:
    if policy.max_entries and entries >= policy.max_entries:
        return True
    if policy.max_bytes and size_bytes >= policy.max_bytes:
        return True
    return deadline_ms is not None and entries > 0 and now_ms >= deadline_ms


@dataclass(frozen=True)
class RetentionPolicy:
    time_ms: int = 0  # 0 = no time limit
    size_bytes: int = 0  # 0 = no size limit
    compacted: bool = False  # what the compaction horizon has passed goes (rule 3)


def retention_plan(
    ledgers: Sequence[LedgerSpan],
    mark_delete_ledgers: Sequence[int],
    policy: RetentionPolicy,
    now_ms: int,
    horizon_ledger: int | None = None,
) -> list[int]:
    """Ids of the ledgers the rule above allows to delete (oldest first).

    mark_delete_ledgers: for every durable cursor, the ledger id of its mark-delete
    position (-1 when it has consumed nothing); for a compacted stream, the marks
    compaction.retention_marks gives (the horizon's among them). horizon_ledger: the
    compaction horizon's ledger (None: never compacted)."""
    compacted = policy.compacted and horizon_ledger is not None
    if len(ledgers) < 2 or (policy.time_ms <= 0 and policy.size_bytes <= 0 and not compacted):
        return []
    slowest = min(mark_delete_ledgers) if mark_delete_ledgers else None
    if compacted:
        assert horizon_ledger is not None
        slowest = horizon_ledger if slowest is None else min(slowest, horizon_ledger)
    candidates = []
    for i, ledger in enumerate(ledgers[:-1]):  # rule 1: never the current ledger
        if slowest is not None and ledger.ledger_id >= slowest:
            break  # rule 2: this and every later ledger may still be needed
        closed_ms = ledgers[i + 1].created_time_ms
        too_old = policy.time_ms > 0 and now_ms - closed_ms >= policy.time_ms
        newer_bytes = sum(other.size_bytes for other in ledgers[i:])
        too_big = policy.size_bytes > 0 and newer_bytes > policy.size_bytes
        if compacted or too_old or too_big:
            candidates.append(ledger.ledger_id)
        else:
            break  # the list is deleted from the front only: keep order, no holes
    return candidates


@dataclass(frozen=True)
class FragmentSpan:
    """What retention needs of one fragment of an unbounded ledger."""

    first_entry_id: int
    created_time_ms: int = 0  # 0 = unknown
    start_length: int | None = None  # ledger length before first_entry_id; None = unknown


def fragment_retention_plan(
    fragments: Sequence[FragmentSpan],
    mark_delete_entries: Sequence[int],
    policy: RetentionPolicy,
    now_ms: int,
    horizon_entry: int | None = None,
) -> int:
    """How many leading fragments the fragment rule above allows to drop.

    mark_delete_entries: for every durable cursor, the entry id of its mark-delete
    position (-1 when it has consumed nothing); for a compacted stream, the marks
    compaction.fragment_retention_marks gives. horizon_entry: the compaction horizon's
    entry in this ledger (None: never compacted)."""
    compacted = policy.compacted and horizon_entry is not None
    if len(fragments) < 2 or (policy.time_ms <= 0 and policy.size_bytes <= 0 and not compacted):
        return 0
    slowest = min(mark_delete_entries) if mark_delete_entries else None
    if compacted:
        assert horizon_entry is not None
        slowest = horizon_entry if slowest is None else min(slowest, horizon_entry)
    end_length = fragments[-1].start_length
    count = 0
    for i, fragment in enumerate(fragments[:-1]):  # rule 1: never the last fragment
        after = fragments[i + 1]
        if slowest is not None and after.first_entry_id > slowest:
            break  # rule 2: a cursor still needs an entry of this fragment
        began = after.created_time_ms
        too_old = policy.time_ms > 0 and began > 0 and now_ms - began >= policy.time_ms
        too_big = (
            policy.size_bytes > 0
            and fragment.start_length is not None
            and end_length is not None
            and end_length - fragment.start_length > policy.size_bytes
        )
        if not (compacted or too_old or too_big):
            break  # a prefix only
        count += 1
    return count
