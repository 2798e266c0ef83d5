"""The gRPC service: the wire protocol (bookie/wire/bookie.proto) over LedgerStorage.

The add stream reads batches and answers them asynchronously: each accepted batch
is journaled as one unit and ONE done-callback on the commit group's future queues
its results; a per-stream writer task merges what is queued into few AddResponses.
Nothing on the hot path awaits per entry. A stream whose client does not read its
answers, or that has too many bytes waiting for the journal, stops reading requests until
it is back under its limits: a bookie's memory does not depend on its clients' manners.
Range reads that need the disk run in worker threads (LedgerStorage.read_entries).

Requests are deserialized by our own handlers (not the generated registration) so
a malformed message becomes a typed BAD_REQUEST answer instead of a bare gRPC
INTERNAL error.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from bookie import validation
from bookie.auth import AccessControl
from bookie.errors import (
    BadRequestError,
    NoSuchEntryError,
    NoSuchLedgerError,
    RequestError,
)
from bookie.journal import JournalPosition
from bookie.ledger_rules import Access, Copy, LedgerState
from bookie.metrics import BookieMetrics
from bookie.records import FRAME_SIZE, EntryHeader, StoredEntry, frame_header
from bookie.storage import Cached, LedgerStorage
from bookie.wire import bookie_pb2 as pb

DEFAULT_READ_MAX_BYTES = 16 << 20
# Per add stream: answers queued for a client that does not read them, and record bytes
# accepted into the journal but not yet durable. Past either, the stream stops reading
# requests until it is back under (see AddStream).
DEFAULT_MAX_STREAM_ANSWER_BYTES = 4 << 20
DEFAULT_MAX_STREAM_INFLIGHT_BYTES = 64 << 20
ANSWER_MESSAGE_BYTES = 1 << 20
# Entries a long poll's answer carries after the first (bounded whatever a client asks).
MAX_PIGGYBACK_ENTRIES = 64
MAX_PIGGYBACK_BYTES = 1 << 20
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
        max_stream_answer_bytes: int = DEFAULT_MAX_STREAM_ANSWER_BYTES,
        max_stream_inflight_bytes: int = DEFAULT_MAX_STREAM_INFLIGHT_BYTES,
        access: AccessControl | None = None,
    ) -> None:
        self.storage = storage
        self.access = access or AccessControl(metrics)
        self.metrics = metrics
        self.max_entry_bytes = max_entry_bytes
        self.max_stream_answer_bytes = max_stream_answer_bytes
        self.max_stream_inflight_bytes = max_stream_inflight_bytes
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
        # (repeated fields merge), so the writer sends what is queued in few messages.
        queued: list[bytes] = []
        ready = asyncio.Event()
        in_flight = 0
        reading = True
        # Back-pressure. A client that sends and never reads would otherwise grow the
        # answers queued here (a refusal is about as big as the entry refused) and the
        # journal's queue without bound. So the stream pulls the next request only while
        # both are under their limits; HTTP/2 flow control then stops the client. It
        # cannot deadlock: journal commits always finish and the writer keeps draining,
        # and each sets ``drained``; a writer that died sets it too.
        max_answer_bytes = self.max_stream_answer_bytes
        max_inflight_bytes = self.max_stream_inflight_bytes
        answer_bytes = 0  # queued or being written
        inflight_bytes = 0  # accepted into the journal, not yet durable
        drained = asyncio.Event()

        def enqueue(data: bytes) -> None:
            nonlocal answer_bytes
            queued.append(data)
            answer_bytes += len(data)
            ready.set()

        def answer(results: list[pb.AddResult]) -> None:
            enqueue(pb.AddResponse(results=results).SerializeToString())

        async def writer() -> None:
            nonlocal answer_bytes
            try:
                while True:
                    await ready.wait()
                    ready.clear()
                    while queued:
                        # Several answers per message, but not past ANSWER_MESSAGE_BYTES
                        # (unless one answer is bigger): the join is a copy, and gRPC
                        # refuses messages past its size limit.
                        n, size = 1, len(queued[0])
                        while n < len(queued) and size + len(queued[n]) <= ANSWER_MESSAGE_BYTES:
                            size += len(queued[n])
                            n += 1
                        data = b"".join(queued[:n])
                        del queued[:n]
                        await context.write(data)
                        answer_bytes -= size
                        drained.set()
                    if not reading and in_flight == 0 and not queued:
                        return
            finally:
                drained.set()

        def on_durable(
            accepted: list[Cached],
            nbytes: int,
            started: float,
            fut: asyncio.Future[JournalPosition],
        ) -> None:
            nonlocal in_flight, inflight_bytes
            in_flight -= 1
            inflight_bytes -= nbytes
            error = fut.exception()
            resp = pb.AddResponse()
            add = resp.results.add
            if error is not None:
                # A full disk is the read-only condition, not a broken bookie.
                full = isinstance(error, OSError) and error.errno == errno.ENOSPC
                status = pb.READ_ONLY if full else pb.IO_ERROR
                msg = f"journal write failed: {error}"
                for e, _, _ in accepted:
                    add(ledger_id=e.ledger_id, entry_id=e.entry_id, status=status, message=msg)
                self.metrics.add_errors.labels(pb.StatusCode.Name(status)).inc(len(accepted))
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
            enqueue(resp.SerializeToString())
            drained.set()

        write_task = asyncio.get_running_loop().create_task(writer())
        try:
            async for req in requests:
                started = time.perf_counter()
                if isinstance(req, Malformed):
                    answer(
                        [_bad_add(-1, -1, BadRequestError(f"malformed AddRequest: {req.error}"))]
                    )
                else:
                    # Per batch, not once per stream: a token may expire and a role be
                    # revoked while a stream lives on.
                    caller = self._caller(context)
                    accepted, chunks, nbytes, refused = self._check_adds(req, caller)
                    if refused:
                        answer(refused)
                    if accepted:
                        in_flight += 1
                        inflight_bytes += nbytes
                        fut = self.storage.submit(accepted, chunks, nbytes)
                        fut.add_done_callback(
                            lambda f, a=accepted, n=nbytes, s=started: on_durable(a, n, s, f)  # type: ignore[misc]
                        )
                    for lac in req.lacs:  # after the adds: a LAC may cover them
                        await self._stream_lac(lac, caller)
                if answer_bytes >= max_answer_bytes or inflight_bytes >= max_inflight_bytes:
                    self.metrics.add_stream_pauses.inc()
                    while (
                        answer_bytes >= max_answer_bytes or inflight_bytes >= max_inflight_bytes
                    ) and not write_task.done():
                        drained.clear()
                        await drained.wait()
                    if write_task.done():
                        break  # the writer failed (the call is broken): its error is raised below
            reading = False
            ready.set()
            await write_task
        finally:
            write_task.cancel()

    def _caller(self, context: Any) -> str | RequestError | None:
        """Who makes this call: a principal, None when authentication is off, or the
        error that refused its credentials (for a caller that answers it later)."""
        try:
            return self.access.principal(context)
        except RequestError as err:
            return err

    async def _write_lac(self, req: pb.WriteLacRequest, caller: str | RequestError | None) -> None:
        """An explicit LAC, from a WriteLac call or the add stream: validated, allowed,
        stored. Raises the RequestError to answer (or count)."""
        validation.check_write_lac(req)
        if isinstance(caller, RequestError):
            raise caller
        self.access.check(caller, Access.WRITE_LAC)
        await self.storage.write_lac(
            req.ledger_id, req.master_key, req.last_add_confirmed, req.term
        )

    async def _stream_lac(self, lac: pb.WriteLacRequest, caller: str | RequestError | None) -> None:
        """An explicit LAC that came on the add stream: never answered (best effort); a
        refusal is only counted."""
        try:
            await self._write_lac(lac, caller)
        except RequestError as err:
            self.metrics.lac_errors.labels(pb.StatusCode.Name(err.status)).inc()

    def _check_adds(
        self, req: pb.AddRequest, caller: str | RequestError | None = None
    ) -> tuple[list[Cached], list[bytes], int, list[pb.AddResult]]:
        """Check a batch of adds from caller (a principal, None when authentication is
        off, or the error that refused its credentials)."""
        if isinstance(caller, RequestError):  # refused whole, before any work per entry
            self.metrics.add_errors.labels(pb.StatusCode.Name(caller.status)).inc(len(req.entries))
            return [], [], 0, [_bad_add(e.ledger_id, e.entry_id, caller) for e in req.entries]
        read_only = self.is_read_only()
        max_entry_bytes = self.max_entry_bytes
        check_add = self.storage.check_add
        accepted: list[Cached] = []
        chunks: list[bytes] = []
        refused: list[pb.AddResult] = []
        nbytes = 0
        accepted_like: tuple[int, bytes, int, int] | None = None
        raised: set[int] = set()
        st = LedgerState(b"")
        # The copies on their way, by key: built at the first rewrite in this request
        # (rare: write-backs, retries), then kept up to date with what it accepts.
        pending: dict[tuple[int, int], Cached] | None = None
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
                    recovery = h.flags & pb.RECOVERY_ADD
                    self.access.check(caller, Access.RECOVERY_ADD if recovery else Access.ADD)
                    st = check_add(h, read_only=read_only)
                    accepted_like = signature
                if h.entry_id > st.highest_entry:
                    st.highest_entry = h.entry_id  # a new entry: the hot path
                    if h.last_add_confirmed > st.piggyback_lac and not h.flags:
                        # A writer's LAC is its claim about EARLIER entries, each already
                        # acknowledged by an ack quorum: true whether or not this entry
                        # ever becomes durable here. So tailing readers learn it now, not
                        # after this entry's fsync -- as BookKeeper's bookies report the
                        # LAC of entries still in their write cache. (Normal adds only:
                        # recovery write-backs and no-ops keep the durable path.)
                        reported = st.lac
                        st.piggyback_lac = h.last_add_confirmed
                        if st.lac > reported:  # (an explicit LAC may have told it already)
                            raised.add(h.ledger_id)
                else:  # a write-back, a retry -- or a forgery (ledger_rules.check_rewrite)
                    if pending is None:
                        pending = self.storage.unapplied()
                        pending.update(((a[0].ledger_id, a[0].entry_id), a) for a in accepted)
                    new = Copy(ae.payload, ae.length, ae.flags, h.term)
                    self.storage.check_rewrite(h, new, pending)
                    if h.flags & pb.TRUNCATE:
                        st.highest_entry = h.entry_id
            except RequestError as err:
                refused.append(_bad_add(h.ledger_id, h.entry_id, err))
                self.metrics.add_errors.labels(pb.StatusCode.Name(err.status)).inc()
                continue
            head = frame_header(body)
            accepted.append((h, head, body))
            if pending is not None:
                pending[(h.ledger_id, h.entry_id)] = accepted[-1]
            chunks.append(head)
            chunks.append(body)
            nbytes += FRAME_SIZE + len(body)
        self.metrics.add_bytes.inc(nbytes)
        for ledger_id in raised:
            self.storage.lac_raised(ledger_id)
        return accepted, chunks, nbytes, refused

    # -- reads ----------------------------------------------------------------------------

    async def _state_for_read(
        self, fence: bool, req: pb.ReadRequest | pb.ReadLacRequest, context: Any, plain: Access
    ) -> LedgerState:
        """A fencing read fences (durably, first); a term read adopts the term; a plain
        read needs the ledger to be known here. Each only for a caller allowed to."""
        self.access.authorize(context, Access.FENCE if fence or req.term else plain)
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
            st = await self._state_for_read(validation.check_read(req), req, context, Access.READ)
        except RequestError as err:
            return pb.ReadResponse(status=err.status, message=str(err), term=err.term)
        max_bytes = min(req.max_bytes or DEFAULT_READ_MAX_BYTES, DEFAULT_READ_MAX_BYTES)
        results = []
        total = 0
        found = await self.storage.read_entries(
            req.ledger_id, req.first_entry_id, req.last_entry_id, max_bytes
        )
        for eid, got in found:
            if isinstance(got, StoredEntry):
                total += len(got.payload)
                results.append(pb.EntryResult(entry_id=eid, status=pb.OK, entry=_entry_pb(got)))
            elif isinstance(got, (NoSuchEntryError, NoSuchLedgerError)):
                results.append(
                    pb.EntryResult(entry_id=eid, status=pb.NO_SUCH_ENTRY, message=str(got))
                )
            else:  # unreadable: an Unknown for the reader, never a negative
                results.append(pb.EntryResult(entry_id=eid, status=pb.IO_ERROR, message=str(got)))
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
            fence = validation.check_read_lac(req)
            st = await self._state_for_read(fence, req, context, Access.READ_LAC)
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
            # The entries the poller waits for, as far as the LAC and the bounds go: a
            # tailing reader then needs no read call after the poll. Optional: one this
            # bookie cannot serve ends the list, and the client reads the rest normally.
            more = min(req.piggyback_max_entries, MAX_PIGGYBACK_ENTRIES)
            nbytes = 0
            try:
                first = self.storage.read_entry(req.ledger_id, req.previous_lac + 1)
                resp.next_entry.CopyFrom(_entry_pb(first))
                nbytes += len(first.payload)
                for entry_id in range(
                    req.previous_lac + 2, min(lac, req.previous_lac + 1 + more) + 1
                ):
                    if nbytes >= MAX_PIGGYBACK_BYTES:
                        break
                    entry = self.storage.read_entry(req.ledger_id, entry_id)
                    resp.more_entries.append(_entry_pb(entry))
                    nbytes += len(entry.payload)
            except RequestError:
                pass
        return resp

    async def WriteLac(
        self, req: pb.WriteLacRequest | Malformed, context: Any
    ) -> pb.WriteLacResponse:
        if isinstance(req, Malformed):
            return pb.WriteLacResponse(
                status=pb.BAD_REQUEST, message=f"malformed WriteLacRequest: {req.error}"
            )
        try:
            await self._write_lac(req, self._caller(context))
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
            self.access.authorize(context, Access.FORCE)
            lac = self.storage.lac(req.ledger_id)
        except RequestError as err:
            return pb.ForceResponse(status=err.status, message=str(err))
        return pb.ForceResponse(status=pb.OK, last_add_confirmed=lac)

    async def GetBookieInfo(self, req: Any, context: Any) -> pb.GetBookieInfoResponse:
        if isinstance(req, Malformed):
            return pb.GetBookieInfoResponse(
                status=pb.BAD_REQUEST, message=f"malformed request: {req.error}"
            )
        try:
            principal = self.access.authorize(context, Access.INFO)
        except RequestError as err:
            return pb.GetBookieInfoResponse(status=err.status, message=str(err))
        info = self.bookie_info()
        if principal is not None:
            info.authenticated, info.principal = True, principal
            info.roles.extend(sorted(self.access.roles.get(principal, ())))
        return info

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
