"""Carries a protocol state machine's actions over gRPC and the metadata store, and
hands each answer back to the machine's step() as an event (streamlib.protocol.events).
It decides nothing: every branch here is "which I/O does this action mean" or "which
event does this outcome become" (ARCHITECTURE.md §2).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from bookie.wire import bookie_pb2 as pb
from metadata.errors import BadVersionError, MetadataError
from metadata.services.ledgers import LedgerMetadataManager
from streamlib.ledger.bookie_client import AddHandler
from streamlib.ledger.codec import (
    add_body,
    add_prefix,
    entry_from_pb,
    metadata_from_pb,
    metadata_to_pb,
)
from streamlib.ledger.local import LocalTails
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
from streamlib.protocol.events import (
    AddOk,
    AddResults,
    BookiesChosen,
    BookiesUnavailable,
    Event,
    LacResult,
    MetadataConflict,
    MetadataFailed,
    MetadataRead,
    MetadataWritten,
    ReadResult,
)
from streamlib.tasks import HeldTasks

log = logging.getLogger(__name__)


class Sink(Protocol):
    """Where a machine's final outcomes go (a handle)."""

    def on_outcome(self, action: Action) -> None: ...


class Machine(Protocol):
    """A ledger machine of streamlib.protocol (LedgerWriter, LedgerRecovery)."""

    @property
    def metadata(self) -> LedgerMetadata: ...

    def step(self, event: Event) -> list[Action]: ...


class MetadataStoreFailure(StreamlibError):
    """The metadata store failed while the protocol needed it (not a version conflict)."""

    retriable = True


class Context:
    """What drivers share within one client."""

    def __init__(
        self, ledgers: LedgerMetadataManager, pool: BookiePool, placement: PlacementPolicy
    ) -> None:
        self.ledgers = ledgers
        self.pool = pool
        self.placement = placement
        # Writers' acknowledged tails, for readers of the same client (local.py).
        self.local_tails = LocalTails()
        # A writer with nothing in flight tells the bookies its LAC after this long
        # unless an add carries it first (None: at the loop's next turn, handles.py):
        # a broker's, whose consumers read its writes from the local tail.
        self.quiet_lac_s: float | None = None


