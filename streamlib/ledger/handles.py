"""Ledger handles: WriteHandle (the single writer of an OPEN ledger) and ReadHandle
(readers: replica fallback, LAC reads, long-poll tailing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from bookie.wire import bookie_pb2 as pb
from metadata.store import Watch
from streamlib.ledger.codec import entry_from_pb, metadata_from_pb
from streamlib.ledger.driver import Context, Driver
from streamlib.ledger.local import LocalTail
from streamlib.protocol import DigestManager, DigestType, EnsembleCoverage, LedgerMetadata
from streamlib.protocol.actions import (
    Action,
    Closed,
    CloseFailed,
    CompleteAdds,
    EntryData,
    FailAdds,
    is_noop,
)
from streamlib.protocol.digest import master_key
from streamlib.protocol.errors import (
    BadRequestError,
    BookieIOError,
    BookieTlsError,
    BookieUnavailableError,
    NoSuchEntryError,
    TlsError,
    TooLargeError,
    error_for_status,
)
from streamlib.protocol.read_rules import (
    explicit_lac_bookies,
    local_lac_usable,
    long_poll_bookie,
    refresh_before_using_lac,
    retry_read_after_refresh,
)
from streamlib.protocol.writer import LedgerWriter

MAX_ENTRY_BYTES = 5 * 1024 * 1024  # the bookie's default limit
PIGGYBACK_MAX_ENTRIES = 32  # entries a long poll may bring after the first
# A writer with nothing in flight sends its LAC on the add streams at the loop's next turn
# -- unless its last quiet moment ended with a new add within TIGHT_LOOP_S (a caller
# sending one message after another): then the next add is likely to carry the LAC, and
# it waits QUIET_LAC_DELAY_S for it first (a sub-millisecond timer is one epoll tick
# anyway). A tailing reader of a writer at a low rate sees each entry about one round
# trip after its acknowledgement; a tight loop costs the bookies no extra messages.
TIGHT_LOOP_S = 0.001
QUIET_LAC_DELAY_S = 0.002
# "At the loop's next turn" is this many callback hops after the acknowledgement (see
# WriteHandle._lac_after_completions).
LAC_AFTER_HOPS = 6
_REFUSALS = (pb.UNAUTHORIZED, pb.UNAUTHENTICATED)


def refused(bookie: str, response: pb.ReadResponse | pb.ReadLacResponse) -> None:
    """Raise a bookie's refusal of this client (its credentials or roles): no other
    replica will think otherwise, and it is no evidence about the entries, so it is
    neither retried nor counted as a missing copy."""
    if response.status in _REFUSALS:
        raise error_for_status(response.status, f"bookie {bookie}: {response.message}")


class WriteHandle:
    """Appends to a ledger this client created. Many appends may be in flight; they
    complete in entry order."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        version: int,
        context: Context,
        *,
        explicit_lac_interval_s: float = 0.1,
        quiet_lac_delay_s: float = QUIET_LAC_DELAY_S,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
        last_add_confirmed: int = -1,
        length: int = 0,
        material: bytes | None = None,
    ) -> None:
        """material: the ledger's key material (metadata.key_material(password)); only a
        key version 0 ledger may leave it out (its material is in the metadata)."""
        if material is None:
            material = metadata.key_material(None)
            if not material:
                raise BadRequestError(f"writing ledger {metadata.ledger_id} needs its password")
        self._digest = DigestManager(metadata.ledger_id, metadata.digest_type, material)
        self._writer = LedgerWriter(
            metadata,
            version,
            master_key=master_key(material),
            digest=self._digest,
            term=metadata.term,
            last_add_confirmed=last_add_confirmed,
            length=length,
        )
        self._context = context
        self._driver = Driver(self._writer, metadata.ledger_id, context, self)
        self._futures: dict[int, asyncio.Future[int]] = {}
        self._close_future: asyncio.Future[LedgerMetadata] | None = None
        self._max_entry_bytes = max_entry_bytes
        self._explicit_lac_interval_s = explicit_lac_interval_s
        self._quiet_lac_delay_s = quiet_lac_delay_s
        self._quiet_since: float | None = None  # when the writer last had nothing in flight
        self._tight = False  # its last quiet moment ended within TIGHT_LOOP_S
        self._lac_timer: asyncio.Handle | None = None
        self._lac_sent = -1
        # Readers of this client learn acknowledged entries from here (local.py); the
        # payloads of entries in flight are kept for them only while one follows.
        self._tail = context.local_tails.start(
            metadata.ledger_id, last_add_confirmed, metadata.term
        )
        self._unacked: dict[int, EntryData] = {}

    @property
    def ledger_id(self) -> int:
        return self._writer.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._writer.last_add_confirmed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._writer.metadata

    @property
    def length(self) -> int:
        """Bytes handed to the ledger so far (acknowledged or not)."""
        return self._writer.length

    @property
    def next_entry_id(self) -> int:
        """The id the next append gets = entries handed to the ledger so far."""
        return self._writer.tracker.next_entry_id

    def _check(self, data: bytes) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise BadRequestError(f"entry data must be bytes, got {type(data).__name__}")
        if len(data) > self._max_entry_bytes:
            raise TooLargeError(
                f"entry of {len(data)} bytes is over the {self._max_entry_bytes}-byte limit"
            )

    def append_nowait(self, datas: Sequence[bytes]) -> list[asyncio.Future[int]]:
        """Send entries now; return one future per entry, resolved with its id when it is
        acknowledged (in order). The building block for pipelined producers."""
        for data in datas:
            self._check(data)
        loop = asyncio.get_running_loop()
        length = self._writer.length
        first, actions = self._writer.append(datas)
        self._keep(first, datas, length)
        self._quiet_ended(loop.time())
        futures = []
        for entry_id in range(first, first + len(datas)):
            future: asyncio.Future[int] = loop.create_future()
            self._futures[entry_id] = future
            futures.append(future)
        self._driver.execute(actions)
        return futures

    async def append(self, data: bytes) -> int:
        """Append one entry; return its id once Qa bookies have it durably."""
        return await self.append_nowait([data])[0]

    async def append_many(self, datas: Sequence[bytes]) -> list[int]:
        """Append entries in order; return their ids once all are acknowledged."""
        datas = list(datas)
        if not datas:
            return []
        for data in datas:
            self._check(data)
        length = self._writer.length
        first, actions = self._writer.append(datas)
        self._keep(first, datas, length)
        self._quiet_ended(asyncio.get_running_loop().time())
        last = first + len(datas) - 1
        # Completion is in order and a failure fails every pending add, so the last
        # entry's outcome is the outcome of all of them: one future, not one per entry.
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._futures[last] = done
        self._driver.execute(actions)
        await done
        return list(range(first, last + 1))

    def _keep(self, first: int, datas: Sequence[bytes], length: int) -> None:
        """Keep the payloads of entries just sent for the local tail, if a reader follows."""
        if not self._tail.keeping:
            return
        term = self._writer.term
        for entry_id, data in enumerate(datas, first):
            length += len(data)
            self._unacked[entry_id] = EntryData(
                entry_id, entry_id - 1, length, bytes(data), b"", 0, term
            )

    def _stop_tail(self) -> None:
        self._context.local_tails.stop(self._tail)
        self._unacked.clear()

    async def force(self) -> int:
        """Wait for every pending append; return the LAC. Acknowledged entries are
        already durable (bookies answer after fsync), so this is a barrier."""
        pending = [f for f in self._futures.values() if not f.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return self.last_add_confirmed

    async def close(self) -> LedgerMetadata:
        """Wait for pending appends, then seal the ledger at its LAC."""
        if self._close_future is None:
            self._close_future = asyncio.get_running_loop().create_future()
            self._driver.execute(self._writer.close())
        metadata = await self._close_future
        self._stop_tail()
        self._cancel_lac_timer()
        await self._driver.cancel_pending()
        return metadata

    def roll_fragment(self) -> None:
        """Start a new fragment on bookies chosen by placement (unbounded ledgers roll
        fragments by size or age); appends keep flowing meanwhile."""
        self._driver.execute(self._writer.roll_fragment())

    async def release(self) -> int:
        """Stop writing WITHOUT closing (an unbounded ledger lives on: the next writer takes
        it over): wait for pending appends and publish the LAC to the bookies now, so
        readers can read every acknowledged entry. Returns the LAC."""
        lac = await self.force()
        self._stop_tail()
        self._cancel_lac_timer()
        request = pb.WriteLacRequest(
            ledger_id=self.ledger_id,
            master_key=self._writer.master_key,
            last_add_confirmed=lac,
            term=self._writer.term,
        )
        recipients = explicit_lac_bookies(self._writer.metadata, lac)
        await asyncio.gather(
            *(self._context.pool.get(b).write_lac(request) for b in recipients),
            return_exceptions=True,  # best effort: the next writer's entries carry it too
        )
        await self._driver.cancel_pending()
        return lac

    # -- outcomes from the writer -------------------------------------------------------

    def on_outcome(self, action: Action) -> None:
        if isinstance(action, CompleteAdds):
            unacked = self._unacked
            acked = (
                [
                    entry
                    for entry_id in range(action.first_entry_id, action.last_entry_id + 1)
                    if (entry := unacked.pop(entry_id, None)) is not None
                ]
                if unacked
                else []
            )
            # Before the futures: a reader of this client woken by them finds it there.
            self._tail.acknowledged(self._writer.last_add_confirmed, acked)
            for entry_id in range(action.first_entry_id, action.last_entry_id + 1):
                future = self._futures.pop(entry_id, None)
                if future is not None and not future.done():
                    future.set_result(entry_id)
            if self._futures:
                # Adds still in flight: those sent from now on carry the new LAC; the
                # timer covers a writer whose remaining adds take long.
                self._schedule_explicit_lac(self._explicit_lac_interval_s)
            else:
                # Nothing in flight: unless another add follows within the quiet delay
                # (then it carries the LAC, and the writer sends nothing extra -- a
                # blocking send loop), tell the bookies, so a tailing reader sees this
                # entry about one round trip after its acknowledgement, not a timer later.
                self._cancel_lac_timer()
                self._quiet_since = asyncio.get_running_loop().time()
                quiet = self._context.quiet_lac_s
                if quiet is None:
                    quiet = self._quiet_lac_delay_s if self._tight else 0.0
                self._schedule_explicit_lac(quiet)
        elif isinstance(action, FailAdds):
            self._stop_tail()  # the writer is broken: readers go back to the bookies
            for entry_id in action.entry_ids:
                future = self._futures.pop(entry_id, None)
                if future is not None and not future.done():
                    future.set_exception(action.error)
        elif isinstance(action, Closed | CloseFailed):
            self._stop_tail()
            closing = self._close_future
            if closing is None or closing.done():
                return
            if isinstance(action, Closed):
                closing.set_result(action.metadata)
            else:
                closing.set_exception(action.error)

    # -- explicit LAC: lets tailing readers see the last entry of a quiet writer ----------

    def _quiet_ended(self, now: float) -> None:
        """An add was sent: it carries the LAC, so a pending LAC timer goes (the acks
        re-arm it); remember whether the writer came back at once."""
        self._cancel_lac_timer()
        if self._quiet_since is not None:
            self._tight = now - self._quiet_since < TIGHT_LOOP_S
            self._quiet_since = None

    def _schedule_explicit_lac(self, delay_s: float) -> None:
        if self._explicit_lac_interval_s <= 0 or self._lac_timer is not None:
            return
        loop = asyncio.get_running_loop()
        if delay_s > 0:
            self._lac_timer = loop.call_later(delay_s, self._send_explicit_lac)
        else:
            self._lac_timer = loop.call_soon(self._lac_after_completions, LAC_AFTER_HOPS)

    def _lac_after_completions(self, hops: int) -> None:
        """Send the explicit LAC once the completions of the adds that moved it have run:
        they are a few callbacks deep (the entry's future, the producer's batch, the
        caller's future or task, a consumer of this client), and the LAC's stream writes
        (about 0.1 ms of the loop on this machine) would otherwise run first and delay
        every one of them -- for a writer at a low rate, its every acknowledgement."""
        if hops > 0:
            loop = asyncio.get_running_loop()
            self._lac_timer = loop.call_soon(self._lac_after_completions, hops - 1)
        else:
            self._send_explicit_lac()

    def _cancel_lac_timer(self) -> None:
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    def _send_explicit_lac(self) -> None:
        self._lac_timer = None
        lac = self.last_add_confirmed
        if lac <= self._lac_sent or self._close_future is not None:
            return
        self._lac_sent = lac
        request = pb.WriteLacRequest(
            ledger_id=self.ledger_id,
            master_key=self._writer.master_key,
            last_add_confirmed=lac,
            term=self._writer.term,
        )

        # On each bookie's add stream: no call of its own, so a writer may tell its LAC
        # whenever it goes quiet (best effort: the next entry carries the LAC anyway).
        for bookie in explicit_lac_bookies(self._writer.metadata, lac):
            self._context.pool.get(bookie).send_lac(request)


def _payloads(entries: list[EntryData]) -> list[bytes]:
    """The data of entries, without the TRUNCATE no-ops of unbounded ledgers (they mark a
    takeover, not data; read_entries still shows them, with their flags)."""
    return [e.payload for e in entries if not is_noop(e.flags)]


class ReadHandle:
    """Reads a ledger. A recovered (or closed) ledger reads up to its last entry; a
    ledger opened without recovery reads up to the LAC it has learned."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        version: int,
        context: Context,
        *,
        lac: int,
        material: bytes | None = None,
    ) -> None:
        """material: as WriteHandle's; without it (a reader that has no password) only a
        crc32c ledger or a key version 0 one can be verified."""
        self.metadata = metadata
        self.version = version
        self._context = context
        if material is None:
            material = metadata.key_material(None)
            if not material and metadata.digest_type is not DigestType.CRC32C:
                raise BadRequestError(
                    f"ledger {metadata.ledger_id} has {metadata.digest_type.value} digests: "
                    f"reading it needs its password"
                )
        self._digest = DigestManager(metadata.ledger_id, metadata.digest_type, material)
        self._lac = metadata.last_entry_id if metadata.is_closed else lac
        self._cache: dict[int, EntryData] = {}
        self._watch: Watch | None = None  # of the ledger's metadata, while tailing
        self._poll_failures = 0
        self.long_polls = 0  # how many long-poll LAC reads tailing made (observability)
        self.local_waits = 0  # ... and how many waits on a writer of this client instead
        self._following: LocalTail | None = None

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def is_closed(self) -> bool:
        return self.metadata.is_closed

    @property
    def last_entry_id(self) -> int:
        """The last entry of a closed ledger, else the last add confirmed known so far."""
        return self.metadata.last_entry_id if self.is_closed else self._lac

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    # -- reads --------------------------------------------------------------------------

    async def read(self, first: int, last: int) -> list[bytes]:
        """Entries first..last, all <= the LAC (or the last entry of a closed ledger)."""
        if last > self.last_entry_id:
            self._lac = max(self._lac, self._local_lac())  # this client's writer knows more
            if last > self.last_entry_id:
                raise NoSuchEntryError(
                    f"ledger {self.ledger_id}: entry {last} is past the last confirmed entry "
                    f"{self.last_entry_id}"
                )
        return _payloads(await self.read_entries(first, last))

    async def read_unconfirmed(self, first: int, last: int) -> list[bytes]:
        """Entries first..last, possibly past the LAC (they may still be lost by recovery)."""
        return _payloads(await self.read_entries(first, last))

    async def read_entries(self, first: int, last: int) -> list[EntryData]:
        if first < self.metadata.first_entry_id or last < first:
            raise BadRequestError(f"bad entry range {first}..{last} of ledger {self.ledger_id}")
        try:
            return await self._read_entries(first, last)
        except (NoSuchEntryError, BookieIOError):
            closed, version = self.is_closed, self.version
            await self.refresh_metadata()
            if not retry_read_after_refresh(closed, version, self.version):
                raise
            return await self.read_entries(first, last)

    async def _read_entries(self, first: int, last: int) -> list[EntryData]:
        found: dict[int, EntryData] = {}
        for entry_id in range(first, last + 1):
            cached = self._cache.pop(entry_id, None)
            if cached is not None:
                found[entry_id] = cached
        # For each entry still wanted: the replicas already asked, and how many of them
        # said it does not exist (only if all did is it a NoSuchEntry).
        tried: dict[int, set[str]] = {e: set() for e in range(first, last + 1) if e not in found}
        negatives = dict.fromkeys(tried, 0)
        unreachable: dict[str, BookieUnavailableError] = {}  # why a bookie was not read
        while tried:
            by_bookie = self._cover(tried, negatives, unreachable)
            results = await asyncio.gather(
                *(self._read_from(b, ids, unreachable) for b, ids in by_bookie.items())
            )
            for bookie, (entries, missing) in zip(by_bookie, results, strict=True):
                for entry in entries:
                    if tried.pop(entry.entry_id, None) is not None:
                        found[entry.entry_id] = entry
                for entry_id, negative in missing:
                    if entry_id in tried:
                        tried[entry_id].add(bookie)
                        negatives[entry_id] += negative
        return [found[e] for e in range(first, last + 1)]

    def _follow(self, tail: LocalTail | None) -> None:
        """Follow tail (a local writer keeps acknowledged payloads while followed)."""
        if self._following is tail:
            return
        if self._following is not None:
            self._following.followers -= 1
        self._following = tail
        if tail is not None:
            tail.followers += 1

    async def _wait_local(
        self, local: LocalTail, watch: Watch, next_entry: int, timeout_s: float
    ) -> None:
        """wait_for_more from the writer of this client: its LAC, and the acknowledged
        entries it kept, at once (local.py); the metadata watch still ends the wait (a
        close, or a takeover by another client)."""
        self._follow(local)
        self.local_waits += 1
        # (One future woken by either, and a timer: no task per wait -- a broker waits
        # so for every entry of every stream it dispatches.)
        if local.lac < next_entry and local.open:
            if watch.take_nowait() is None:
                loop = asyncio.get_running_loop()
                woken: asyncio.Future[None] = loop.create_future()
                local.wake_on_change(woken)
                watch.wake_on_event(woken)
                timer = loop.call_later(timeout_s, _wake, woken)
                try:
                    await woken
                finally:
                    timer.cancel()
                    local.forget_waiter(woken)
                    watch.forget_waiter(woken)
                changed = watch.take_nowait() is not None
            else:
                changed = True
            if changed:
                await self.refresh_metadata()
                return
        if local.lac > self._lac:
            self._lac = local.lac
            for entry in local.entries_from(next_entry):
                self._cache[entry.entry_id] = entry

    def _cover(
        self,
        tried: dict[int, set[str]],
        negatives: dict[int, int],
        unreachable: Mapping[str, BookieUnavailableError],
    ) -> dict[str, list[int]]:
        """Which bookie to ask for which entries: for each entry a replica not asked yet,
        gathering entries on as few bookies as possible, since a range read returns the
        whole span (with E = Qw one bookie holds them all). An entry no replica of which
        could be read: NoSuchEntryError if every one said it has none, BookieTlsError if
        TLS kept this client from every one, else BookieIOError."""
        by_bookie: dict[str, list[int]] = {}
        for entry_id, asked in tried.items():
            bookies = self.metadata.write_set_bookies(entry_id)
            untried = [b for b in bookies if b not in asked]
            if not untried:
                if negatives[entry_id] == len(bookies):
                    raise NoSuchEntryError(
                        f"ledger {self.ledger_id} entry {entry_id}: no bookie has it"
                    )
                unread = f"ledger {self.ledger_id} entry {entry_id}: no replica could be read"
                mismatches = [unreachable.get(b) for b in bookies]
                if all(isinstance(e, TlsError) for e in mismatches):
                    raise BookieTlsError(f"{unread}: {mismatches[0]}")
                raise BookieIOError(unread)
            chosen = next((b for b in untried if b in by_bookie), untried[0])
            by_bookie.setdefault(chosen, []).append(entry_id)
        return by_bookie

    async def _read_from(
        self, bookie: str, entry_ids: list[int], unreachable: dict[str, BookieUnavailableError]
    ) -> tuple[list[EntryData], list[tuple[int, bool]]]:
        """Range-read entry_ids' span from one bookie; return (good entries, [(missing id,
        was it a clean negative)]). Entries past where the bookie stopped (its size limit)
        are neither: they are asked again, from the same bookie. A bookie not reached is
        noted in unreachable, with why."""
        wanted = set(entry_ids)
        request = pb.ReadRequest(
            ledger_id=self.ledger_id, first_entry_id=min(wanted), last_entry_id=max(wanted)
        )
        try:
            response = await self._context.pool.get(bookie).read(request)
        except BookieUnavailableError as error:
            unreachable[bookie] = error
            return [], [(e, False) for e in entry_ids]
        refused(bookie, response)
        good: list[EntryData] = []
        negative: set[int] = set()
        answered = max(wanted)
        if response.status == pb.OK:
            if response.results and response.results[-1].entry_id < max(wanted):
                answered = response.results[-1].entry_id
            for result in response.results:
                if result.entry_id not in wanted:
                    continue
                if result.status == pb.OK:
                    entry = entry_from_pb(result.entry)
                    if self._valid(entry):
                        good.append(entry)
                elif result.status in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER):
                    negative.add(result.entry_id)
        elif response.status == pb.NO_SUCH_LEDGER:
            negative = set(wanted)
        got = {e.entry_id for e in good}
        return good, [(e, e in negative) for e in entry_ids if e not in got and e <= answered]

    def _valid(self, entry: EntryData) -> bool:
        """The client's digest holds and the copy is no leftover of an older term."""
        return self._digest.is_valid(
            entry.entry_id, entry.last_add_confirmed, entry.length, entry.payload, entry.digest
        ) and self.metadata.copy_is_current(entry.entry_id, entry.term)

    # -- LAC ----------------------------------------------------------------------------

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies of the last fragment (no fencing); the answer is the highest
        LAC once every write set has answered with (Qw - Qa) + 1 bookies, or all did."""
        if self.is_closed:
            return self.metadata.last_entry_id
        local = self._usable_local()
        if local is not None:  # (this client writes it: its LAC is the ledger's, at once)
            self._lac = max(self._lac, local.lac)
            return self._lac
        md = self.metadata
        coverage = EnsembleCoverage(md.ensemble_size, md.write_quorum, md.ack_quorum)
        ensemble = md.last_fragment.ensemble
        request = pb.ReadLacRequest(ledger_id=self.ledger_id, previous_lac=-1)
        calls = {
            asyncio.ensure_future(self._context.pool.get(b).read_lac(request)): i
            for i, b in enumerate(ensemble)
        }
        # A last fragment with no entry yet (a roll to fresh bookies) knows nothing of
        # the LAC: the holders of the entry before it do (they report what they hold).
        # (None when the fragment before it was dropped: an unbounded ledger's retention.)
        before = md.last_fragment.first_entry_id - 1
        extra = (
            [b for b in md.write_set_bookies(before) if b not in ensemble]
            if before >= md.first_entry_id
            else []
        )
        for b in extra:
            calls[asyncio.ensure_future(self._context.pool.get(b).read_lac(request))] = -1
        best = self._lac
        newest_term = 0
        pending = set(calls)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for call in done:
                    try:
                        response = call.result()
                    except BookieUnavailableError:
                        continue
                    refused(ensemble[calls[call]] if calls[call] >= 0 else "?", response)
                    if response.status == pb.OK:
                        best = max(best, response.last_add_confirmed)
                        newest_term = max(newest_term, response.term)
                        if calls[call] >= 0:
                            coverage.add(calls[call])
                extra_pending = any(calls[c] < 0 for c in pending)
                if coverage.is_covered() and not extra_pending:
                    break
        finally:
            for call in pending:
                call.cancel()
        if refresh_before_using_lac(md.term, md.state, newest_term, advanced=True):
            version = self.version
            await self.refresh_metadata()
            if self.version != version:  # ask the bookies the fresh metadata names
                return await self.read_last_add_confirmed()
        self._lac = max(self._lac, best, self._local_lac())
        return self._lac

    def _local_lac(self) -> int:
        """The LAC of this client's writer of the ledger where read_rules allow taking it
        (local.py), else -1: a reader reads what its own client had acknowledged, even
        before the bookies heard the LAC."""
        local = self._usable_local()
        return -1 if local is None else local.lac

    def _usable_local(self) -> LocalTail | None:
        """This client's writer of the ledger, if read_rules.local_lac_usable allows
        taking its LAC now."""
        local = self._context.local_tails.get(self.ledger_id)
        md = self.metadata
        if local is not None and local_lac_usable(local.open, local.term, md.term, md.state):
            return local
        return None

    async def refresh_metadata(self) -> LedgerMetadata:
        stored, self.version = await self._context.ledgers.read(self.ledger_id)
        self.metadata = metadata_from_pb(stored)
        if self.metadata.is_closed:
            self._lac = self.metadata.last_entry_id
        return self.metadata

    # -- tailing ------------------------------------------------------------------------

    async def tail(
        self, from_entry: int = 0, *, poll_timeout_s: float = 5.0, batch: int = 256
    ) -> AsyncIterator[tuple[int, bytes]]:
        """Yield (entry id, payload) from from_entry on, waiting for new entries with the
        bookies' long-poll LAC read; ends when the ledger is closed and fully read."""
        next_entry = from_entry
        try:
            while True:
                if next_entry <= self.last_entry_id:
                    last = min(self.last_entry_id, next_entry + batch - 1)
                    for entry in await self.read_entries(next_entry, last):
                        if not is_noop(entry.flags):
                            yield entry.entry_id, entry.payload
                    next_entry = last + 1
                    continue
                if self.is_closed:
                    return
                await self.wait_for_more(next_entry, poll_timeout_s)
        finally:
            await self.close()

    async def close(self) -> None:
        """Release what tailing holds (the metadata watch, the following of a local
        writer)."""
        self._follow(None)
        if self._watch is not None:
            watch, self._watch = self._watch, None
            await watch.close()

    async def wait_for_more(self, next_entry: int, timeout_s: float) -> None:
        """Wait (long-poll on a bookie, up to timeout_s) until the LAC passes
        next_entry - 1 or the ledger's metadata changes (e.g. it was closed)."""
        if self._watch is None:
            self._watch = self._context.ledgers.watch(self.ledger_id)
        watch = self._watch
        md = self.metadata
        local = self._usable_local()
        if local is not None:
            await self._wait_local(local, watch, next_entry, timeout_s)
            return
        self._follow(None)
        bookie = long_poll_bookie(md, next_entry, self._poll_failures)
        request = pb.ReadLacRequest(
            ledger_id=self.ledger_id,
            previous_lac=self._lac,
            timeout_ms=int(timeout_s * 1000),
            piggyback_entry=True,
            piggyback_max_entries=PIGGYBACK_MAX_ENTRIES,
        )
        self.long_polls += 1
        poll = asyncio.ensure_future(self._context.pool.get(bookie).read_lac(request))
        changed = asyncio.ensure_future(watch.next(timeout_s + 1.0))
        done = await _first_of(poll, changed)
        if poll in done and not poll.cancelled():
            try:
                response = poll.result()
            except BookieUnavailableError:
                response = None
                self._poll_failures += 1
                # A timer, not synchronisation: the next poll asks the next bookie, and
                # while none answers (a cluster restart) tailing must not spin.
                await asyncio.sleep(min(1.0, 0.02 * self._poll_failures))
            if response is not None:
                refused(bookie, response)
            if response is not None and response.status != pb.OK:
                # The bookie does not hold the ledger (yet): ask the next one, not at once.
                self._poll_failures += 1
                await asyncio.sleep(min(1.0, 0.02 * self._poll_failures))
            if response is not None and response.status == pb.OK:
                advanced = response.last_add_confirmed > self._lac
                # No progress: the next poll asks the next bookie (this one may hold
                # nothing the writer publishes now, e.g. after a roll to fresh bookies).
                self._poll_failures = 0 if advanced else self._poll_failures + 1
                if refresh_before_using_lac(md.term, md.state, response.term, advanced):
                    await self.refresh_metadata()  # then the next poll asks the right bookies
                    return
                self._lac = response.last_add_confirmed
                if response.HasField("next_entry"):
                    # The entries from next_entry on, as far as they are whole, in order,
                    # valid and confirmed: read from here instead of another call.
                    expected = next_entry
                    for piece in (response.next_entry, *response.more_entries):
                        entry = entry_from_pb(piece)
                        if entry.entry_id != expected or entry.entry_id > self._lac:
                            break
                        if not self._valid(entry):
                            break
                        self._cache[entry.entry_id] = entry
                        expected += 1
                return
        # The ledger's metadata changed (closed?), or the poll failed: look again.
        await self.refresh_metadata()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _first_of(*futures: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    """Wait for the first of futures to end, then cancel and reap the others -- also
    when the caller is cancelled: no orphan is left behind. The ones that ended."""
    try:
        done, _ = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            if not future.done():
                future.cancel()
        await asyncio.gather(*futures, return_exceptions=True)
    return done
