"""Reading a stream: the scanner (messages after a position, across the ledger list,
tailing the current ledger with the bookies' long-poll), the read-ahead queue, and the
non-durable Reader over a Feed (direct: the scanner; through the stream service: a
broker's). The messages themselves: message.py."""

from __future__ import annotations

import asyncio
import builtins
import collections
import copy
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol, TypeVar

from metadata.services.streams import StreamRegistry
from streamlib.ledger.handles import ReadHandle
from streamlib.ledger.manager import LedgerManager
from streamlib.protocol.actions import EntryData, is_noop
from streamlib.protocol.errors import (
    BadRequestError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StreamlibError,
)
from streamlib.protocol.errors import TimeoutError as StreamTimeoutError
from streamlib.protocol.stream_rules import (
    OPEN_TAIL,
    READERS_MAY_RECOVER,
    LedgerEnd,
    ReaderStep,
    confirmed_end,
    reader_step,
)
from streamlib.retry import SCAN_READ
from streamlib.stream.batch import (
    MAX_CHUNKED_MESSAGE_BYTES,
    DecodedBatch,
    decode_batch,
    decompress,
)
from streamlib.stream.batch import MessageDecodeError as MessageDecodeError  # (its old home)
from streamlib.stream.message import (  # (their home; imported from here too)
    EntryMessages as EntryMessages,
)
from streamlib.stream.message import (
    Message as Message,
)
from streamlib.stream.message import (
    decode_entry as decode_entry,
)
from streamlib.stream.message import (
    entry_messages as entry_messages,
)
from streamlib.stream.message import (
    new_message as new_message,
)
from streamlib.stream.positions import EARLIEST, LATEST, MessageId, parse_start, position_before
from streamlib.stream.writer import STREAM_PASSWORD

T = TypeVar("T")

LOOK_BACK_ENTRIES = 8  # entries read at a time looking back past no-ops for the last message
FIRST_READ_ENTRIES = 4  # the first range of a catch-up read; ranges double from there
READ_BYTES = 4 << 20  # ... up to about this many bytes (measured: 2-4 MiB reads beat 16 MiB)
READ_AHEAD = 3  # ranges in flight while one is consumed
RECEIVER_QUEUE_BYTES = 4 << 20  # payload bytes a consumer's or reader's queue reads ahead
READ_RETRY_S = 30.0  # how long a read that no replica could serve is retried


async def _cancel(tasks: Iterable[asyncio.Task[Any]]) -> None:
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