class Driver:
    def __init__(self, machine: Machine, ledger_id: int, context: Context, sink: Sink) -> None:
        self.machine = machine
        self.ledger_id = ledger_id
        self.context = context
        self.sink = sink
        self._tasks = HeldTasks(f"ledger {ledger_id}")
        # The same entries go to Qw bookies within one step: frame each one once.
        self._pb_cache: dict[tuple[int, int, int], bytes] = {}
        # One answer handler per bookie, so a bookie's response reaches the machine as
        # one input however many sends it answers.
        self._answer_handlers: dict[str, AddHandler] = {}

    def execute(self, actions: list[Action]) -> None:
        reads: dict[tuple[str, bool, bytes, int], list[int]] = {}
        try:
            for action in actions:
                if isinstance(action, ReadEntry):
                    # Reads of one step to one bookie become one range read.
                    group = (action.bookie, action.fence, action.master_key, action.term)
                    reads.setdefault(group, []).append(action.entry_id)
                else:
                    self._execute_one(action)
        finally:
            self._pb_cache.clear()
        for (bookie, fence, master_key, term), entry_ids in reads.items():
            self._tasks.spawn(self._read_entries(bookie, fence, master_key, term, entry_ids))

    def step(self, event: Event) -> None:
        """Hand the machine an answer and carry out what it decides."""
        self.execute(self.machine.step(event))

    def _execute_one(self, action: Action) -> None:
        if isinstance(action, SendAdd):
            self._send_add(action)
        elif isinstance(action, ReadLac):
            self._tasks.spawn(self._read_lac(action))
        elif isinstance(action, ChooseBookies):
            self._tasks.spawn(self._choose(action))
        elif isinstance(action, WriteMetadata):
            self._tasks.spawn(self._write_metadata(action))
        elif isinstance(action, ReadMetadata):
            self._tasks.spawn(self._read_metadata())
        elif isinstance(
            action, CompleteAdds | FailAdds | Closed | CloseFailed | RecoveryDone | RecoveryFailed
        ):
            self.sink.on_outcome(action)
        else:  # pragma: no cover - every action kind must be carried
            raise TypeError(f"no I/O for action {action!r}")

    # -- bookies ------------------------------------------------------------------------

    def _send_add(self, action: SendAdd) -> None:
        cache = self._pb_cache
        framed = []
        nbytes = 0
        prefix = None
        for entry in action.entries:
            key = (id(entry), action.flags, action.term)
            wire = cache.get(key)
            if wire is None:
                if prefix is None:
                    prefix = add_prefix(action)
                wire = cache[key] = prefix + add_body(entry)
            framed.append(wire)
            nbytes += len(wire)
        ledger_id = action.ledger_id
        keys = [(ledger_id, entry.entry_id) for entry in action.entries]
        bookie = action.bookie
        handler = self._answer_handlers.get(bookie)
        if handler is None:

            def on_results(results: list[tuple[int, int | None]]) -> None:
                if any(status is None for _, status in results):
                    self.context.placement.record_failure(bookie)
                self.step(AddResults(bookie, results))

            def on_ok(entry_ids: list[int]) -> None:
                self.step(AddOk(bookie, entry_ids))

            handler = self._answer_handlers[bookie] = AddHandler(on_results, on_ok)
        self.context.pool.get(bookie).add_framed(framed, keys, nbytes, handler)

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
            self.step(LacResult(action.bookie, None))
            return
        self.step(LacResult(action.bookie, response.status, response.last_add_confirmed))

    async def _read_entries(
        self, bookie: str, fence: bool, master_key: bytes, term: int, entry_ids: list[int]
    ) -> None:
        """Range-read entry_ids' span from one bookie and step one answer per entry asked
        for. A bookie may stop a range early (size limit): read on from there."""
        wanted = sorted(set(entry_ids))
        client = self.context.pool.get(bookie)
        while wanted:
            request = pb.ReadRequest(
                ledger_id=self.ledger_id,
                first_entry_id=wanted[0],
                last_entry_id=wanted[-1],
                flags=pb.FENCE if fence else 0,
                master_key=master_key,
                term=term,
            )
            try:
                response = await client.read(request)
            except BookieUnavailableError:
                for entry_id in wanted:
                    self.step(ReadResult(bookie, entry_id, None))
                return
            if response.status != pb.OK:
                for entry_id in wanted:
                    self.step(ReadResult(bookie, entry_id, response.status))
                return
            answered = {r.entry_id: r for r in response.results}
            if not answered:
                for entry_id in wanted:  # a malformed answer is no evidence of absence
                    self.step(ReadResult(bookie, entry_id, pb.IO_ERROR))
                return
            last_answered = max(answered)
            for entry_id in wanted:
                result = answered.get(entry_id)
                if result is not None:
                    entry = entry_from_pb(result.entry) if result.status == pb.OK else None
                    self.step(ReadResult(bookie, entry_id, result.status, entry))
                elif entry_id < last_answered:  # skipped: no evidence either way
                    self.step(ReadResult(bookie, entry_id, None))
            wanted = [e for e in wanted if e > last_answered]

    # -- placement ----------------------------------------------------------------------

    async def _choose(self, action: ChooseBookies) -> None:
        pool, placement = self.context.pool, self.context.placement
        try:
            writable = await pool.writable()
            metadata = self.machine.metadata
            chosen = placement.replacements(
                writable,
                action.count,
                action.exclude,
                metadata.last_fragment.ensemble,
                action.slots,
                metadata.write_quorum,
                pool.racks,
            )
        except StreamlibError as error:
            self.step(BookiesUnavailable(error))
            return
        except MetadataError as error:
            self.step(BookiesUnavailable(MetadataStoreFailure(str(error))))
            return
        await pool.prepare(chosen)
        self.step(BookiesChosen(chosen, int(time.time() * 1000)))

    # -- metadata -----------------------------------------------------------------------

    async def _write_metadata(self, action: WriteMetadata) -> None:
        try:
            version = await self.context.ledgers.write(
                self.ledger_id, metadata_to_pb(action.metadata), action.expected_version
            )
        except BadVersionError:
            self.step(MetadataConflict())
            return
        except MetadataError as error:
            log.warning("ledger %d: metadata write failed: %s", self.ledger_id, error)
            self.step(MetadataFailed(MetadataStoreFailure(str(error))))
            return
        self.step(MetadataWritten(action.metadata, version))

    async def _read_metadata(self) -> None:
        try:
            stored, version = await self.context.ledgers.read(self.ledger_id)
            metadata: LedgerMetadata = metadata_from_pb(stored)
        except MetadataError as error:
            self.step(MetadataFailed(MetadataStoreFailure(str(error))))
            return
        self.step(MetadataRead(metadata, version))

    async def cancel_pending(self) -> None:
        """The machine has finished: drop I/O still in flight (e.g. a read stuck on a
        stopped bookie); its answer could change nothing."""
        await self._tasks.close()
