"""The sans-I/O protocol core: every decision of the BookKeeper protocol, and nothing else.

Inputs are requests and bookie answers; outputs are decisions ("this write set",
"recoverable", "retry the close", "these adds are complete"). It holds the rules of
ARCHITECTURE.md §3 and §5 in one place so the I/O layers (streamlib.ledger,
streamlib.stream, the simulator in tests/sim) only carry messages and timers.

Must never import: anything of ours outside streamlib.protocol (not metadata, bookie,
or the rest of streamlib), nor asyncio, grpc, sockets, threads or clocks.
tests/unit/test_layering.py checks this.
"""

from streamlib.protocol.acks import AckTracker, PendingAdd
from streamlib.protocol.digest import (
    DigestManager,
    DigestType,
    mac_key,
    master_key,
    password_hash,
)
from streamlib.protocol.ledger_metadata import Fragment, LedgerMetadata
from streamlib.protocol.quorum import (
    EnsembleCoverage,
    coverage_threshold,
    covers_by_count,
    covers_every_ack_quorum,
    ensemble_write_sets,
    negative_read_threshold,
    validate_quorums,
    write_set,
)
from streamlib.protocol.recovery_read import (
    EntryRecoveryRead,
    ReadOutcome,
    RecoveryDecision,
    classify_read_status,
    decide,
)
from streamlib.protocol.states import (
    CloseConflictOutcome,
    EnsembleChangeConflictOutcome,
    LedgerEvent,
    LedgerState,
    next_state,
    on_ensemble_change_conflict,
    on_writer_close_conflict,
)
from streamlib.protocol.terms import next_term

__all__ = [
    "AckTracker",
    "CloseConflictOutcome",
    "DigestManager",
    "DigestType",
    "EnsembleChangeConflictOutcome",
    "EnsembleCoverage",
    "EntryRecoveryRead",
    "Fragment",
    "LedgerEvent",
    "LedgerMetadata",
    "LedgerState",
    "PendingAdd",
    "ReadOutcome",
    "RecoveryDecision",
    "classify_read_status",
    "coverage_threshold",
    "covers_by_count",
    "covers_every_ack_quorum",
    "decide",
    "ensemble_write_sets",
    "mac_key",
    "master_key",
    "negative_read_threshold",
    "next_state",
    "next_term",
    "on_ensemble_change_conflict",
    "on_writer_close_conflict",
    "password_hash",
    "validate_quorums",
    "write_set",
]
