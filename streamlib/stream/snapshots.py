"""State a stream's owner keeps beside the stream in a ledger of its own -- the stream
service's dedup snapshot (streamlib/broker/dedup_store.py), as Pulsar's broker keeps its
dedup snapshot in a cursor's ledger. A metadata node holds at most 1 MiB (every
backend's limit: metadata/paths.py, ZooKeeper's jute.maxbuffer); a ledger holds any size.

Writing: the bytes go into a fresh ledger -- the stream's quorums, a random password of
its own (never an empty one, as the stream's ledgers), tagged SNAPSHOT_OF -- in entries
of at most ENTRY_BYTES, and the ledger is closed. Then the pointer node `<stream>/<what>`
is CAS'd to name it (a Pointer: a few dozen bytes), and only then is the previous
snapshot's ledger deleted. As with retention, a crash in between leaks a ledger, never
leaves a pointer to nothing; the sweeper of leaked ledgers (StreamManager.sweep) deletes
a tagged ledger that no pointer names once it is older than its grace.

Reading: the pointer, then its ledger (opened without recovery, with no password, as a
stream's readers do), checked against the pointer's counts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from dataclasses import dataclass

from metadata.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError
from metadata.services.streams import StreamRegistry
from streamlib.ledger.handles import WriteHandle
from streamlib.ledger.manager import LedgerManager
from streamlib.protocol.errors import NoSuchLedgerError, StreamlibError
from streamlib.stream.positions import MessageId

log = logging.getLogger(__name__)

SNAPSHOT_OF = "snapshot-of"  # custom metadata of a snapshot's ledger: b"<stream>/<what>"
ENTRY_BYTES = 1 << 20  # a snapshot is written in entries of at most this
MAX_BYTES = 64 << 20  # a pointer to a larger snapshot is not followed


class SnapshotUnreadableError(StreamlibError, ValueError):
    """A snapshot's pointer or ledger is not what a snapshot's should be."""


@dataclass(frozen=True)
class Pointer:
    """What the metadata node holds: where the snapshot is, and what it covers."""

    ledger_id: int
    entries: int
    size_bytes: int
    position: MessageId  # the last message of the stream the snapshot covers

    def encode(self) -> bytes:
        return json.dumps({
            "ledger_id": self.ledger_id, "entries": self.entries, "bytes": self.size_bytes,
            "position": list(self.position),
        }).encode()  # fmt: skip

    @classmethod
    def parse(cls, data: bytes) -> Pointer | None:
        """The pointer a node holds; None when the node holds no pointer (an older
        format, with the state inline); SnapshotUnreadableError when it is malformed."""
        try:
            raw = json.loads(data)
        except ValueError:
            return None
        if not isinstance(raw, dict) or "ledger_id" not in raw:
            return None
        try:
            ledger_id, entries, size = (raw[k] for k in ("ledger_id", "entries", "bytes"))
            if not all(type(v) is int for v in (ledger_id, entries, size)):
                raise TypeError("ledger_id, entries and bytes are ints")
            if ledger_id < 0 or not 0 <= size <= MAX_BYTES or not 1 <= entries <= max(1, size):
                raise ValueError("out of range")
            if len(raw["position"]) != 3:
                raise ValueError("a position is [ledger, entry, batch index]")
            position = MessageId(*(int(v) for v in raw["position"])).checked()
        except (ValueError, KeyError, TypeError, StreamlibError) as error:
            raise SnapshotUnreadableError(f"a malformed snapshot pointer: {error}") from None
        return cls(ledger_id, entries, size, position)


def entries_of(data: bytes) -> list[bytes]:
    """The snapshot's bytes as the entries of its ledger (at least one)."""
    return [data[i : i + ENTRY_BYTES] for i in range(0, len(data), ENTRY_BYTES)] or [b""]


def pointer_path(registry: StreamRegistry, stream: str, what: str) -> str:
    return f"{registry.stream_path(stream)}/{what}"


async def read_node(registry: StreamRegistry, stream: str, what: str) -> bytes | None:
    """What the pointer node holds (None: no snapshot was written)."""
    try:
        return (await registry.store.get(pointer_path(registry, stream, what))).data
    except NoNodeError:
        return None


