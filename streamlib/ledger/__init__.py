"""The ledger client: create / open / recover / append / read / LAC / tail / close /
delete, the thin asyncio + gRPC layer that drives the protocol state machines of
streamlib.protocol (it carries their actions; it does not re-decide them).

May import: streamlib.protocol, metadata, bookie.wire. Must never import the bookie
server or the stream layer above it.
"""

from streamlib.ledger.handles import ReadHandle, WriteHandle
from streamlib.ledger.manager import LedgerManager

__all__ = ["LedgerManager", "ReadHandle", "WriteHandle"]
