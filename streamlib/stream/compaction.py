"""The compactor: writes a stream's compacted view -- the latest message of every key up
to a horizon -- into a ledger of its own and installs it by CAS of the stream's metadata
(the rules and the theory: streamlib/protocol/compaction.py; reading it:
streamlib/stream/compacted.py).

Steps, each a place a compactor may die (``on_step`` is called at each, by name; a
coroutine it returns is awaited):

  ``scanned``    phase one read the previous view and the stream up to the horizon
  ``created``    the view's ledger exists (tagged as the stream's: a leak is swept)
  ``written``    its entries are acknowledged
  ``closed``     it is sealed
  ``installed``  the stream's metadata names it (one CAS)
  ``done``       the previous view's ledger is deleted

Until ``installed`` the previous view stays the stream's and this ledger is nobody's
(the sweeper deletes it after its grace); after it, the previous view's ledger is a
leak until deleted. No step leaves a view naming a ledger that is not there.

One compactor per stream at a time: a compactor holds the ephemeral node
``<stream>/compactor`` (tied to its metadata session) while it works, and names its
ledger there once made. Another is refused (CompactionInProgressError, as Pulsar's 409);
the sweeper of leaked ledgers leaves a ledger its live compactor names alone, however
long the compaction takes; a compactor that died loses the node with its session, and
its ledger is swept. The install is one transaction with a check that the ledger still
exists: a compactor that outlived its session (stopped, then resumed) and had its ledger
swept installs nothing.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from metadata.errors import (
    BadVersionError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    TransactionError,
)
from metadata.schemas import Compaction, Position, StreamMetadata, encode
from metadata.services.streams import StreamRegistry
from metadata.store import CheckVersion, Set
from streamlib.ledger.handles import MAX_ENTRY_BYTES, WriteHandle
from streamlib.ledger.manager import LedgerManager
from streamlib.protocol.compaction import (
    KeptMessages,
    LatestByKey,
    horizon_of,
    kept_indexes,
    kept_runs,
    may_install,
)
from streamlib.protocol.errors import NoSuchLedgerError, StreamlibError, TooLargeError
from streamlib.retry import retry_cas
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import BatchBuilder
from streamlib.stream.compacted import CompactedScanner, View, view_of
from streamlib.stream.message import EntryMessages
from streamlib.stream.positions import EARLIEST, MessageId, describe
from streamlib.stream.snapshots import discard_ledger

log = logging.getLogger(__name__)

COMPACTED_VIEW_OF = "compacted-view-of"  # custom metadata of a view's ledger: the stream
APPEND_BATCH_BYTES = 4 << 20  # compacted entries handed to the ledger at a time (about)


class CompactionSupersededError(StreamlibError):
    """Another compactor installed a view while this one worked, or this one's ledger was
    swept (it outlived its metadata session): this one's is dropped."""


class CompactionInProgressError(StreamlibError):
    """Another compactor is compacting the stream now (its node: compactor_path)."""


def compactor_path(registry: StreamRegistry, stream: str) -> str:
    return f"{registry.stream_path(stream)}/compactor"


async def compacting_ledger(registry: StreamRegistry, stream: str) -> int | None:
    """The ledger the stream's live compactor is writing (None: no compactor, or it has
    made none yet): the sweeper leaves it alone."""
    try:
        node = await registry.store.get(compactor_path(registry, stream))
    except NoNodeError:
        return None
    try:
        found = json.loads(node.data).get("ledger_id")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, int) and found >= 0 else None


@dataclass(frozen=True)
class CompactionResult:
    """What one compaction did. compacted False: there was nothing new to compact (the
    installed view already reaches the end of the stream), and nothing was written."""

    stream: str
    compacted: bool
    ledger_id: int  # the installed view's ledger (-1: none)
    horizon: str  # describe() of the horizon
    keys: int
    entries: int
    size_bytes: int
    read_messages: int  # messages phase one read (the previous view's and the new ones)
    replaced_ledger: int  # the previous view's ledger (-1: none)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


Step = Callable[[str], object]


