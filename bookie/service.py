"""The gRPC service: the wire protocol (bookie/wire/bookie.proto) over LedgerStorage.

The add stream reads batches and answers them asynchronously: each accepted batch
is journaled as one unit and ONE done-callback on the commit group's future queues
its results; a per-stream writer task merges everything queued into one
AddResponse per write. Nothing on the hot path awaits per entry.

Requests are deserialized by our own handlers (not the generated registration) so
a malformed message becomes a typed BAD_REQUEST answer instead of a bare gRPC
INTERNAL error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from bookie import validation
from bookie.errors import (
    BadRequestError,
    NoSuchEntryError,
    NoSuchLedgerError,
    RequestError,
    StorageIOError,
)
from bookie.index import LedgerState
from bookie.journal import JournalPosition
from bookie.metrics import BookieMetrics
from bookie.records import FRAME_SIZE, EntryHeader, StoredEntry, frame_header
from bookie.storage import Cached, LedgerStorage
from bookie.wire import bookie_pb2 as pb

DEFAULT_READ_MAX_BYTES = 16 << 20
SERVICE_NAME = "streamlib.bookie.v1.Bookie"


class Malformed:
    """Stands in for a request whose bytes did not parse."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _safe_parse(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except (DecodeError, ValueError) as e:
            return Malformed(e)

    return parse


