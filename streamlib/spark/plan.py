"""Planning reads of streams for Spark, without Spark: offsets, partitions (segments: a
contiguous run of a stream's entries, across ledgers), admission control by message
count, and reading one segment.

Offsets are positions: for every stream, the MessageId of the last message already
read (EARLIEST when none). A micro-batch or batch read covers the messages strictly
after its start offset up to and including its end offset. The end of a stream is what
is confirmed now: a closed ledger's last entry, the LAC of an open one (so a reader
never disturbs the writer: ledgers are opened with recover=False).
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from streamlib.client import Client
from streamlib.ledger.handles import ReadHandle
from streamlib.protocol.actions import EntryData, is_noop
from streamlib.protocol.errors import BadRequestError, StreamlibError
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


class InvalidOffsetsError(BadRequestError):
    """startingOffsets / endingOffsets is not earliest, latest or a JSON object of
    stream -> position."""


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
    pickled to executors."""

    stream: str
    ranges: tuple[LedgerRange, ...]
    after: MessageId
    until: MessageId


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
) -> list[Segment]:
    """The ranges cut into `pieces` segments of (nearly) as many entries each, or more
    when a segment would hold more than max_entries; each segment is contiguous in the
    stream and may span ledgers (a task then reads few, large ranges)."""
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
                found.append(Segment(stream, tuple(taken), after, until))
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


def share_partitions(entries: dict[str, int], wanted: int) -> dict[str, int]:
    """How many segments each stream's entries are cut into: `wanted` in all, shared by
    entries, at least one for every stream with something to read."""
    total = sum(entries.values())
    return {name: max(1, round(wanted * count / total)) for name, count in entries.items() if count}


async def plan_segments(
    client: Client,
    streams: list[str],
    start: dict[str, MessageId],
    end: dict[str, MessageId],
    wanted: int,
    entries_per_partition: int | None,
) -> list[Segment]:
    """The input partitions of a read of `streams` from start to end: about `wanted`
    of them (a task per core reads few, large ranges: every task costs Spark far more
    than a range read), more if a segment would pass entries_per_partition entries."""
    ranges = {
        name: await ledger_ranges(client, name, start[name], end[name])
        for name in streams
        if start[name] < end[name]
    }
    pieces = share_partitions({n: sum(len(r) for r in rs) for n, rs in ranges.items()}, wanted)
    return [
        segment
        for name, count in pieces.items()
        for segment in split(
            name, ranges[name], start[name], end[name], count, entries_per_partition
        )
    ]


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


async def segment_entries(
    client: Client, segment: Segment
) -> AsyncIterator[tuple[int, list[EntryData]]]:
    """(ledger id, entries) for the whole segment, in order, no-op entries left out
    (filter messages by after/until): each ledger range read in growing ranges with
    read-ahead."""
    for part in segment.ranges:
        handle = await open_for_reading(client.ledgers, part.ledger_id)
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


async def read_segment(client: Client, segment: Segment) -> list[Message]:
    """The segment's messages as Message objects (for tests and tools; Spark tasks build
    Arrow columns instead: streamlib.spark.rows)."""
    found: list[Message] = []
    async for ledger_id, entries in segment_entries(client, segment):
        found.extend(
            m
            for m in _messages(segment.stream, ledger_id, entries)
            if segment.after < m.message_id <= segment.until
        )
    return found


async def advance(
    client: Client, stream: str, after: MessageId, until: MessageId, max_messages: int
) -> tuple[MessageId, int]:
    """Admission control: the position after at most max_messages messages past `after`
    (never beyond `until`), and how many messages that admits."""
    if max_messages <= 0 or after >= until:
        return after, 0
    position, count = after, 0
    async for batch in _scan(client, stream, after, until):
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