class Compactor:
    """Compacts streams; one compaction per call of compact()."""

    def __init__(self, ledgers: LedgerManager, registry: StreamRegistry) -> None:
        self._ledgers = ledgers
        self._registry = registry

    async def compact(self, name: str, *, on_step: Step | None = None) -> CompactionResult:
        """Compact `name` up to the end of the stream confirmed now (see the module's
        steps). CompactionSupersededError if another compactor's view came first."""

        async def step(name: str) -> None:
            if on_step is not None and inspect.isawaitable(outcome := on_step(name)):
                await outcome

        md, _ = await self._registry.read(name)
        previous = view_of(md)
        scanner = CompactedScanner(self._ledgers, self._registry, name, EARLIEST, tail=False)
        end = await scanner.end_position()
        if end == EARLIEST or (previous is not None and end <= previous.horizon):
            return self._unchanged(name, previous)
        node = _Node(self._registry, name)
        try:
            await node.take()
        except NodeExistsError:
            raise CompactionInProgressError(
                f"stream {name!r} is being compacted by another compactor now; try again "
                "when it is done"
            ) from None
        try:
            return await self._compact(name, md, previous, end, step, node)
        finally:
            with contextlib.suppress(MetadataError, StreamlibError):
                await node.release()

    async def _compact(
        self,
        name: str,
        md: StreamMetadata,
        previous: View | None,
        end: MessageId,
        step: Callable[[str], Awaitable[None]],
        node: _Node,
    ) -> CompactionResult:
        latest, horizon, read = await self._phase_one(name, end)
        await step("scanned")
        if horizon == EARLIEST or (previous is not None and horizon <= previous.horizon):
            return self._unchanged(name, previous)
        kept = latest.kept()
        config = md.ledger_config
        handle = await self._ledgers.create(
            config.ensemble_size or 3,
            config.write_quorum or 2,
            config.ack_quorum or 2,
            password=secrets.token_bytes(32),
            custom_metadata={"stream": name.encode(), COMPACTED_VIEW_OF: name.encode()},
        )
        try:  # (the sweeper leaves it alone while this compactor's node names it)
            await node.name(handle.ledger_id)
        except BaseException:
            await discard_ledger(self._ledgers, handle.ledger_id, handle)
            raise
        await step("created")
        try:
            entries, size = await self._phase_two(name, horizon, kept, handle)
            await step("written")
            await handle.close()
        except BaseException:
            await discard_ledger(self._ledgers, handle.ledger_id, handle)
            raise
        await step("closed")
        view = Compaction(
            ledger_id=handle.ledger_id,
            horizon=Position(
                ledger_id=horizon.ledger_id, entry_id=horizon.entry_id,
                batch_index=horizon.batch_index,
            ),
            entries=entries, keys=kept.keys, size_bytes=size,
            compacted_time_ms=int(time.time() * 1000),
        )  # fmt: skip
        started_from = None if previous is None else previous.ledger_id
        try:
            await self._install(name, view, started_from)
        except CompactionSupersededError:
            await discard_ledger(self._ledgers, handle.ledger_id)
            raise
        await step("installed")
        if previous is not None:
            await discard_ledger(self._ledgers, previous.ledger_id)
        await step("done")
        log.info(
            "stream %s compacted up to %s: %d keys in ledger %d (%d entries, %d bytes)",
            name, describe(horizon), kept.keys, handle.ledger_id, entries, size,
        )  # fmt: skip
        return CompactionResult(
            name, True, handle.ledger_id, describe(horizon), kept.keys, entries, size, read,
            -1 if previous is None else previous.ledger_id,
        )  # fmt: skip

    @staticmethod
    def _unchanged(name: str, view: View | None) -> CompactionResult:
        if view is None:
            return CompactionResult(name, False, -1, describe(EARLIEST), 0, 0, 0, 0, -1)
        return CompactionResult(
            name, False, view.ledger_id, describe(view.horizon), -1, view.entries, -1, 0, -1
        )

    async def _phase_one(self, name: str, end: MessageId) -> tuple[LatestByKey, MessageId, int]:
        """Every key's latest position up to `end`, the horizon, and the messages read."""
        latest = LatestByKey()
        scanner = CompactedScanner(self._ledgers, self._registry, name, EARLIEST, tail=False)
        scanner.until = end
        pieces: list[EntryMessages] = []  # a chunked message's pieces so far
        read = 0
        async for batch in scanner.batches():
            chunk = batch.chunk
            if pieces and (chunk is None or chunk.uuid != pieces[0].chunk.uuid  # type: ignore[union-attr]
                           or chunk.index != len(pieces)):  # fmt: skip
                pieces = []  # unfinished: its producer went away mid-message
            if chunk is not None:
                if chunk.index != len(pieces):
                    continue  # a piece without its start (compacted out, or cut by retention)
                pieces.append(batch)
                if len(pieces) == chunk.count:
                    first = pieces[0]
                    whole = sum(len(p.payloads[0]) for p in pieces)
                    latest.observe_chunked(
                        _key(first, 0), [(p.ledger_id, p.entry_id) for p in pieces], whole == 0
                    )
                    read += 1
                    pieces = []
                continue
            for index in range(batch.start, len(batch.payloads)):
                latest.observe(
                    _key(batch, index),
                    (batch.ledger_id, batch.entry_id, index),
                    not batch.payloads[index],
                )
            read += len(batch)
        unfinished = None if not pieces else pieces[0].previous
        return latest, MessageId(*horizon_of(end, unfinished)), read

    async def _phase_two(
        self, name: str, horizon: MessageId, kept: KeptMessages, handle: WriteHandle
    ) -> tuple[int, int]:
        """Write the kept messages, entry by entry; (entries, bytes) written."""
        scanner = CompactedScanner(self._ledgers, self._registry, name, EARLIEST, tail=False)
        scanner.until = horizon
        pending: list[bytes] = []
        pending_bytes = entries = size = 0
        async for batch in scanner.batches():
            indexes = kept_indexes(
                kept,
                batch.ledger_id, batch.entry_id, len(batch.payloads), batch.chunk is not None,
            )  # fmt: skip
            for run in kept_runs(i for i in indexes if i >= batch.start):
                for data in _compacted_entries(batch, run.first, run.last):
                    pending.append(data)
                    pending_bytes += len(data)
            if pending_bytes >= APPEND_BATCH_BYTES:
                await handle.append_many(pending)
                entries, size = entries + len(pending), size + pending_bytes
                pending, pending_bytes = [], 0
        if pending:
            await handle.append_many(pending)
            entries, size = entries + len(pending), size + pending_bytes
        return entries, size

    async def _install(self, name: str, view: Compaction, started_from: int | None) -> None:
        registry = self._registry

        async def attempt() -> None:
            md, version = await registry.read(name)
            installed = view_of(md)
            if not may_install(None if installed is None else installed.ledger_id, started_from):
                raise CompactionSupersededError(
                    f"stream {name!r}: another compactor installed view ledger "
                    f"{installed.ledger_id if installed else -1} meanwhile; this one is dropped"
                )
            md.compaction.CopyFrom(view)
            try:  # (with its ledger still there: never a view naming a swept one)
                ledger_node = await self._ledgers.metadata_node(view.ledger_id)
                await registry.store.transaction([
                    CheckVersion(*ledger_node),
                    Set(registry.stream_path(name), encode(md), version),
                ])  # fmt: skip
            except (NoSuchLedgerError, TransactionError) as failed:
                if isinstance(failed, NoSuchLedgerError) or (
                    failed.index == 0 and isinstance(failed.cause, NoNodeError)
                ):
                    raise CompactionSupersededError(
                        f"stream {name!r}: view ledger {view.ledger_id} was swept before it "
                        "was installed (this compactor outlived its metadata session)"
                    ) from None
                if isinstance(failed.cause, BadVersionError):  # (either moved: again)
                    raise BadVersionError(f"stream {name!r} or its view moved on") from None
                raise failed.cause from None

        await retry_cas(f"stream {name!r}: installing its compacted view", attempt)


