"""Auto-recovery (ARCHITECTURE.md §6, autorecovery.txt): the elected auditor that marks
under-replicated ledgers, the replication workers that repair them, the daemon that
runs both, and the admin operations (status, enable/disable, audit-now, recover,
decommission). The decisions themselves live in streamlib.protocol.replication.

Must never import: the bookie server (bookie.server, bookie.storage, ...); only the
generated wire code (bookie.wire), like the rest of streamlib.
"""
