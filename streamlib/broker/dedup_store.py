"""Where a stream's dedup state (dedup.py) waits for the stream's next owner: a snapshot
in a ledger of its own, named by the small node `<stream>/dedup`
(streamlib/stream/snapshots.py) -- so the state may outgrow the metadata store's 1 MiB
node limit (thousands of long producer names) without failing.

A node written before snapshots moved to ledgers holds the snapshot itself; it is still
read. Anything unreadable -- the pointer, its ledger -- is read as no snapshot: the new
owner's tail scan then starts at the stream's beginning, and rebuilds the same state.
"""

from __future__ import annotations

import logging
from typing import Any

from metadata.errors import MetadataError
from streamlib.broker.dedup import INACTIVITY_TIMEOUT_S, Dedup
from streamlib.protocol.errors import StreamlibError
from streamlib.stream import snapshots

log = logging.getLogger(__name__)

WHAT = "dedup"  # the pointer node's name beside the stream


async def load(
    client: Any, stream: str, inactivity_timeout_s: float = INACTIVITY_TIMEOUT_S
) -> Dedup | None:
    """The state the stream's last snapshot holds; None when there is none, or it cannot
    be read. (A metadata store that fails raises, as the takeover's other reads.)"""
    registry = client.streams.registry
    node = await snapshots.read_node(registry, stream, WHAT)
    if node is None:
        return None
    try:
        pointer = snapshots.Pointer.parse(node)
        if pointer is None:  # the older format: the snapshot inline
            return Dedup.restore(node, inactivity_timeout_s)
        data = await snapshots.read(client.ledgers, stream, WHAT, pointer)
    except (StreamlibError, MetadataError, ValueError) as error:
        log.warning("stream %s: dedup snapshot unreadable, scanning the stream: %s", stream, error)
        return None
    dedup = Dedup.restore(data, inactivity_timeout_s)
    log.info(
        "stream %s: dedup state of %d names up to %s restored from snapshot ledger %d "
        "(%d bytes)", stream, dedup.names_known, dedup.position, pointer.ledger_id, len(data),
    )  # fmt: skip
    return dedup


async def save(client: Any, stream: str, dedup: Dedup) -> None:
    """Snapshot the state as it is now (before this awaits anything) for the next owner."""
    data, position = dedup.snapshot(), dedup.position
    pointer = await snapshots.write(
        client.ledgers, client.streams.registry, stream, WHAT, data, position
    )
    log.debug("stream %s: dedup snapshot of %d bytes in ledger %d", stream, len(data),
              pointer.ledger_id)  # fmt: skip
