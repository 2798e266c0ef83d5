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

import os as _os
import sys as _sys

# gRPC core experiments turned off in every process that imports bookie or streamlib
# (before grpc loads; GRPC_EXPERIMENTS already set, even empty, is left alone). Without
# the EventEngine client and listener, the thread that polls the completion queue also
# reads the sockets: a message reaches the event loop in one thread hop instead of two.
# Measured on a 2-core machine, one add in flight to three bookies: about 0.1 ms and a
# sixth of the CPU per add less on each side. Only for the grpcio versions tested with
# it (a later one may no longer know these names, and would log an error for each).
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
GRPC_VERSIONS_TESTED = ("1.85.",)


def _grpc_version() -> str:
    """The installed grpcio's version, read without importing grpc (which would load
    gRPC core with the settings of the moment)."""
    from importlib.util import find_spec

    spec = find_spec("grpc")
    if spec is None or spec.origin is None:
        return ""
    try:
        with open(_os.path.join(_os.path.dirname(spec.origin), "_grpcio_metadata.py")) as f:
            text = f.read()
    except OSError:
        return ""
    return text.partition('"""')[2].partition('"""')[0]


def _prefer_grpc_polling() -> None:
    if "grpc" in _sys.modules or "GRPC_EXPERIMENTS" in _os.environ:
        return  # too late to matter, or the user's choice
    if _grpc_version().startswith(GRPC_VERSIONS_TESTED):
        _os.environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS


_prefer_grpc_polling()
