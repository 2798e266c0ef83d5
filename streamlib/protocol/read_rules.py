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
"""

from __future__ import annotations

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
