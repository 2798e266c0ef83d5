"""The bookie: the storage server that keeps ledger entries durably.

A bookie receives entries on a bidirectional gRPC add stream (``bookie.wire``),
makes them durable in a group-committed journal, keeps them in entry logs with an
LMDB index, and serves reads, LAC queries, fencing and term checks. It registers
itself in the metadata store's bookie registry, guards its identity with a cookie,
turns read-only when its disks fill, garbage-collects deleted ledgers and exports
Prometheus metrics. Start one with ``bookie serve``.

Dependency rule: ``bookie`` may import ``metadata`` (and the standard library and
third-party packages) but must NEVER import ``streamlib``: clients depend on the
bookie's wire protocol, not the other way round.
"""
