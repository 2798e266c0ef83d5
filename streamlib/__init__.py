"""streamlib: BookKeeper-style replicated ledgers and unbounded streams.

This package is everything a client runs: the sans-I/O protocol core
(streamlib.protocol), the ledger client, managed streams and the pub/sub API,
auto-recovery, the Spark data source and the command line.

Dependency direction (ARCHITECTURE.md §2): streamlib may import metadata and
bookie.wire (the generated wire code); it must never import the bookie server
(bookie.server, bookie.storage, ...). streamlib.protocol imports nothing of ours.
"""

__version__ = "0.1.0"