class BookieService:
    def __init__(
        self,
        storage: LedgerStorage,
        metrics: BookieMetrics,
        *,
        max_entry_bytes: int,
        is_read_only: Callable[[], bool],
        bookie_info: Callable[[], pb.GetBookieInfoResponse],
    ) -> None:
        self.storage = storage
        self.metrics = metrics
        self.max_entry_bytes = max_entry_bytes
        self.is_read_only = is_read_only
        self.bookie_info = bookie_info

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Any, req: Any, resp: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=_safe_parse(req),
                response_serializer=resp.SerializeToString,
            )

        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "AddStream": grpc.stream_stream_rpc_method_handler(
                    self.AddStream,
                    request_deserializer=_safe_parse(pb.AddRequest),
                    response_serializer=bytes,  # the stream writes pre-serialized AddResponses
                ),
                "ReadEntries": unary(self.ReadEntries, pb.ReadRequest, pb.ReadResponse),
                "ReadLac": unary(self.ReadLac, pb.ReadLacRequest, pb.ReadLacResponse),
                "WriteLac": unary(self.WriteLac, pb.WriteLacRequest, pb.WriteLacResponse),
                "Force": unary(self.Force, pb.ForceRequest, pb.ForceResponse),
                "GetBookieInfo": unary(
                    self.GetBookieInfo, pb.GetBookieInfoRequest, pb.GetBookieInfoResponse
                ),
            },
        )

    # -- the add stream -------------------------------------------------------------------

    async def AddStream(
        self, requests: AsyncIterator[pb.AddRequest | Malformed], context: Any
    ) -> None:
        # Serialized AddResponse messages; concatenated they form one valid AddResponse
        # (repeated fields merge), so the writer sends everything queued in one message.
        queued: list[bytes] = []
        ready = asyncio.Event()
        in_flight = 0
        reading = True

        def answer(results: list[pb.AddResult]) -> None:
            queued.append(pb.AddResponse(results=results).SerializeToString())
            ready.set()

        async def writer() -> None:
            while True:
                await ready.wait()
                ready.clear()
                if queued:
                    data = b"".join(queued)
                    queued.clear()
                    await context.write(data)
                if not reading and in_flight == 0 and not queued:
                    return

        def on_durable(
            accepted: list[Cached], started: float, fut: asyncio.Future[JournalPosition]
        ) -> None:
            nonlocal in_flight
            in_flight -= 1
            error = fut.exception()
            resp = pb.AddResponse()
            add = resp.results.add
            if error is not None:
                msg = f"journal write failed: {error}"
                for e, _, _ in accepted:
                    add(ledger_id=e.ledger_id, entry_id=e.entry_id, status=pb.IO_ERROR, message=msg)
                self.metrics.add_errors.labels("IO_ERROR").inc(len(accepted))
            else:
                # One packed id list per ledger (a batch is mostly one ledger's entries).
                lid = -1
                ids: list[int] = []
                for e, _, _ in accepted:
                    if e.ledger_id != lid:
                        if ids:
                            resp.ok.add(ledger_id=lid, entry_ids=ids)
                        lid, ids = e.ledger_id, []
                    ids.append(e.entry_id)
                if ids:
                    resp.ok.add(ledger_id=lid, entry_ids=ids)
                self.metrics.adds.inc(len(accepted))
                self.metrics.add_latency.observe(time.perf_counter() - started)
            queued.append(resp.SerializeToString())
            ready.set()

        write_task = asyncio.get_running_loop().create_task(writer())
        try:
            async for req in requests:
                started = time.perf_counter()
                if isinstance(req, Malformed):
                    answer(
                        [_bad_add(-1, -1, BadRequestError(f"malformed AddRequest: {req.error}"))]
                    )
                    continue
                accepted, chunks, nbytes, refused = self._check_adds(req)
                if refused:
                    answer(refused)
                if accepted:
                    in_flight += 1
                    fut = self.storage.submit(accepted, chunks, nbytes)
                    fut.add_done_callback(
                        lambda f, a=accepted, s=started: on_durable(a, s, f)  # type: ignore[misc]
                    )
            reading = False
            ready.set()
            await write_task
        finally:
            write_task.cancel()

    def _check_adds(
        self, req: pb.AddRequest
    ) -> tuple[list[Cached], list[bytes], int, list[pb.AddResult]]:
        read_only = self.is_read_only()
        max_entry_bytes = self.max_entry_bytes
        check_add = self.storage.check_add
        accepted: list[Cached] = []
        chunks: list[bytes] = []
        refused: list[pb.AddResult] = []
        nbytes = 0
        accepted_like: tuple[int, bytes, int, int] | None = None
        for ae in req.entries:
            # Each message field read is a call (and a copy for bytes): read only the few
            # the rules need, and let protobuf serialize the record body in C (measured:
            # cheaper than slicing the request's own bytes in Python).
            h = EntryHeader(
                ae.ledger_id, ae.entry_id, ae.last_add_confirmed, ae.flags, ae.term, ae.master_key
            )
            if h.flags & pb.RECOVERY_ADD:
                # A request-only bit: the stored entry is the writer's, byte for byte, so
                # a recovered or re-replicated copy reads back identical to the original.
                ae.flags = h.flags & ~pb.RECOVERY_ADD
            body = ae.SerializeToString()
            try:
                validation.check_add(h, ae, len(body), max_entry_bytes)
                # The ledger-state rules depend only on (ledger, key, flags, term) and on
                # state no await can change within this loop: an entry like the one just
                # accepted is accepted for the same reasons (a batch is mostly one ledger).
                signature = (h.ledger_id, h.master_key, h.flags, h.term)
                if signature != accepted_like:
                    check_add(h, read_only=read_only)
                    accepted_like = signature
            except RequestError as err:
                refused.append(_bad_add(h.ledger_id, h.entry_id, err))
                self.metrics.add_errors.labels(pb.StatusCode.Name(err.status)).inc()
                continue
            head = frame_header(body)
            accepted.append((h, head, body))
            chunks.append(head)
            chunks.append(body)
            nbytes += FRAME_SIZE + len(body)
        self.metrics.add_bytes.inc(nbytes)
        return accepted, chunks, nbytes, refused

    # -- reads ----------------------------------------------------------------------------

    async def _state_for_read(
        self, fence: bool, req: pb.ReadRequest | pb.ReadLacRequest
    ) -> LedgerState:
        """A fencing read fences (durably, first); a term read adopts the term; a plain
        read needs the ledger to be known here."""
        if fence:
            return await self.storage.fence(req.ledger_id, req.master_key, req.term)
        if req.term:
            return await self.storage.adopt_term(req.ledger_id, req.master_key, req.term)
        return self._known(req.ledger_id)

    async def ReadEntries(self, req: pb.ReadRequest | Malformed, context: Any) -> pb.ReadResponse:
        started = time.perf_counter()
        if isinstance(req, Malformed):
            return pb.ReadResponse(
                status=pb.BAD_REQUEST, message=f"malformed ReadRequest: {req.error}"
            )
        try:
            st = await self._state_for_read(validation.check_read(req), req)
        except RequestError as err:
            return pb.ReadResponse(status=err.status, message=str(err), term=err.term)
        max_bytes = min(req.max_bytes or DEFAULT_READ_MAX_BYTES, DEFAULT_READ_MAX_BYTES)
        results = []
        total = 0
        for eid in range(req.first_entry_id, req.last_entry_id + 1):
            try:
                e = self.storage.read_entry(req.ledger_id, eid)
            except (NoSuchEntryError, NoSuchLedgerError) as err:
                results.append(
                    pb.EntryResult(entry_id=eid, status=pb.NO_SUCH_ENTRY, message=str(err))
                )
                continue
            except StorageIOError as err:
                results.append(pb.EntryResult(entry_id=eid, status=pb.IO_ERROR, message=str(err)))
                continue
            if results and total + len(e.payload) > max_bytes:
                break
            total += len(e.payload)
            results.append(pb.EntryResult(entry_id=eid, status=pb.OK, entry=_entry_pb(e)))
        self.metrics.reads.inc(len(results))
        self.metrics.read_bytes.inc(total)
        self.metrics.read_latency.observe(time.perf_counter() - started)
        return pb.ReadResponse(
            status=pb.OK, results=results, last_add_confirmed=st.lac, term=st.term
        )

    async def ReadLac(self, req: pb.ReadLacRequest | Malformed, context: Any) -> pb.ReadLacResponse:
        if isinstance(req, Malformed):
            return pb.ReadLacResponse(
                status=pb.BAD_REQUEST, message=f"malformed ReadLacRequest: {req.error}"
            )
        try:
            st = await self._state_for_read(validation.check_read_lac(req), req)
            lac = st.lac
            if req.timeout_ms > 0 and lac <= req.previous_lac:
                timeout_s = min(req.timeout_ms / 1000, validation.MAX_LONG_POLL_S)
                lac = await self.storage.wait_for_lac(req.ledger_id, req.previous_lac, timeout_s)
                st = self.storage.state(req.ledger_id) or st
        except RequestError as err:
            return pb.ReadLacResponse(status=err.status, message=str(err), term=err.term)
        resp = pb.ReadLacResponse(
            status=pb.OK, last_add_confirmed=lac, fenced=st.fenced, term=st.term
        )
        if req.piggyback_entry and lac > req.previous_lac:
            try:
                resp.next_entry.CopyFrom(
                    _entry_pb(self.storage.read_entry(req.ledger_id, req.previous_lac + 1))
                )
            except RequestError:
                pass  # the entry is optional; the client reads it normally
        return resp

    async def WriteLac(
        self, req: pb.WriteLacRequest | Malformed, context: Any
    ) -> pb.WriteLacResponse:
        if isinstance(req, Malformed):
            return pb.WriteLacResponse(
                status=pb.BAD_REQUEST, message=f"malformed WriteLacRequest: {req.error}"
            )
        try:
            validation.check_write_lac(req)
            await self.storage.write_lac(
                req.ledger_id, req.master_key, req.last_add_confirmed, req.term
            )
        except RequestError as err:
            return pb.WriteLacResponse(status=err.status, message=str(err))
        return pb.WriteLacResponse(status=pb.OK)

    async def Force(self, req: pb.ForceRequest | Malformed, context: Any) -> pb.ForceResponse:
        # Every acknowledged add is already fsync'd in the journal; Force is a barrier
        # that only has to report the LAC.
        if isinstance(req, Malformed):
            return pb.ForceResponse(
                status=pb.BAD_REQUEST, message=f"malformed ForceRequest: {req.error}"
            )
        try:
            validation.check_ledger_id(req.ledger_id)
            lac = self.storage.lac(req.ledger_id)
        except RequestError as err:
            return pb.ForceResponse(status=err.status, message=str(err))
        return pb.ForceResponse(status=pb.OK, last_add_confirmed=lac)

    async def GetBookieInfo(self, req: Any, context: Any) -> pb.GetBookieInfoResponse:
        if isinstance(req, Malformed):
            return pb.GetBookieInfoResponse(
                status=pb.BAD_REQUEST, message=f"malformed request: {req.error}"
            )
        return self.bookie_info()

    def _known(self, ledger_id: int) -> LedgerState:
        st = self.storage.state(ledger_id)
        if st is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
        return st


def _bad_add(ledger_id: int, entry_id: int, err: RequestError) -> pb.AddResult:
    return pb.AddResult(
        ledger_id=ledger_id, entry_id=entry_id, status=err.status, term=err.term, message=str(err)
    )


def _entry_pb(e: StoredEntry) -> pb.Entry:
    return pb.Entry(
        ledger_id=e.ledger_id,
        entry_id=e.entry_id,
        last_add_confirmed=e.last_add_confirmed,
        payload=e.payload,
        digest=e.digest,
        flags=e.flags,
        length=e.length,
        term=e.term,
    )