class StreamScanner:
    """Messages strictly after `start_after`, in stream order. With tail=True it waits
    for new messages (long-poll) and follows rolls; with tail=False it stops at the end
    that is confirmed now."""

    read_compacted = False  # (streamlib.stream.compacted.CompactedScanner: True)

    def __init__(
        self,
        ledgers: LedgerManager,
        registry: StreamRegistry,
        name: str,
        start_after: MessageId,
        *,
        tail: bool = True,
        poll_timeout_s: float = 5.0,
        batch_entries: int = 256,
    ) -> None:
        self._ledgers = ledgers
        self._registry = registry
        self.name = name
        self.start_after = start_after
        self.tail = tail
        self.poll_timeout_s = poll_timeout_s
        self.batch_entries = batch_entries
        self.long_polls = 0
        self.keep_raw = False  # keep each entry's bytes (a broker's dispatch sends them)

    async def end_position(self) -> MessageId:
        """The position of the last message confirmed now (EARLIEST if none)."""
        md, _ = await self._registry.read(self.name)
        end = await confirmed_stream_end(self._ledgers, [i.ledger_id for i in md.ledgers])
        return EARLIEST if end is None else MessageId(*end, LATEST.batch_index)

    async def _last_entry(self) -> tuple[int, int, DecodedBatch] | None:
        """The last entry with messages confirmed now, decoded (None if none)."""
        last = await self.last_entry()
        if last is None:
            return None
        ledger_id, entry_id, payload = last
        # (Its ids and sequence ids only: a Pulsar producer's encrypted entry reads so too,
        # as opaque messages.)
        where = f"ledger {ledger_id} entry {entry_id}"
        return ledger_id, entry_id, decode_batch(payload, where, payloads=False)

    async def last_entry(self) -> tuple[int, int, bytes] | None:
        """The last entry with messages confirmed now, as stored (None if none). The
        entries at the end of an unbounded stream's ledger may be no-ops (every takeover
        ends with one): it looks back past them, a few at a time."""
        md, _ = await self._registry.read(self.name)
        end = await confirmed_stream_end(self._ledgers, [i.ledger_id for i in md.ledgers])
        if end is None:
            return None
        ledger_id, last = end
        handle = await open_for_reading(self._ledgers, ledger_id)
        if handle is None:
            return None
        try:
            first = handle.metadata.first_entry_id
            while last >= first:
                low = max(first, last - LOOK_BACK_ENTRIES + 1)
                found = [e for e in await handle.read_entries(low, last) if not is_noop(e.flags)]
                if found:
                    return ledger_id, found[-1].entry_id, found[-1].payload
                last = low - 1
        finally:
            await handle.close()
        return None  # (only no-ops in this ledger: earlier ledgers are not looked at)

    async def last_message(self) -> MessageId | None:
        """The id of the last message confirmed now (None if none)."""
        last = await self._last_entry()
        if last is None:
            return None
        ledger_id, entry_id, batch = last
        return MessageId(ledger_id, entry_id, max(len(batch.payloads) - 1, 0))

    async def last_sequence_id(self) -> int:
        """The sequence id of the last message confirmed now (-1: none, or it has none)."""
        return (await self.last_sent())[0]

    async def last_sent(self, producer: str | None = None) -> tuple[int, dict[int, MessageId]]:
        """The sequence id of the last message confirmed now (-1: none, or it has none),
        and where each message of its entry went, by sequence id (what a new producer
        answers a resend of them with) -- given a producer name ("": unnamed), only of
        that producer's messages: another's sequence ids are not its own."""
        last = await self._last_entry()
        if last is None or last[2].sequence_ids is None or not last[2].payloads:
            return -1, {}
        ledger_id, entry_id, batch = last
        sequence_ids = batch.sequence_ids
        assert sequence_ids is not None
        names = batch.producers or [""] * len(sequence_ids)
        where = {
            sequence: MessageId(ledger_id, entry_id, index)
            for index, sequence in enumerate(sequence_ids)
            if sequence >= 0 and (producer is None or names[index] == producer)
        }
        if producer is not None:
            return max(where, default=-1), where
        return max(-1, sequence_ids[-1]), where

    async def start_position(self, start: MessageId | str, inclusive: bool) -> MessageId:
        """Where a reader from `start` starts (the position it starts after): after the
        message `start` names, or with it when inclusive (LATEST inclusive: the last
        message confirmed now, as Pulsar's startMessageIdInclusive)."""
        position = parse_start(start)
        if not inclusive or position == EARLIEST:
            return position
        if position == LATEST:
            last = await self.last_message()
            return LATEST if last is None else position_before(last)
        return position_before(position)

    async def position_before_time(self, timestamp_ms: int) -> MessageId:
        """The position after which the first message published at or after
        timestamp_ms comes (LATEST when none has been yet). Scans from the start."""
        scanner = StreamScanner(self._ledgers, self._registry, self.name, EARLIEST, tail=False)
        async for message in scanner.messages():
            if message.publish_time_ms >= timestamp_ms:
                return message.previous
        return LATEST

    async def messages(self) -> AsyncIterator[Message]:
        async for batch in self.batches():
            for message in batch:
                yield message

    async def batches(self) -> AsyncIterator[EntryMessages]:
        """The messages of each entry, in order (never none)."""
        after = self.start_after
        if after == LATEST:
            after = await self.end_position()
        previous = after
        watch = self._registry.store.watch(self._registry.stream_path(self.name))
        finished: int | None = None  # the last ledger read to its end
        self._stopped = False
        try:
            while True:
                md, _ = await self._registry.read(self.name)
                ids = [info.ledger_id for info in md.ledgers]
                if finished is None:
                    candidates = [i for i in ids if i >= after.ledger_id]
                else:
                    candidates = [i for i in ids if i > finished]
                if not candidates:
                    if not self.tail:
                        return
                    await self._wait(watch)
                    continue
                ledger_id = candidates[0]
                async for batch in self._ledger_messages(ledger_id, after, previous):
                    previous = batch.last_id
                    yield batch
                if self._stopped or (not self.tail and ledger_id == ids[-1]):
                    return  # (not tailing) an open ledger ends what is confirmed now
                finished = ledger_id
        finally:
            await watch.close()

    async def _wait(self, watch: object) -> None:
        try:
            await watch.next(self.poll_timeout_s)  # type: ignore[attr-defined]
        except TimeoutError:
            pass

    async def _ledger_messages(
        self, ledger_id: int, after: MessageId, previous: MessageId
    ) -> AsyncIterator[EntryMessages]:
        handle = await open_for_reading(self._ledgers, ledger_id)
        if handle is None:
            return
        try:
            async for batch in self._entries(handle, ledger_id, after, previous):
                yield batch
        finally:
            await handle.close()

    async def _entries(
        self, handle: ReadHandle, ledger_id: int, after: MessageId, previous: MessageId
    ) -> AsyncIterator[EntryMessages]:
        next_entry = max(after.entry_id, 0) if after.ledger_id == ledger_id else 0
        # Read-ahead: READ_AHEAD ranges in flight while one is decoded and consumed. The
        # first ranges are small so the first messages come soon; then they grow to about
        # READ_BYTES (at most batch_entries entries), sized by the entries read so far.
        inflight: collections.deque[tuple[int, int, asyncio.Task[list[EntryData] | None]]]
        inflight = collections.deque()
        size = min(FIRST_READ_ENTRIES, self.batch_entries)
        largest = self.batch_entries  # entries per range
        try:
            while True:
                # Fragment retention may have dropped the start of an unbounded ledger.
                next_entry = max(next_entry, handle.metadata.first_entry_id)
                end = handle.last_entry_id
                fetch = inflight[-1][1] + 1 if inflight else next_entry
                while len(inflight) < READ_AHEAD and fetch <= end:
                    last = min(end, fetch + size - 1)
                    read = asyncio.ensure_future(self._read(handle, fetch, last))
                    inflight.append((fetch, last, read))
                    fetch = last + 1
                    size = min(2 * size, largest)
                if not inflight:
                    break
                _, last, read = inflight.popleft()
                entries = await read
                if entries is None:  # dropped meanwhile: on from the new first entry
                    await _cancel(task for _, _, task in inflight)
                    inflight.clear()
                    continue
                if entries:
                    got = max(1, sum(len(e.payload) for e in entries))
                    largest = max(1, min(self.batch_entries, READ_BYTES * len(entries) // got))
                for batch in self._decode(entries, ledger_id, after, previous):
                    previous = batch.last_id
                    yield batch
                next_entry = last + 1
        finally:
            await _cancel(task for _, _, task in inflight)
        async for batch in self._tail(handle, ledger_id, next_entry, after, previous):
            yield batch

    @staticmethod
    async def _read(handle: ReadHandle, first: int, last: int) -> list[EntryData] | None:
        """Entries first..last; None when fragment retention dropped some of them since
        the handle last looked (a reader behind every durable cursor skips ahead). While
        no replica can be read (bookies restarting) it retries for up to READ_RETRY_S
        (streamlib.retry.SCAN_READ): the entries are confirmed, so they come back with
        their bookies."""
        try:
            return await SCAN_READ.replace(stop_after_s=READ_RETRY_S).run(
                f"ledger {handle.ledger_id}: reading entries {first}..{last}",
                lambda: handle.read_entries(first, last),
            )
        except (NoSuchEntryError, BadRequestError):
            if not handle.metadata.unbounded:
                raise
            await handle.refresh_metadata()
            if first >= handle.metadata.first_entry_id:
                raise
            return None

    def _decode(
        self, entries: list[EntryData], ledger_id: int, after: MessageId, previous: MessageId
    ) -> list[EntryMessages]:
        batches = []
        for entry in entries:
            if is_noop(entry.flags):
                continue  # unbounded mode's no-op entries are never messages
            batch = entry_messages(
                self.name, ledger_id, entry.entry_id, entry.payload, previous, after,
                self.keep_raw,
            )  # fmt: skip
            if batch is not None:
                previous = batch.last_id
                batches.append(batch)
        return batches

    async def _tail(
        self,
        handle: ReadHandle,
        ledger_id: int,
        next_entry: int,
        after: MessageId,
        previous: MessageId,
    ) -> AsyncIterator[EntryMessages]:
        while True:
            next_entry = max(next_entry, handle.metadata.first_entry_id)
            end = handle.last_entry_id
            if next_entry <= end:
                last = min(end, next_entry + self.batch_entries - 1)
                entries = await self._read(handle, next_entry, last)
                if entries is None:
                    continue
                for batch in self._decode(entries, ledger_id, after, previous):
                    previous = batch.last_id
                    yield batch
                next_entry = last + 1
                continue
            step = reader_step(handle.is_closed, self.tail)
            if step is ReaderStep.MOVE_ON:
                return
            if step is ReaderStep.STOP:
                self._stopped = True
                return
            # Open: the last ledger (tailing), or one its writer is rolling away from
            # (its close comes through the metadata watch). Never recovered here.
            self.long_polls += 1
            await handle.wait_for_more(next_entry, self.poll_timeout_s)


async def open_for_reading(ledgers: LedgerManager, ledger_id: int) -> ReadHandle | None:
    """Open a stream's ledger as every reader does: without recovery (readers never
    fence; see streamlib.protocol.stream_rules). None if retention deleted it."""
    try:
        return await ledgers.open(ledger_id, password=STREAM_PASSWORD, recover=READERS_MAY_RECOVER)
    except NoSuchLedgerError:
        return None


async def confirmed_stream_end(
    ledgers: LedgerManager, ledger_ids: list[int]
) -> tuple[int, int] | None:
    """The (ledger, entry) of the last entry of the list confirmed now (None if none):
    nothing after a ledger that is still open counts (stream_rules.confirmed_end)."""
    before, tail = ledger_ids[:-OPEN_TAIL], ledger_ids[-OPEN_TAIL:]
    ends = []
    for ledger_id in tail:
        handle = await open_for_reading(ledgers, ledger_id)
        if handle is not None:
            await handle.close()
            first = handle.metadata.first_entry_id
            ends.append(LedgerEnd(ledger_id, handle.is_closed, handle.last_entry_id, first))
    end = confirmed_end(ends)
    for ledger_id in reversed(before):  # all closed: the newest with an entry
        if end is not None:
            break
        handle = await open_for_reading(ledgers, ledger_id)
        if handle is not None and handle.last_entry_id >= handle.metadata.first_entry_id:
            end = (ledger_id, handle.last_entry_id)
    return end


def reading_failed(stream: str, error: Exception) -> StreamlibError:
    """What a reader or consumer raises when reading ahead failed."""
    if isinstance(error, StreamlibError):
        return error
    failed = StreamlibError(f"reading stream {stream!r} failed: {error!r}")
    failed.__cause__ = error
    return failed


def _payload_bytes(item: EntryMessages | BaseException) -> int:
    """The bytes an entry read ahead holds (its payloads, or the entry as stored)."""
    if not isinstance(item, EntryMessages):
        return 0
    return sum(map(len, item.payloads)) + (0 if item.raw is None else len(item.raw))


class EntryQueue:
    """Entries read ahead, up to `limit` messages and `max_bytes` of payload in all (and
    always at least one entry), or an error that ends the reading; and the entry messages
    are taken from now. `ready` is set whenever an item is put (a consumer shares it with
    its redeliveries). The bytes bound is what keeps a queue of large messages small: a
    count alone let 1,000 messages of 100 KiB fill 100 MB."""

    def __init__(
        self,
        limit: int,
        ready: asyncio.Event | None = None,
        schema: Any = None,
        max_bytes: int = RECEIVER_QUEUE_BYTES,
    ) -> None:
        self._schema = schema
        self._items: collections.deque[EntryMessages | BaseException] = collections.deque()
        self._limit = max(1, limit)
        self._max_bytes = max(1, max_bytes)
        self._count = 0  # messages held
        self._bytes = 0  # their payloads' bytes
        self.ready = ready or asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        # The entry being taken from and the index of its next message.
        self._entry: EntryMessages | None = None
        self._index = self._end = 0
        # The pieces of a chunked message taken so far (all of one message, in order).
        self._pieces: list[EntryMessages] = []
        # The position before pieces dropped unfinished: the next message delivered
        # covers them (acknowledging it acknowledges them), so no cursor waits on them.
        self._carry: MessageId | None = None

    def __bool__(self) -> bool:
        """Whether a message (or the error) can be taken now."""
        return self._index < self._end or bool(self._items)

    async def fill(self, scanner: StreamScanner) -> None:
        """Read ahead from the scanner until it ends; a failure is queued, so the reader
        gets it rather than waiting forever."""
        try:
            async for batch in scanner.batches():
                await self.put(batch)
        except Exception as error:
            await self.put(reading_failed(scanner.name, error))

    async def put(self, item: EntryMessages | BaseException) -> None:
        while self._count >= self._limit or self._bytes >= self._max_bytes:
            self._room.clear()
            await self._room.wait()
        if self._schema is not None and isinstance(item, EntryMessages):
            item.schema = self._schema
        self._items.append(item)
        self._count += len(item) if isinstance(item, EntryMessages) else 1
        self._bytes += _payload_bytes(item)
        self.ready.set()

    def take_nowait(self) -> Message | None:
        """The next message, if one is here now; raises the error that ended the reading.
        A chunked message comes whole, once its last piece is here (its id is the last
        piece's; acknowledging it covers every piece); pieces of one that never
        finished (its producer died) are dropped, and the message after them covers
        them."""
        index = self._index
        if index >= self._end:
            if not self._next_entry():
                return None
            index = self._index
        self._index = index + 1
        return new_message(self._entry, index)  # type: ignore[arg-type]

    def take_entry_nowait(self) -> EntryMessages | None:
        """The messages not taken yet of the next entry, whole (a broker dispatches
        entries, not messages); as take_nowait, otherwise."""
        if self._index >= self._end and not self._next_entry():
            return None
        entry = self._entry
        assert entry is not None
        if self._index > entry.start:  # (partly taken one by one: the rest of it)
            rest = copy.copy(entry)
            rest.previous = MessageId(entry.ledger_id, entry.entry_id, self._index - 1)
            rest.start = self._index
            entry = rest
        self._index = self._end
        return entry

    def _next_entry(self) -> bool:
        """Move to the next entry there is now (False: none); raises the error that
        ended the reading."""
        while True:
            if not self._items:
                return False
            item = self._items.popleft()
            self._count -= len(item) if isinstance(item, EntryMessages) else 1
            self._bytes -= _payload_bytes(item)
            self._room.set()
            if isinstance(item, BaseException):
                raise item
            if item.chunk is not None or self._pieces:
                whole = self._assemble(item)
                if whole is None:
                    continue
                item = whole
            if self._carry is not None:
                if item.start == 0:  # (a reader starting inside an entry keeps its own)
                    item.previous = self._carry
                self._carry = None
            self._entry = item  # (never empty: see entry_messages)
            self._index = item.start
            self._end = len(item.payloads)
            return True

    def _assemble(self, item: EntryMessages) -> EntryMessages | None:
        """Take a piece of a chunked message (or an entry after unfinished pieces): the
        whole message once complete, the entry itself when it is no piece, else None."""
        pieces = self._pieces
        chunk = item.chunk
        if pieces:
            first = pieces[0].chunk
            assert first is not None
            if chunk is None or chunk.uuid != first.uuid or chunk.index != len(pieces):
                self._drop_pieces()  # unfinished: its producer went away mid-message
        if chunk is None:
            return item
        if not pieces and chunk.index != 0:
            # A piece without its start (a reader started inside the message): dropped.
            self._carry = self._carry or item.previous
            return None
        pieces.append(item)
        if len(pieces) < chunk.count:
            return None
        self._pieces = []
        first_entry = pieces[0]
        payload = b"".join(p.payloads[0] for p in pieces)
        try:
            if len(payload) != chunk.total_size:
                raise MessageDecodeError("its pieces do not add up to its size")
            if chunk.compression:  # (a Pulsar producer's: compressed whole, then cut)
                where = f"stream {item.stream!r} ledger {item.ledger_id} entry {item.entry_id}"
                payload = decompress(
                    chunk.compression, payload, chunk.uncompressed_size, where,
                    MAX_CHUNKED_MESSAGE_BYTES,
                )  # fmt: skip
        except MessageDecodeError:
            self._carry = self._carry or first_entry.previous
            return None  # a damaged message: dropped as unfinished ones are
        whole = DecodedBatch(
            [payload],
            first_entry.publish_times,
            first_entry.event_times,
            first_entry.metadata,
            first_entry.deliver_at,
            None,
            first_entry.sequence_ids,
            first_entry.producers,
            first_entry.null_values,
        )
        assembled = EntryMessages(
            item.stream, item.ledger_id, item.entry_id, whole, first_entry.previous
        )
        assembled.schema = item.schema
        return assembled

    def _drop_pieces(self) -> None:
        if self._pieces:
            self._carry = self._carry or self._pieces[0].previous
            self._pieces = []

    async def take(self, timeout: float | None) -> Message:
        """The next message; TimeoutError if none comes within timeout seconds."""
        return await self._until(self.take_nowait, timeout)

    async def take_entry(self, timeout: float | None) -> EntryMessages:
        """The next entry's messages not taken yet, whole (as take_entry_nowait);
        TimeoutError if none comes within timeout seconds."""
        return await self._until(self.take_entry_nowait, timeout)

    async def _until(self, take: Callable[[], T | None], timeout: float | None) -> T:
        found = take()
        if found is None:
            async with asyncio.timeout(timeout):
                while found is None:
                    self.ready.clear()
                    await self.ready.wait()
                    found = take()
        return found


class Feed(Protocol):
    """What a Reader reads from: messages after a start, in order -- in direct mode the
    stream's ledgers (ScannerFeed), through the stream service a broker's reader session
    (streamlib/service/subscription.py)."""

    def take_nowait(self) -> Message | None: ...

    async def take(self, timeout: float | None) -> Message: ...

    def has_queued(self) -> bool: ...

    async def restart(self, start: MessageId | int, inclusive: bool) -> MessageId | None: ...

    async def last_message(self) -> MessageId | None: ...

    async def close(self) -> None: ...


class ScannerFeed:
    """Direct mode's feed: the stream's ledgers, whole entries read ahead."""

    def __init__(self, scanner: StreamScanner, queue_size: int, schema: Any) -> None:
        self._scanner = scanner
        self._queue_size = queue_size
        self._schema = schema
        self._queue = EntryQueue(queue_size, schema=schema)
        self._task: asyncio.Task[None] | None = None

    def take_nowait(self) -> Message | None:
        return self._queue.take_nowait()

    async def take(self, timeout: float | None) -> Message:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._queue.fill(self._scanner))
        return await self._queue.take(timeout)

    def has_queued(self) -> bool:
        return bool(self._queue)

    def keep_entries(self) -> None:
        """Keep the bytes of the entries read (a broker hands entries on as stored)."""
        self._scanner.keep_raw = True

    async def take_entry(self, timeout: float | None) -> EntryMessages:
        """The messages not read yet of the next entry, whole (a broker's reader
        session sends entries as they are stored); TimeoutError if none comes in time."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._queue.fill(self._scanner))
        return await self._queue.take_entry(timeout)

    def take_entry_nowait(self) -> EntryMessages | None:
        return self._queue.take_entry_nowait()

    async def restart(self, start: MessageId | int, inclusive: bool) -> MessageId:
        """Read after `start` next (a position, as a reader's start; or epoch ms: from the
        first message published then or later); the position it reads after."""
        if isinstance(start, MessageId):
            after = await self._scanner.start_position(start, inclusive)
        else:
            after = await self._scanner.position_before_time(start)
        if after == LATEST:  # (fixed now: what is published from here on is read)
            after = await self._scanner.end_position()
        await self.close()
        self._scanner.start_after = after
        self._queue = EntryQueue(self._queue_size, schema=self._schema)
        return after

    async def last_message(self) -> MessageId | None:
        return await self._scanner.last_message()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class Reader:
    """A non-durable reader: reads from a position, remembers nothing (either mode)."""

    def __init__(self, feed: Feed, stream: str, start_after: MessageId, inclusive: bool) -> None:
        self._feed = feed
        self._inclusive = inclusive
        self._last: MessageId | Message = start_after  # the last read (or the start)
        self.stream = stream

    async def read_next(self, timeout: float | None = None) -> Message:
        """The next message; TimeoutError if none comes within timeout seconds."""
        message = self._feed.take_nowait()  # the common case while catching up
        if message is None:
            try:
                message = await self._feed.take(timeout)
            except builtins.TimeoutError:
                raise StreamTimeoutError(
                    f"no message on {self.stream!r} within {timeout} s"
                ) from None
        self._last = message  # its position is computed only if asked for
        return message

    async def has_message_available(self) -> bool:
        """Whether a message after the last one read is there now."""
        if self._feed.has_queued():
            return True
        end = await self._feed.last_message()
        last = self._last if isinstance(self._last, MessageId) else self._last.message_id
        if end is None or last == LATEST:
            return False
        return end > last

    async def seek(self, position: MessageId | str | int) -> None:
        """Read from `position` next, as the reader's start: just after that message, or
        from it if the reader was made with start_message_id_inclusive (EARLIEST / LATEST
        allowed); an int is epoch milliseconds: from the first message published then
        or later. (Pulsar's rule; a Consumer's seek always includes the message.)"""
        if isinstance(position, bool):
            raise BadRequestError(f"seek takes a MessageId or epoch milliseconds, not {position}")
        start = position if isinstance(position, int) else parse_start(position)
        after = await self._feed.restart(start, self._inclusive)
        self._last = EARLIEST if after is None else after

    async def close(self) -> None:
        await self._feed.close()

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> Message:
        return await self.read_next()