async def read(ledgers: LedgerManager, stream: str, what: str, pointer: Pointer) -> bytes:
    """The snapshot a pointer names (SnapshotUnreadableError, or the ledger's errors)."""
    handle = await ledgers.open(pointer.ledger_id, password=None, recover=False)
    try:
        if handle.metadata.custom_metadata.get(SNAPSHOT_OF) != f"{stream}/{what}".encode():
            raise SnapshotUnreadableError(f"ledger {pointer.ledger_id} is no {what} snapshot")
        if not handle.is_closed or handle.last_entry_id + 1 != pointer.entries:
            raise SnapshotUnreadableError(
                f"ledger {pointer.ledger_id} holds {handle.last_entry_id + 1} entries, "
                f"not the snapshot's {pointer.entries}"
            )
        data = b"".join(await handle.read(0, pointer.entries - 1))
    finally:
        await handle.close()
    if len(data) != pointer.size_bytes:
        raise SnapshotUnreadableError(
            f"ledger {pointer.ledger_id} holds {len(data)} bytes, not {pointer.size_bytes}"
        )
    return data


async def write(
    ledgers: LedgerManager,
    registry: StreamRegistry,
    stream: str,
    what: str,
    data: bytes,
    position: MessageId,
) -> Pointer:
    """Write a snapshot and point `<stream>/<what>` at it (CAS: a pointer that moved
    meanwhile -- another owner's -- fails this one with BadVersionError); then delete
    the snapshot it replaced."""
    store = registry.store
    path = pointer_path(registry, stream, what)
    try:
        stored = await store.get(path)
        version: int | None = stored.version
        previous = _ledger_of(stored.data)
    except NoNodeError:
        version, previous = None, None
    md, _ = await registry.read(stream)
    config = md.ledger_config  # (the stream writer's defaults when unset)
    handle = await ledgers.create(
        config.ensemble_size or 3,
        config.write_quorum or 2,
        config.ack_quorum or 2,
        password=secrets.token_bytes(32),
        custom_metadata={SNAPSHOT_OF: f"{stream}/{what}".encode()},
    )
    entries = entries_of(data)
    try:
        await handle.append_many(entries)
        await handle.close()
    except BaseException:
        await discard_ledger(ledgers, handle.ledger_id, handle)
        raise
    pointer = Pointer(handle.ledger_id, len(entries), len(data), position)
    try:
        if version is None:
            await store.create(path, pointer.encode())
        else:
            await store.set(path, pointer.encode(), version=version)
    except (BadVersionError, NodeExistsError, NoNodeError):
        # Not written, for certain: the ledger is nobody's. (After any other failure the
        # pointer may have been written after all: the ledger is left for the sweeper.)
        await discard_ledger(ledgers, handle.ledger_id)
        raise
    if previous is not None and previous != pointer.ledger_id:
        await discard_ledger(ledgers, previous)
    return pointer


def _ledger_of(node: bytes) -> int | None:
    """The ledger a node's pointer names (None: no pointer, or a malformed one)."""
    with contextlib.suppress(SnapshotUnreadableError):
        pointer = Pointer.parse(node)
        return None if pointer is None else pointer.ledger_id
    return None


async def discard_ledger(
    ledgers: LedgerManager, ledger_id: int, handle: WriteHandle | None = None
) -> None:
    """Delete a ledger nothing points to -- a snapshot's, a compacted view's (what fails
    is left to the sweeper)."""
    try:
        if handle is not None:
            with contextlib.suppress(StreamlibError):
                await handle.close()
        await ledgers.delete(ledger_id)
    except NoSuchLedgerError:
        pass
    except (StreamlibError, MetadataError) as error:
        log.info("ledger %d left for the sweeper: %s", ledger_id, error)


async def is_pointed_at(registry: StreamRegistry, tag: bytes, ledger_id: int) -> bool:
    """Whether the pointer a snapshot ledger's tag names points at it (for the sweeper:
    a tagged ledger no pointer names is a leak). A store that fails raises: never guess
    that a snapshot is a leak."""
    stream, _, what = tag.decode(errors="replace").partition("/")
    try:
        node = await read_node(registry, stream, what)
    except ValueError:  # (a malformed tag -- InvalidNameError, InvalidPathError: no pointer)
        return False
    return node is not None and _ledger_of(node) == ledger_id
