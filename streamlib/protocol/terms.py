"""Term rules of unbounded ledgers (unbounded-ledgers.txt, "Protocol changes").

Fencing becomes an integer term. Normal adds, recovery adds, recovery LAC reads and
recovery reads carry the writer's term; normal reads ignore terms.

| bookie term vs request term | answer                         | bookie term after |
|-----------------------------|--------------------------------|-------------------|
| bookie <= request           | accept                         | request           |
| bookie >  request           | reject with INVALID_TERM       | bookie (unchanged)|

A client that gets INVALID_TERM disengages (it is no longer the writer). The bookie
implements the same table in bookie/ (which may not import this package);
tests/bookie checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TermCheck:
    accepted: bool
    term_after: int


def check_term(bookie_term: int, request_term: int) -> TermCheck:
    if request_term < 0 or bookie_term < 0:
        raise ValueError(f"terms are >= 0, got bookie={bookie_term} request={request_term}")
    if request_term >= bookie_term:
        return TermCheck(True, request_term)
    return TermCheck(False, bookie_term)


def next_term(current_term: int) -> int:
    """The term a writer taking over claims (by CAS on the ledger metadata)."""
    return current_term + 1
