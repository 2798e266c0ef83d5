"""Term rules of unbounded ledgers, the client's side (unbounded-ledgers.txt,
"Protocol changes").

Fencing becomes an integer term. Normal adds, recovery adds, recovery LAC reads and
recovery reads carry the writer's term; normal reads ignore terms. A writer taking
over claims the next term by CAS on the ledger metadata (:func:`next_term`).

The bookie's side -- accept a request whose term is >= the bookie's (adopting it),
reject a lower one with INVALID_TERM -- is decided in ONE place, the bookie's
``bookie/ledger_rules.py`` (the bookie may not import this package, and this package
imports nothing of ours), which the simulator's bookies run too. A client that gets
INVALID_TERM disengages (it is no longer the writer).
"""

from __future__ import annotations


def next_term(current_term: int) -> int:
    """The term a writer taking over claims (by CAS on the ledger metadata)."""
    return current_term + 1