class _Node:
    """A compactor's ephemeral node: its token and the ledger it writes (-1: none made
    yet). Touched only while it holds this compactor's token, at the version read: a
    compactor that outlived its session (stopped, then resumed) finds another's node
    there, leaves it alone, and gives way."""

    def __init__(self, registry: StreamRegistry, stream: str) -> None:
        self.path = compactor_path(registry, stream)
        self.stream = stream
        self._store = registry.store
        self._token = uuid.uuid4().hex

    def _data(self, ledger_id: int) -> bytes:
        return json.dumps({"token": self._token, "ledger_id": ledger_id}).encode()

    async def take(self) -> None:
        await self._store.create(self.path, self._data(-1), ephemeral=True)

    async def _version(self) -> int | None:
        """The node's version while it is this compactor's (None: it is not)."""
        try:
            stored = await self._store.get(self.path)
        except NoNodeError:
            return None
        try:
            mine = json.loads(stored.data).get("token") == self._token
        except (ValueError, AttributeError):
            mine = False
        return stored.version if mine else None

    async def name(self, ledger_id: int) -> None:
        version = await self._version()
        try:
            if version is None:
                raise BadVersionError("not this compactor's node")
            await self._store.set(self.path, self._data(ledger_id), version=version)
        except (BadVersionError, NoNodeError):
            raise CompactionSupersededError(
                f"stream {self.stream!r}: this compactor lost its node (its metadata "
                "session ended): it gives way"
            ) from None

    async def release(self) -> None:
        version = await self._version()
        if version is not None:
            with contextlib.suppress(BadVersionError, NoNodeError):
                await self._store.delete(self.path, version=version)


def _key(batch: EntryMessages, index: int) -> str | None:
    metadata = batch.metadata
    if metadata is None:
        return None
    mine = metadata[index]
    return mine.key if mine.HasField("key") else None


def _compacted_entries(batch: EntryMessages, first: int, last: int) -> list[bytes]:
    """Messages first..last of a stream entry as compacted entries (one, unless it would
    be over the entry limit: then the run is split)."""
    builder = BatchBuilder()
    for _ in range(first):  # placeholders: every message keeps its index
        builder.add(b"", 0)
    for i in range(first, last + 1):
        batch.add_to(builder, i)
    inner = builder.encode() if batch.chunk is None else builder.encode_piece(batch.chunk)
    stored = envelope.CompactedEntry(
        ledger_id=batch.ledger_id, entry_id=batch.entry_id, first_index=first, batch=inner
    ).SerializeToString()
    if len(stored) <= MAX_ENTRY_BYTES:
        return [stored]
    if first == last:
        raise TooLargeError(
            f"stream {batch.stream!r} message {batch.ledger_id}:{batch.entry_id}:{first} "
            f"does not fit a compacted entry ({len(stored)} bytes)"
        )
    middle = (first + last) // 2
    return _compacted_entries(batch, first, middle) + _compacted_entries(batch, middle + 1, last)
