"""Planning reads of streams for Spark, without Spark: offsets, partitions (segments: a
contiguous run of a stream's entries, across ledgers), admission control by message
count, and reading one segment.

Offsets are positions: for every stream, the MessageId of the last message already
read (EARLIEST when none). A micro-batch or batch read covers the messages strictly
after its start offset up to and including its end offset. The end of a stream is what
is confirmed now: a closed ledger's last entry, the LAC of an open one (so a reader
never disturbs the writer: ledgers are opened with recover=False).

Read compacted (option readCompacted), (after, until] is what a compacted reader after
`after` reads up to `until` (streamlib/stream/compacted.py): when `after` is before the
horizon of the stream's compacted view, the view's messages in (after, until] -- segments
of the view's own ledger, whose entries are CompactedEntry (each message keeps its id in
the stream, so offsets mean the same in the view and in the stream) -- then the stream's
in (horizon, until]; otherwise the stream's in (after, until]. The view is the one
installed when the partitions are planned; its ledger, or a stream ledger after its
horizon, gone by the time a task reads it (the stream was compacted again and trimmed)
fails the task with CompactedViewChangedError rather than leave messages out: plan the
read again.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError

from streamlib.client import Client
from streamlib.ledger.handles import ReadHandle
from streamlib.protocol.actions import EntryData, is_noop
from streamlib.protocol.compaction import reads_view
from streamlib.protocol.errors import (
    BadRequestError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StreamlibError,
)
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import MessageDecodeError
from streamlib.stream.compacted import CompactedScanner, View, view_of
from streamlib.stream.message import entry_messages
from streamlib.stream.positions import EARLIEST, LATEST, MessageId, parse_start
from streamlib.stream.reader import (
    READ_AHEAD,
    READ_BYTES,
    Message,
    confirmed_stream_end,
    decode_entry,
    open_for_reading,
)

# Entries fetched per read call when the driver counts messages (admission control).
READ_ENTRIES = 256
# An executor reads a segment in ranges that start at FIRST_READ_ENTRIES entries and
# double up to about READ_BYTES (at most MAX_READ_ENTRIES entries), READ_AHEAD of them in
# flight while one is decoded, as a catch-up Reader does.
FIRST_READ_ENTRIES = 16
MAX_READ_ENTRIES = 4096


K = TypeVar("K", bound=Hashable)


class InvalidOffsetsError(BadRequestError):
    """startingOffsets / endingOffsets is not earliest, latest or a JSON object of
    stream -> position."""


class CompactedViewChangedError(StreamlibError):
    """A compacted read's view ledger, or a stream ledger after its horizon, was deleted
    after the read was planned (the stream was compacted again, and trimmed): reading on
    would leave messages out. Run the read again (a streaming query: restart it), and it
    is planned over the new view."""


@dataclass(frozen=True)
class LedgerRange:
    """Entries first..last of one ledger."""

    ledger_id: int
    first_entry: int
    last_entry: int

    def __len__(self) -> int:
        return self.last_entry - self.first_entry + 1


@dataclass(frozen=True)
class Segment:
    """The part of one stream a Spark task reads: contiguous entry ranges of its ledgers
    (in stream order), keeping only the messages in (after, until]. Plain data: it is
    pickled to executors.

    view: the ranges are of the stream's compacted view's ledger (CompactedEntry
    entries: view_entry). compacted: part of a compacted read, so a ledger gone since
    planning is CompactedViewChangedError, not "trimmed by retention: nothing to read"."""

    stream: str
    ranges: tuple[LedgerRange, ...]
    after: MessageId
    until: MessageId
    view: bool = False
    compacted: bool = False


def entry_end(ledger_id: int, entry_id: int) -> MessageId:
    """The position of the last message of an entry, whatever its batch size."""
    return MessageId(ledger_id, entry_id, LATEST.batch_index)


def parse_streams(value: str | None) -> list[str]:
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    if not names:
        raise BadRequestError("option 'stream' is required: one stream name or a comma list")
    if len(set(names)) != len(names):
        raise BadRequestError(f"option 'stream' names a stream twice: {value!r}")
    return names


async def expand_partitions(client: Client, names: list[str]) -> list[str]:
    """Each partitioned stream as its partitions (NAME-partition-0, ...), in order; a
    name that is not partitioned (or does not exist: the read says so) as itself."""
    from streamlib.stream.admin import partition_name

    out: list[str] = []
    for name in names:
        try:
            count = await client.streams.partitions(name)
        except StreamlibError:
            count = 0
        out += [partition_name(name, i) for i in range(count)] if count else [name]
    if len(set(out)) != len(out):
        raise BadRequestError(f"option 'stream' names a partition twice: {names!r}")
    return out


def parse_offsets(value: str, streams: list[str], option: str) -> dict[str, MessageId | str]:
    """'earliest' | 'latest' | JSON {"stream": "ledger:entry:index" | "earliest" | "latest"}.
    The symbolic 'latest' is resolved against the streams later (it needs a client)."""
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return dict.fromkeys(streams, text.lower())
    try:
        given = json.loads(text)
    except ValueError:
        raise InvalidOffsetsError(
            f"{option} must be earliest, latest or JSON like "
            f'{{"{streams[0]}": "3:0:5"}}, got {value!r}'
        ) from None
    if not isinstance(given, dict):
        raise InvalidOffsetsError(f"{option} JSON must be an object, got {value!r}")
    unknown = set(given) - set(streams)
    if unknown:
        raise InvalidOffsetsError(f"{option} names streams not read: {sorted(unknown)}")
    result: dict[str, MessageId | str] = {}
    for name in streams:
        position = given.get(name, "earliest" if option == "startingOffsets" else "latest")
        if not isinstance(position, str):
            raise InvalidOffsetsError(f"{option}[{name!r}] must be a string, got {position!r}")
        if position.lower() in ("earliest", "latest"):
            result[name] = position.lower()
        else:
            try:
                result[name] = parse_start(position)
            except BadRequestError as error:
                raise InvalidOffsetsError(f"{option}[{name!r}]: {error}") from None
    return result


def to_json(offsets: dict[str, MessageId]) -> dict[str, str]:
    return {name: str(position) for name, position in sorted(offsets.items())}


def from_json(offsets: dict[str, str]) -> dict[str, MessageId]:
    return {name: MessageId.parse(position) for name, position in offsets.items()}


def parse_read_compacted(value: str | None) -> bool:
    """The readCompacted option: true | false (any case; default false)."""
    text = (value or "false").strip().lower()
    if text not in ("true", "false"):
        raise BadRequestError(f"option 'readCompacted' must be true or false, got {value!r}")
    return text == "true"


async def compacted_views(client: Client, streams: list[str]) -> dict[str, View | None]:
    """The compacted view installed now of each stream (None: never compacted)."""
    found = {}
    for name in streams:
        md, _ = await client.streams.read(name)
        found[name] = view_of(md)
    return found


def view_entry(payload: bytes, where: str) -> tuple[int, int, int, bytes]:
    """A compacted view's entry: (the stream ledger and entry its messages are of, the
    index of its first kept message, the batch -- placeholders before that index)."""
    stored = envelope.CompactedEntry()
    try:
        stored.ParseFromString(payload)
    except DecodeError as error:
        raise MessageDecodeError(f"{where}: not a compacted entry ({error})") from None
    return stored.ledger_id, stored.entry_id, stored.first_index, stored.batch


async def _ledger_ids(client: Client, stream: str) -> list[int]:
    md, _ = await client.streams.read(stream)
    return [info.ledger_id for info in md.ledgers]


async def end_position(client: Client, stream: str) -> MessageId:
    """The last message confirmed now (EARLIEST for a stream with none); never past a
    ledger that is still open (its writer may still be rolling away from it)."""
    end = await confirmed_stream_end(client.ledgers, await _ledger_ids(client, stream))
    return EARLIEST if end is None else entry_end(*end)


async def resolve(
    client: Client, offsets: dict[str, MessageId | str], latest_is_end: bool
) -> dict[str, MessageId]:
    """Symbolic offsets to positions: earliest -> EARLIEST; latest -> the end now."""
    resolved = {}
    for name, position in offsets.items():
        if position == "earliest":
            resolved[name] = EARLIEST
        elif position == "latest" or (latest_is_end and position == LATEST):
            resolved[name] = await end_position(client, name)
        else:
            assert isinstance(position, MessageId)
            resolved[name] = position
    return resolved


async def _ranges(
    client: Client, stream: str, after: MessageId, until: MessageId
) -> AsyncIterator[tuple[ReadHandle, int, int]]:
    """(handle, first entry, last entry) of every ledger holding messages in (after, until],
    clipped to what is confirmed; handles are closed by the caller's iteration."""
    for ledger_id in await _ledger_ids(client, stream):
        if ledger_id < after.ledger_id or ledger_id > until.ledger_id:
            continue
        handle = await open_for_reading(client.ledgers, ledger_id)
        if handle is None:
            continue
        try:
            first = handle.metadata.first_entry_id
            if ledger_id == after.ledger_id:
                first = max(first, after.entry_id)
            last = handle.last_entry_id
            if ledger_id == until.ledger_id:
                last = min(last, until.entry_id)
            if first <= last:
                yield handle, first, last
        finally:
            await handle.close()


