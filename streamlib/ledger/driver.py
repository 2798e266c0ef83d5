"""Carries a protocol state machine's actions over gRPC and the metadata store, and
feeds the outcomes back. It decides nothing: every branch here is "which I/O does this
action mean" or "which input does this outcome become" (ARCHITECTURE.md §2).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from bookie.wire import bookie_pb2 as pb
from metadata.errors import BadVersionError, MetadataError
from metadata.services.ledgers import LedgerMetadataManager
from streamlib.ledger.codec import add_to_pb, entry_from_pb, metadata_from_pb, metadata_to_pb
from streamlib.ledger.placement import PlacementPolicy
from streamlib.ledger.pool import BookiePool
from streamlib.protocol import LedgerMetadata
from streamlib.protocol.actions import (
    Action,
    ChooseBookies,
    Closed,
    CloseFailed,
    CompleteAdds,
    FailAdds,
    ReadEntry,
    ReadLac,
    ReadMetadata,
    RecoveryDone,
    RecoveryFailed,
    SendAdd,
    WriteMetadata,
)
from streamlib.protocol.errors import BookieUnavailableError, StreamlibError

log = logging.getLogger(__name__)


class Sink(Protocol):
    """Where a machine's final outcomes go (a handle)."""

    def on_outcome(self, action: Action) -> None: ...


class MetadataStoreFailure(StreamlibError):
    """The metadata store failed while the protocol needed it (not a version conflict)."""


class Context:
    """What drivers share within one client."""

    def __init__(
        self, ledgers: LedgerMetadataManager, pool: BookiePool, placement: PlacementPolicy
    ) -> None:
        self.ledgers = ledgers
        self.pool = pool
        self.placement = placement


class Driver:
    def __init__(self, machine: Any, ledger_id: int, context: Context, sink: Sink) -> None:
        self.machine = machine
        self.ledger_id = ledger_id
        self.context = context
        self.sink = sink
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_pb: tuple[int, int, int, pb.AddEntry] | None = None

    def execute(self, actions: list[Action]) -> None:
        for action in actions:
            self._execute_one(action)

    def feed(self, method: str, *args: object) -> None:
        self.execute(getattr(self.machine, method)(*args))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _execute_one(self, action: Action) -> None:
        if isinstance(action, SendAdd):
            self._send_add(action)
        elif isinstance(action, ReadLac):
            self._spawn(self._read_lac(action))
        elif isinstance(action, ReadEntry):
            self._spawn(self._read_entry(action))
        elif isinstance(action, ChooseBookies):
            self._spawn(self._choose(action))
        elif isinstance(action, WriteMetadata):
            self._spawn(self._write_metadata(action))
        elif isinstance(action, ReadMetadata):
            self._spawn(self._read_metadata())
        elif isinstance(
            action, CompleteAdds | FailAdds | Closed | CloseFailed | RecoveryDone | RecoveryFailed
        ):
            self.sink.on_outcome(action)
        else:  # pragma: no cover - every action kind must be carried
            raise TypeError(f"no I/O for action {action!r}")

    # -- bookies ------------------------------------------------------------------------

    def _send_add(self, action: SendAdd) -> None:
        # The same entry goes to Qw bookies in a row: build its protobuf once.
        key = (id(action.entry), action.flags, action.term)
        if self._last_pb is not None and self._last_pb[:3] == key:
            message = self._last_pb[3]
        else:
            message = add_to_pb(action)
            self._last_pb = (*key, message)
        entry_id, bookie = action.entry.entry_id, action.bookie

        def answered(status: int | None) -> None:
            if status is None:
                self.context.placement.record_failure(bookie)
            self.feed("on_add_result", bookie, entry_id, status)

        self.context.pool.get(bookie).add(message, answered)

    async def _read_lac(self, action: ReadLac) -> None:
        request = pb.ReadLacRequest(
            ledger_id=action.ledger_id,
            flags=pb.FENCE if action.fence else 0,
            master_key=action.master_key,
            term=action.term,
            previous_lac=-1,
        )
        try:
            response = await self.context.pool.get(action.bookie).read_lac(request)
        except BookieUnavailableError:
            self.feed("on_lac_result", action.bookie, None, -1)
            return
        self.feed("on_lac_result", action.bookie, response.status, response.last_add_confirmed)

    async def _read_entry(self, action: ReadEntry) -> None:
        request = pb.ReadRequest(
            ledger_id=action.ledger_id,
            first_entry_id=action.entry_id,
            last_entry_id=action.entry_id,
            flags=pb.FENCE if action.fence else 0,
            master_key=action.master_key,
            term=action.term,
        )
        try:
            response = await self.context.pool.get(action.bookie).read(request)
        except BookieUnavailableError:
            self.feed("on_read_result", action.bookie, action.entry_id, None, None)
            return
        status: int = response.status
        entry = None
        if status == pb.OK:
            if not response.results:
                status = pb.IO_ERROR  # a malformed answer is no evidence of absence
            else:
                result = response.results[0]
                status = result.status
                if status == pb.OK:
                    entry = entry_from_pb(result.entry)
        self.feed("on_read_result", action.bookie, action.entry_id, status, entry)

    # -- placement ----------------------------------------------------------------------

    async def _choose(self, action: ChooseBookies) -> None:
        pool, placement = self.context.pool, self.context.placement
        try:
            writable = await pool.writable()
            ensemble = getattr(self.machine, "metadata", None)
            chosen = placement.replacements(
                writable,
                action.count,
                action.exclude,
                ensemble.last_fragment.ensemble if ensemble else (),
                action.slots,
                ensemble.write_quorum if ensemble else 0,
                pool.racks,
            )
        except StreamlibError as error:
            self.feed("on_bookies_unavailable", error)
            return
        except MetadataError as error:
            self.feed("on_bookies_unavailable", MetadataStoreFailure(str(error)))
            return
        await pool.prepare(chosen)
        self.feed("on_bookies_chosen", chosen)

    # -- metadata -----------------------------------------------------------------------

    async def _write_metadata(self, action: WriteMetadata) -> None:
        try:
            version = await self.context.ledgers.write(
                self.ledger_id, metadata_to_pb(action.metadata), action.expected_version
            )
        except BadVersionError:
            self.feed("on_metadata_conflict")
            return
        except MetadataError as error:
            log.warning("ledger %d: metadata write failed: %s", self.ledger_id, error)
            self.feed("on_metadata_error", MetadataStoreFailure(str(error)))
            return
        self.feed("on_metadata_written", action.metadata, version)

    async def _read_metadata(self) -> None:
        try:
            stored, version = await self.context.ledgers.read(self.ledger_id)
            metadata: LedgerMetadata = metadata_from_pb(stored)
        except MetadataError as error:
            self.feed("on_metadata_error", MetadataStoreFailure(str(error)))
            return
        self.feed("on_metadata_read", metadata, version)

    async def cancel_pending(self) -> None:
        """The machine has finished: drop I/O still in flight (e.g. a read stuck on a
        stopped bookie); its answer could change nothing."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
