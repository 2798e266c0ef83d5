"""Reading a stream: the scanner (messages after a position, across the ledger list,
tailing the current ledger with the bookies' long-poll) and the non-durable Reader."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Iterable
from typing import Any

from google.protobuf.message import DecodeError

from bookie.wire import bookie_pb2 as pb
from metadata.services.streams import StreamRegistry
from streamlib.ledger.handles import ReadHandle
from streamlib.ledger.manager import LedgerManager
from streamlib.protocol.actions import EntryData
from streamlib.protocol.errors import (
    BadRequestError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StreamlibError,
)
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.positions import EARLIEST, LATEST, MessageId, parse_start
from streamlib.stream.writer import STREAM_PASSWORD


class MessageDecodeError(StreamlibError):
    """An entry of a stream is not a message batch (written outside the stream API?)."""


class _Entry:
    """What the messages of one entry share."""

    __slots__ = ("entry_id", "ledger_id", "previous", "stream")

    def __init__(self, stream: str, ledger_id: int, entry_id: int, previous: MessageId) -> None:
        self.stream = stream
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.previous = previous  # the position before the entry's first message


_new_id = tuple.__new__


class Message:
    """One message as consumers see it. Its fields are read from the entry's envelope
    when first used, and its position is computed when asked for: reading many messages
    costs little until they are looked at (catch-up reads create one per message)."""

    # _prev and _redeliveries are set only when they differ from what the entry implies.
    __slots__ = ("_entry", "_index", "_pb", "_prev", "_redeliveries")

    def __init__(
        self,
        stream: str,
        message_id: MessageId,
        envelope_message: envelope.Message,
        previous: MessageId = EARLIEST,
        redelivery_count: int = 0,
    ) -> None:
        self._entry = _Entry(stream, message_id.ledger_id, message_id.entry_id, previous)
        self._index = message_id.batch_index
        self._pb = envelope_message
        self._prev = previous
        self._redeliveries = redelivery_count

    @property
    def stream(self) -> str:
        return self._entry.stream

    @property
    def message_id(self) -> MessageId:
        entry = self._entry
        return _new_id(MessageId, (entry.ledger_id, entry.entry_id, self._index))

    @property
    def previous(self) -> MessageId:
        """The message delivered before this one (cursor ranges)."""
        try:
            return self._prev
        except AttributeError:
            entry = self._entry
            if self._index == 0:
                return entry.previous
            return _new_id(MessageId, (entry.ledger_id, entry.entry_id, self._index - 1))

    @previous.setter
    def previous(self, value: MessageId) -> None:
        self._prev = value

    @property
    def redelivery_count(self) -> int:
        try:
            return self._redeliveries
        except AttributeError:
            return 0

    @property
    def data(self) -> bytes:
        return self._pb.payload

    def value(self) -> bytes:
        return self._pb.payload

    @property
    def key(self) -> str | None:
        return self._pb.key if self._pb.HasField("key") else None

    @property
    def properties(self) -> dict[str, str]:
        return dict(self._pb.properties)

    @property
    def publish_time_ms(self) -> int:
        return self._pb.publish_time_ms

    @property
    def event_time_ms(self) -> int:
        """0 when the producer set none."""
        return self._pb.event_time_ms

    def redelivered(self) -> Message:
        """The same message, delivered once more."""
        return Message(
            self.stream, self.message_id, self._pb, self.previous, self.redelivery_count + 1
        )

    def __repr__(self) -> str:
        return f"Message({self.stream!r}, {self.message_id}, {self.data[:40]!r})"


def decode_entry(
    stream: str, ledger_id: int, entry_id: int, payload: bytes, previous: MessageId
) -> list[Message]:
    try:
        batch = envelope.Batch.FromString(payload)
    except DecodeError as error:
        raise MessageDecodeError(
            f"stream {stream!r} ledger {ledger_id} entry {entry_id} is not a message batch"
        ) from error
    shared = _Entry(stream, ledger_id, entry_id, previous)
    messages: list[Message] = []
    append = messages.append
    new = object.__new__
    for index, m in enumerate(batch.messages):  # the hot loop of catch-up reads
        message = new(Message)
        message._entry = shared
        message._index = index
        message._pb = m
        append(message)
    return messages


FIRST_READ_ENTRIES = 4  # the first range of a catch-up read; ranges double from there
READ_AHEAD = 3  # ranges in flight while one is consumed


async def _cancel(tasks: Iterable[asyncio.Task[Any]]) -> None:
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


class StreamScanner:
    """Messages strictly after `start_after`, in stream order. With tail=True it waits
    for new messages (long-poll) and follows rolls; with tail=False it stops at the end
    that is confirmed now."""

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

    async def end_position(self) -> MessageId:
        """The position of the last message confirmed now (EARLIEST if none)."""
        md, _ = await self._registry.read(self.name)
        for info in reversed(md.ledgers):
            try:
                handle = await self._ledgers.open(
                    info.ledger_id, password=STREAM_PASSWORD, recover=False
                )
            except NoSuchLedgerError:
                continue
            if handle.last_entry_id >= 0:
                return MessageId(info.ledger_id, handle.last_entry_id, LATEST.batch_index)
        return EARLIEST

    async def messages(self) -> AsyncIterator[Message]:
        async for batch in self.batches():
            for message in batch:
                yield message

    async def batches(self) -> AsyncIterator[list[Message]]:
        """The messages of each entry, in order (never an empty list)."""
        after = self.start_after
        if after == LATEST:
            after = await self.end_position()
        previous = after
        watch = self._registry.store.watch(self._registry.stream_path(self.name))
        finished: int | None = None  # the last ledger read to its end
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
                async for batch in self._ledger_messages(ledger_id, after, previous, ids):
                    previous = batch[-1].message_id
                    yield batch
                finished = ledger_id
                if not self.tail and ledger_id == ids[-1]:
                    return
        finally:
            await watch.close()

    async def _wait(self, watch: object) -> None:
        try:
            await watch.next(self.poll_timeout_s)  # type: ignore[attr-defined]
        except TimeoutError:
            pass

    async def _open(self, ledger_id: int, recover: bool) -> ReadHandle | None:
        try:
            return await self._ledgers.open(ledger_id, password=STREAM_PASSWORD, recover=recover)
        except NoSuchLedgerError:
            return None  # trimmed by retention meanwhile

    async def _ledger_messages(
        self,
        ledger_id: int,
        after: MessageId,
        previous: MessageId,
        ids: list[int],
    ) -> AsyncIterator[list[Message]]:
        is_last = ledger_id == ids[-1]
        # A ledger that is no longer the last was rolled away from (or abandoned by a
        # crashed writer): recovering it gives its final end. The last one is tailed.
        handle = await self._open(ledger_id, recover=not is_last)
        if handle is None:
            return
        try:
            async for batch in self._entries(handle, ledger_id, after, previous):
                yield batch
        finally:
            await handle.close()

    async def _entries(
        self, handle: ReadHandle, ledger_id: int, after: MessageId, previous: MessageId
    ) -> AsyncIterator[list[Message]]:
        next_entry = max(after.entry_id, 0) if after.ledger_id == ledger_id else 0
        # Read-ahead: READ_AHEAD ranges in flight while one is decoded and consumed. The
        # first ranges are small so the first messages come soon; then they grow.
        inflight: collections.deque[tuple[int, int, asyncio.Task[list[EntryData] | None]]]
        inflight = collections.deque()
        size = min(FIRST_READ_ENTRIES, self.batch_entries)
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
                    size = min(2 * size, self.batch_entries)
                if not inflight:
                    break
                _, last, read = inflight.popleft()
                entries = await read
                if entries is None:  # dropped meanwhile: on from the new first entry
                    await _cancel(task for _, _, task in inflight)
                    inflight.clear()
                    continue
                for batch in self._decode(entries, ledger_id, after, previous):
                    previous = batch[-1].message_id
                    yield batch
                next_entry = last + 1
        finally:
            await _cancel(task for _, _, task in inflight)
        async for batch in self._tail(handle, ledger_id, next_entry, after, previous):
            yield batch

    @staticmethod
    async def _read(handle: ReadHandle, first: int, last: int) -> list[EntryData] | None:
        """Entries first..last; None when fragment retention dropped some of them since
        the handle last looked (a reader behind every durable cursor skips ahead)."""
        try:
            return await handle.read_entries(first, last)
        except (NoSuchEntryError, BadRequestError):
            if not handle.metadata.unbounded:
                raise
            await handle.refresh_metadata()
            if first >= handle.metadata.first_entry_id:
                raise
            return None

    def _decode(
        self, entries: list[EntryData], ledger_id: int, after: MessageId, previous: MessageId
    ) -> list[list[Message]]:
        batches = []
        for entry in entries:
            if entry.flags & pb.TRUNCATE:
                continue  # unbounded mode's no-op entries are never messages
            batch = decode_entry(self.name, ledger_id, entry.entry_id, entry.payload, previous)
            if batch and batch[0].message_id <= after:
                batch = [m for m in batch if m.message_id > after]
                if batch:
                    batch[0].previous = after
            if batch:
                previous = batch[-1].message_id
                batches.append(batch)
        return batches

    async def _tail(
        self,
        handle: ReadHandle,
        ledger_id: int,
        next_entry: int,
        after: MessageId,
        previous: MessageId,
    ) -> AsyncIterator[list[Message]]:
        while True:
            next_entry = max(next_entry, handle.metadata.first_entry_id)
            end = handle.last_entry_id
            if next_entry <= end:
                last = min(end, next_entry + self.batch_entries - 1)
                entries = await self._read(handle, next_entry, last)
                if entries is None:
                    continue
                for batch in self._decode(entries, ledger_id, after, previous):
                    previous = batch[-1].message_id
                    yield batch
                next_entry = last + 1
                continue
            if handle.is_closed:
                return
            if not self.tail:
                return
            self.long_polls += 1
            before = handle.last_entry_id
            await handle.wait_for_more(next_entry, self.poll_timeout_s)
            # A poll that brought nothing may mean the writer crashed after adding a newer
            # ledger to the list: then this ledger is recovered for its end.
            idle = handle.last_entry_id == before and not handle.is_closed
            if idle and await self._superseded(ledger_id):
                recovered = await self._open(ledger_id, recover=True)
                if recovered is None:
                    return
                await handle.close()
                handle = recovered

    async def _superseded(self, ledger_id: int) -> bool:
        md, _ = await self._registry.read(self.name)
        return bool(md.ledgers) and md.ledgers[-1].ledger_id != ledger_id


class Reader:
    """A non-durable reader: reads from a position, remembers nothing."""

    def __init__(self, scanner: StreamScanner, *, queue_size: int = 1000) -> None:
        self._scanner = scanner
        # Whole entries travel through the queue; single messages come off `_buffer`.
        self._queue: asyncio.Queue[list[Message] | BaseException] = asyncio.Queue(
            max(1, queue_size // 16)
        )
        self._buffer: collections.deque[Message] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._last: MessageId | Message = scanner.start_after  # the last read (or start)
        self.stream = scanner.name

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._fill())

    async def _fill(self) -> None:
        try:
            async for batch in self._scanner.batches():
                await self._queue.put(batch)
        except StreamlibError as error:
            await self._queue.put(error)

    async def read_next(self, timeout: float | None = None) -> Message:
        """The next message; TimeoutError if none comes within timeout seconds."""
        if not self._buffer:
            self._start()
            if self._queue.empty():
                item = await asyncio.wait_for(self._queue.get(), timeout)
            else:
                item = self._queue.get_nowait()  # the common case while catching up
            if isinstance(item, BaseException):
                raise item
            self._buffer.extend(item)
        message = self._buffer.popleft()
        self._last = message  # its position is computed only if asked for
        return message

    async def has_message_available(self) -> bool:
        if self._buffer or not self._queue.empty():
            return True
        end = await self._scanner.end_position()
        last = self._last if isinstance(self._last, MessageId) else self._last.message_id
        if last == LATEST:
            return False
        return end != EARLIEST and (end.ledger_id, end.entry_id) > (last.ledger_id, last.entry_id)

    async def seek(self, position: MessageId | str) -> None:
        """Read from just after position next (EARLIEST / LATEST allowed)."""
        await self._stop()
        self._scanner.start_after = parse_start(position)
        self._last = self._scanner.start_after
        self._queue = asyncio.Queue(self._queue.maxsize)
        self._buffer.clear()

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def close(self) -> None:
        await self._stop()

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> Message:
        return await self.read_next()