async def ledger_ranges(
    client: Client, stream: str, after: MessageId, until: MessageId
) -> list[LedgerRange]:
    """The entry ranges holding the stream's messages in (after, until], in order."""
    return [
        LedgerRange(handle.ledger_id, first, last)
        async for handle, first, last in _ranges(client, stream, after, until)
    ]


def split(
    stream: str,
    ranges: list[LedgerRange],
    after: MessageId,
    until: MessageId,
    pieces: int,
    max_entries: int | None = None,
    *,
    view: bool = False,
    compacted: bool = False,
) -> list[Segment]:
    """The ranges cut into `pieces` segments of (nearly) as many entries each, or more
    when a segment would hold more than max_entries; each segment is contiguous in the
    stream and may span ledgers (a task then reads few, large ranges). view, compacted:
    the segments' flags (Segment)."""
    total = sum(len(r) for r in ranges)
    if not total:
        return []
    if max_entries is not None:
        pieces = max(pieces, -(-total // max_entries))
    pieces = max(1, min(pieces, total))
    ends = [total * (i + 1) // pieces for i in range(pieces)]  # counted from the start
    found: list[Segment] = []
    taken: list[LedgerRange] = []
    position = 0
    for r in ranges:
        first = r.first_entry
        while first <= r.last_entry:
            take = min(r.last_entry - first + 1, ends[len(found)] - position)
            taken.append(LedgerRange(r.ledger_id, first, first + take - 1))
            first += take
            position += take
            if position == ends[len(found)]:
                found.append(Segment(stream, tuple(taken), after, until, view, compacted))
                taken = []
    return found


async def segments(
    client: Client,
    stream: str,
    after: MessageId,
    until: MessageId,
    entries_per_partition: int | None = None,
    pieces: int = 1,
) -> list[Segment]:
    """Input partitions of (after, until]: `pieces` segments, more if one would hold
    more than entries_per_partition entries, so tasks read in parallel."""
    ranges = await ledger_ranges(client, stream, after, until)
    return split(stream, ranges, after, until, pieces, entries_per_partition)


def share_partitions(entries: Mapping[K, int], wanted: int) -> dict[K, int]:
    """How many segments each part's entries (a stream's, or a compacted view's) are cut
    into: `wanted` in all, shared by entries, at least one for every part with something
    to read."""
    total = sum(entries.values())
    return {name: max(1, round(wanted * count / total)) for name, count in entries.items() if count}


@dataclass(frozen=True)
class _Part:
    """Ranges of one stream (or of its view) that split() cuts into segments."""

    stream: str
    ranges: list[LedgerRange]
    after: MessageId
    until: MessageId
    view: bool = False
    compacted: bool = False


async def _parts(
    client: Client, stream: str, after: MessageId, until: MessageId, view: View | None
) -> list[_Part]:
    """What a read of (after, until] covers: the view's entries if it reads the view
    (streamlib.protocol.compaction.reads_view), then the stream's after the horizon."""
    parts = []
    if view is not None and reads_view(after, view.horizon):
        if view.entries:
            ranges = [LedgerRange(view.ledger_id, 0, view.entries - 1)]
            parts.append(_Part(stream, ranges, after, min(until, view.horizon), True, True))
        after = max(after, view.horizon)
    if after < until:
        ranges = await ledger_ranges(client, stream, after, until)
        parts.append(_Part(stream, ranges, after, until, False, view is not None))
    return parts


async def plan_segments(
    client: Client,
    streams: list[str],
    start: dict[str, MessageId],
    end: dict[str, MessageId],
    wanted: int,
    entries_per_partition: int | None,
    views: Mapping[str, View | None] | None = None,
) -> list[Segment]:
    """The input partitions of a read of `streams` from start to end: about `wanted`
    of them (a task per core reads few, large ranges: every task costs Spark far more
    than a range read), more if a segment would pass entries_per_partition entries.
    views: a compacted read (compacted_views, looked up before the end is resolved, so
    a view's horizon is not past it): each stream's view, its segments first."""
    parts = [
        part
        for name in streams
        if start[name] < end[name]
        for part in await _parts(
            client, name, start[name], end[name], None if views is None else views.get(name)
        )
    ]
    pieces = share_partitions(
        {i: sum(len(r) for r in p.ranges) for i, p in enumerate(parts)}, wanted
    )
    found: list[Segment] = []
    for i, count in pieces.items():
        p = parts[i]
        found += split(
            p.stream, p.ranges, p.after, p.until, count, entries_per_partition,
            view=p.view, compacted=p.compacted,
        )  # fmt: skip
    return found


def _messages(stream: str, ledger_id: int, entries: Iterable[EntryData]) -> Iterable[Message]:
    for entry in entries:
        if is_noop(entry.flags):
            continue  # unbounded mode's no-op entries are never messages
        yield from decode_entry(stream, ledger_id, entry.entry_id, entry.payload, EARLIEST)


async def _scan(
    client: Client, stream: str, after: MessageId, until: MessageId
) -> AsyncIterator[list[Message]]:
    """The messages in (after, until], one list per read call."""
    async for handle, first, last in _ranges(client, stream, after, until):
        for start in range(first, last + 1, READ_ENTRIES):
            end = min(last, start + READ_ENTRIES - 1)
            entries = await handle.read_entries(start, end)
            batch = [
                m
                for m in _messages(stream, handle.ledger_id, entries)
                if after < m.message_id <= until
            ]
            if batch:
                yield batch


async def _open_part(client: Client, segment: Segment, ledger_id: int) -> ReadHandle | None:
    """A segment's ledger opened for reading (without recovery); None: gone, and nothing
    is left to read of it (CompactedViewChangedError for a compacted read)."""
    if segment.view:  # (the compactor's own ledger: crc32c, read without its password)
        try:
            handle: ReadHandle | None = await client.ledgers.open(
                ledger_id, password=None, recover=False
            )
        except NoSuchLedgerError:
            handle = None
    else:
        handle = await open_for_reading(client.ledgers, ledger_id)
    if handle is None and segment.compacted:
        raise _changed(segment, ledger_id)
    return handle


def _changed(segment: Segment, ledger_id: int) -> CompactedViewChangedError:
    what = "compacted view ledger" if segment.view else "ledger"
    return CompactedViewChangedError(
        f"stream {segment.stream!r}: {what} {ledger_id} was deleted after this compacted "
        f"read was planned (the stream was compacted again): run the read again"
    )


async def _deleted(client: Client, ledger_id: int) -> bool:
    try:
        await client.ledgers.metadata(ledger_id)
    except NoSuchLedgerError:
        return True
    return False


async def segment_entries(
    client: Client, segment: Segment
) -> AsyncIterator[tuple[int, list[EntryData]]]:
    """(ledger id, entries) for the whole segment, in order, no-op entries left out
    (filter messages by after/until): each ledger range read in growing ranges with
    read-ahead."""
    for part in segment.ranges:
        handle = await _open_part(client, segment, part.ledger_id)
        if handle is None:
            continue  # trimmed by retention after planning: nothing left to read
        try:
            if handle.last_entry_id < part.last_entry:
                raise BadRequestError(
                    f"stream {segment.stream!r} ledger {part.ledger_id}: planned entry "
                    f"{part.last_entry} is past the confirmed end {handle.last_entry_id}"
                )
            async for entries in _read_ahead(handle, part.first_entry, part.last_entry):
                yield part.ledger_id, [e for e in entries if not is_noop(e.flags)]
        except (NoSuchLedgerError, NoSuchEntryError):
            # (deleted while this task read it: its bookies answer so once they collect it)
            if segment.compacted and await _deleted(client, part.ledger_id):
                raise _changed(segment, part.ledger_id) from None
            raise
        finally:
            await handle.close()


async def _read_ahead(handle: ReadHandle, first: int, last: int) -> AsyncIterator[list[EntryData]]:
    inflight: collections.deque[asyncio.Task[list[EntryData]]] = collections.deque()
    size, largest = FIRST_READ_ENTRIES, MAX_READ_ENTRIES
    fetch = first
    try:
        while fetch <= last or inflight:
            while len(inflight) < READ_AHEAD and fetch <= last:
                end = min(last, fetch + size - 1)
                inflight.append(asyncio.ensure_future(handle.read_entries(fetch, end)))
                fetch = end + 1
                size = min(2 * size, largest)
            entries = await inflight.popleft()
            if entries:  # size the next ranges by the bytes per entry seen
                got = max(1, sum(len(e.payload) for e in entries))
                largest = max(1, min(MAX_READ_ENTRIES, READ_BYTES * len(entries) // got))
            yield entries
    finally:
        for task in inflight:
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)


def _view_messages(
    stream: str, view_ledger: int, entries: Iterable[EntryData]
) -> Iterable[Message]:
    for entry in entries:
        where = f"stream {stream!r} compacted view ledger {view_ledger} entry {entry.entry_id}"
        ledger_id, entry_id, first, batch = view_entry(entry.payload, where)
        found = entry_messages(stream, ledger_id, entry_id, batch, EARLIEST)
        if found is not None:
            found.start = max(found.start, first)  # (placeholders before it)
            yield from found


async def read_segment(client: Client, segment: Segment) -> list[Message]:
    """The segment's messages as Message objects (for tests and tools; Spark tasks build
    Arrow columns instead: streamlib.spark.rows)."""
    found: list[Message] = []
    decode = _view_messages if segment.view else _messages
    async for ledger_id, entries in segment_entries(client, segment):
        found.extend(
            m
            for m in decode(segment.stream, ledger_id, entries)
            if segment.after < m.message_id <= segment.until
        )
    return found


async def _scan_compacted(
    client: Client, stream: str, after: MessageId, until: MessageId
) -> AsyncIterator[list[Message]]:
    """The messages a compacted reader after `after` reads, up to `until`, one list per
    entry (of the view or of the stream)."""
    scanner = CompactedScanner(client.ledgers, client.streams.registry, stream, after, tail=False)
    scanner.until = until
    async for batch in scanner.batches():
        found = [m for m in batch if after < m.message_id <= until]
        if found:
            yield found


async def advance(
    client: Client,
    stream: str,
    after: MessageId,
    until: MessageId,
    max_messages: int,
    compacted: bool = False,
) -> tuple[MessageId, int]:
    """Admission control: the position after at most max_messages messages past `after`
    (never beyond `until`), and how many messages that admits (compacted: counted as a
    compacted read reads them)."""
    if max_messages <= 0 or after >= until:
        return after, 0
    position, count = after, 0
    scan = _scan_compacted if compacted else _scan
    async for batch in scan(client, stream, after, until):
        take = batch[: max_messages - count]
        position = take[-1].message_id
        count += len(take)
        if count >= max_messages:
            break
    return position, count


def split_budget(total: int, streams: list[str]) -> dict[str, int]:
    """A message budget shared as evenly as possible, earlier streams getting the rest."""
    share, rest = divmod(total, len(streams))
    return {name: share + (1 if i < rest else 0) for i, name in enumerate(streams)}
