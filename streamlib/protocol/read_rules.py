"""When a reader (opened without recovery) must re-read a ledger's metadata before it
trusts what it learned from bookies (ARCHITECTURE.md §3 "Open without recovery").

A reader reads entry e from the write set of e's fragment in ITS copy of the metadata.
That copy goes stale when the writer changes the ensemble or rolls a fragment (unbounded
ledgers roll them on a schedule), or when a new term takes an unbounded ledger over.
- A LAC answer from a bookie whose term is newer than the copy's, or read while the copy
  says IN_RECOVERY, may cover entries of fragments the copy does not list: re-read
  first. (A term's recovery can replace a bookie before its writer adds anything, and
  the replaced bookie may keep an old term's dirty entries.)
- A long poll that brought no progress may be asking a bookie the writer no longer
  writes to: re-read, then poll again.
- A read of an entry up to the LAC that no replica could serve may have asked the wrong
  write set: re-read, and read again if the metadata changed; only an unchanged copy
  makes the error final.

Which bookie a tailing reader long-polls (:func:`long_poll_bookie`): one of the write
set of the next entry it wants, in that entry's fragment. A bookie reports an explicit
LAC only up to the highest entry it holds (bookie/ledger_rules.py: a LAC past anything
written is a forgery), so only a bookie that will hold the next entry is sure to report
progress past it; the last fragment's bookie at the same index may hold nothing of it
(E > Qw, or a fragment rolled after the entry). The writer, in turn, sends its explicit
LAC to the write set of the LAC's entry as well as to its current ensemble
(:func:`explicit_lac_bookies`): after a roll the current ensemble may hold nothing of it.
"""

from __future__ import annotations

from streamlib.protocol.ledger_metadata import LedgerMetadata
from streamlib.protocol.states import LedgerState


def refresh_before_using_lac(
    metadata_term: int, state: LedgerState, answer_term: int, advanced: bool
) -> bool:
    """After a LAC answer: must the reader re-read the metadata before using it?"""
    if state is LedgerState.CLOSED:
        return False  # a closed ledger's end is in the metadata itself
    return answer_term > metadata_term or state is LedgerState.IN_RECOVERY or not advanced


def retry_read_after_refresh(closed_before: bool, version_before: int, version_now: int) -> bool:
    """A read up to the LAC failed on every replica; the metadata was re-read. Read again
    only if the copy was of an open ledger and has changed."""
    return not closed_before and version_now != version_before


def long_poll_bookie(metadata: LedgerMetadata, next_entry: int, failures: int) -> str:
    """The bookie to long-poll for the LAC passing ``next_entry - 1``: the write set of
    ``next_entry`` first, then the rest of the last fragment, rotating past failures."""
    write_set = metadata.write_set_bookies(next_entry)
    rest = [b for b in metadata.last_fragment.ensemble if b not in write_set]
    candidates = [*write_set, *rest]
    return candidates[failures % len(candidates)]


def explicit_lac_bookies(metadata: LedgerMetadata, lac: int) -> tuple[str, ...]:
    """Where a writer publishes its explicit LAC: the bookies that hold the LAC's entry
    (they can report it), then the rest of its current ensemble (they will hold the next
    entries, so a reader waiting for those polls them)."""
    holders = metadata.write_set_bookies(lac) if lac >= max(0, metadata.first_entry_id) else ()
    rest = tuple(b for b in metadata.last_fragment.ensemble if b not in holders)
    return (*holders, *rest)


def local_lac_usable(
    writer_open: bool, writer_term: int, metadata_term: int, state: LedgerState
) -> bool:
    """May a reader take the LAC (and the acknowledged entries) from a writer of the same
    client (streamlib/ledger/local.py) instead of long-polling a bookie?

    The writer's LAC is the ledger's: every entry up to it has an ack quorum. It stays so
    while that writer writes: not once it stopped (closed, failed, released), nor once a
    newer term took an unbounded ledger over (its LAC is no longer the newest), nor while
    the ledger is being recovered or is closed (the metadata has the end then)."""
    return writer_open and writer_term >= metadata_term and state is LedgerState.OPEN
