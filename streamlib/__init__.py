"""streamlib: BookKeeper-style replicated ledgers and unbounded streams.

This package is everything a client runs: the sans-I/O protocol core
(streamlib.protocol), the ledger client (streamlib.ledger), managed streams and the
pub/sub API, auto-recovery, the Spark data source and the command line.

    client = await streamlib.Client.connect(uri)      # asyncio
    client = streamlib.connect(uri)                   # scripts: a blocking facade

Dependency direction (ARCHITECTURE.md §2): streamlib may import metadata and
bookie.wire (the generated wire code); it must never import the bookie server
(bookie.server, bookie.storage, ...). streamlib.protocol imports nothing of ours.
"""

from typing import TYPE_CHECKING, Any

import bookie.wire  # noqa: F401  # first: bookie/__init__ sets gRPC's polling before grpc loads

if TYPE_CHECKING:  # what type checkers see; at run time the names load lazily (below)
    from streamlib.client import Client as Client
    from streamlib.stream.batch import Compression as CompressionType
    from streamlib.stream.consumer import DeadLetterPolicy as DeadLetterPolicy
    from streamlib.stream.positions import EARLIEST as EARLIEST
    from streamlib.stream.positions import LATEST as LATEST
    from streamlib.stream.positions import InitialPosition as InitialPosition
    from streamlib.stream.positions import MessageId as MessageId
    from streamlib.stream.subscription import ConsumerType as ConsumerType
    from streamlib.sync import connect as connect

__version__ = "0.1.0"

__all__ = [
    "EARLIEST",
    "LATEST",
    "Client",
    "CompressionType",
    "ConsumerType",
    "DeadLetterPolicy",
    "InitialPosition",
    "MessageId",
    "connect",
]


def __getattr__(name: str) -> Any:
    # Imported lazily so `import streamlib.protocol` (the simulator, the CLI's --help)
    # does not pay for grpc and the metadata backends.
    if name == "Client":
        from streamlib.client import Client

        return Client
    if name == "connect":
        from streamlib.sync import connect

        return connect
    if name == "CompressionType":
        from streamlib.stream.batch import Compression

        return Compression
    if name == "DeadLetterPolicy":
        from streamlib.stream.consumer import DeadLetterPolicy

        return DeadLetterPolicy
    if name == "ConsumerType":
        from streamlib.stream.subscription import ConsumerType

        return ConsumerType
    if name in ("MessageId", "EARLIEST", "LATEST", "InitialPosition"):
        from streamlib.stream import positions

        return getattr(positions, name)
    raise AttributeError(f"module 'streamlib' has no attribute {name!r}")
