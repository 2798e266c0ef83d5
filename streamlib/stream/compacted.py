"""Reading a stream compacted (Pulsar's readCompacted): the compacted view's messages --
the latest of each key up to the horizon -- then the stream's after the horizon, with no
gap (the rules: streamlib/protocol/compaction.py; the view is written by
streamlib/stream/compaction.py).

CompactedScanner is a StreamScanner, so a Reader, a durable subscription and a broker's
dispatch take it as they take the plain one. Each entry it yields says, in `previous`,
the message delivered before it -- not the position before it in the stream -- so
acknowledging a message acknowledges the messages compacted out before it, and a
cursor's mark-delete moves over them.

A newer view may replace the one being read (its ledger is deleted after the CAS) and
retention may delete the stream's ledgers below the new horizon. Both show as a view
whose horizon is past the reader's position: the reader then reads the new view after
its position, then the stream after the new horizon. It looks at the view again at every
ledger it moves to and whenever reading fails for want of a ledger or entry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NamedTuple

from google.protobuf.message import DecodeError

from metadata.schemas import StreamMetadata
from streamlib.ledger.handles import ReadHandle
from streamlib.protocol.compaction import first_index_after, reads_view
from streamlib.protocol.errors import (
    BadRequestError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StreamlibError,
)
from streamlib.stream import envelope_pb2 as envelope
from streamlib.stream.batch import MessageDecodeError
from streamlib.stream.message import EntryMessages, entry_messages
from streamlib.stream.positions import EARLIEST, LATEST, MessageId
from streamlib.stream.reader import StreamScanner
from streamlib.stream.subscription import ConsumerType, parse_consumer_type

VIEW_READ_ENTRIES = 256  # compacted entries read at a time


class View(NamedTuple):
    """The installed compacted view of a stream."""

    ledger_id: int
    horizon: MessageId
    entries: int


def view_of(md: StreamMetadata) -> View | None:
    """The stream's compacted view (None: never compacted)."""
    if not md.HasField("compaction"):
        return None
    found = md.compaction
    horizon = found.horizon
    return View(
        found.ledger_id,
        MessageId(horizon.ledger_id, horizon.entry_id, horizon.batch_index),
        found.entries,
    )


def check_read_compacted(read_compacted: object, consumer_type: object = None) -> None:
    """BadRequestError unless read_compacted is a bool, and True only for a reader or an
    exclusive or failover subscription (as Pulsar: a shared subscription's consumers
    would each see a part of the view, which is no view of anything)."""
    if not isinstance(read_compacted, bool):
        raise BadRequestError(f"read_compacted is True or False, got {read_compacted!r}")
    if read_compacted and consumer_type is not None:
        kind = parse_consumer_type(consumer_type, service=True)
        if kind not in (ConsumerType.Exclusive, ConsumerType.Failover):
            raise BadRequestError(
                "read_compacted is for readers and exclusive or failover subscriptions, "
                f"not {kind.value!r} ones"
            )


class CompactedViewMissingError(StreamlibError):
    """The stream's compacted view names a ledger that does not exist."""


class ViewGone(Exception):
    """The view's ledger went (a newer view replaced it): look at the view again."""


class CompactedScanner(StreamScanner):
    """The compacted view after `start_after` (when it is before the horizon), then the
    stream after the horizon; with `until`, nothing after that position (a compactor
    reads a fixed range twice)."""

    read_compacted = True
    until: MessageId | None = None

    async def view(self) -> View | None:
        md, _ = await self._registry.read(self.name)
        return view_of(md)

    async def last_message(self) -> MessageId | None:
        """The id of the last message this reader will read of what is confirmed now:
        the stream's, or -- when that came before the horizon -- the view's last (the
        stream's may have been compacted out: a tombstone, a message without a key)."""
        while True:
            view = await self.view()
            last = await super().last_message()
            if view is None or last is None or last > view.horizon:
                return last
            try:
                return await self._view_last(view)
            except ViewGone:
                await self._replaced(view)

    async def _open_view(self, view: View) -> ReadHandle:
        """The view's ledger, opened for reading; ViewGone once a newer view replaced it."""
        try:
            return await self._ledgers.open(view.ledger_id, password=None, recover=False)
        except NoSuchLedgerError:
            raise ViewGone() from None

    async def _view_last(self, view: View) -> MessageId | None:
        handle = await self._open_view(view)
        try:
            last = handle.last_entry_id
            if last < 0:
                return None
            [(entry_id, payload)] = await self._view_entries(handle, last, last)
        finally:
            await handle.close()
        batch = self._compacted(view, entry_id, payload, EARLIEST, EARLIEST)
        return None if batch is None else batch.last_id

    async def batches(self) -> AsyncIterator[EntryMessages]:
        after = self.start_after
        if after == LATEST:
            after = await self.end_position()
        previous = after  # the message delivered last (or the start)
        self._stopped = False
        while True:
            view = await self.view()
            if view is not None and reads_view(after, view.horizon):
                try:
                    async for batch in self._view_batches(view, after, previous):
                        previous = after = batch.last_id
                        yield batch
                except ViewGone:
                    await self._replaced(view)
                    continue
                after = max(after, view.horizon)
                if self.until is not None and after >= self.until:
                    return
            restart = False
            try:
                async for found in self._stream_batches(after, previous):
                    if found is None:  # (a new view passed the reader: read it first)
                        restart = True
                        break
                    previous = after = found.last_id
                    yield found
            except (NoSuchLedgerError, NoSuchEntryError):
                newer = await self.view()
                if newer is None or not reads_view(after, newer.horizon):
                    raise
                restart = True
            if not restart:
                return

    async def _replaced(self, view: View) -> None:
        """After ViewGone: the view is another now (read it); if the same view still names
        its missing ledger, that is no race but a broken stream: say so, never loop."""
        if await self.view() == view:
            raise CompactedViewMissingError(
                f"stream {self.name!r}: its compacted view names ledger {view.ledger_id}, "
                "which does not exist (compact the stream again)"
            )

    async def _stream_batches(
        self, after: MessageId, previous: MessageId
    ) -> AsyncIterator[EntryMessages | None]:
        """The stream after `after`; None (and the end) when ledgers it would have read
        next were deleted -- retention of a compacted stream deletes what a newer view's
        horizon passed -- and that view covers them: read it first. Only then: a reader
        whose ledgers are all there reads every update, tombstones included."""
        md, _ = await self._registry.read(self.name)
        listed = {i.ledger_id for i in md.ledgers}
        view = view_of(md)
        if (
            after != EARLIEST and after.ledger_id not in listed
            and view is not None and reads_view(after, view.horizon)
        ):  # fmt: skip
            # The ledger it stands in went (a newer compaction, then retention), and
            # what followed it may have gone too: the newer view has them.
            yield None
            return
        known = [i for i in sorted(listed) if i >= after.ledger_id]
        stream = StreamScanner(
            self._ledgers, self._registry, self.name, after,
            tail=self.tail, poll_timeout_s=self.poll_timeout_s,
            batch_entries=self.batch_entries,
        )  # fmt: skip
        stream.keep_raw = self.keep_raw
        ledger_id = after.ledger_id
        async for batch in stream.batches():
            self.long_polls = stream.long_polls
            if self.until is not None and (batch.ledger_id, batch.entry_id) > self.until[:2]:
                return
            if batch.ledger_id != ledger_id:
                md, _ = await self._registry.read(self.name)
                listed = {i.ledger_id for i in md.ledgers}
                # Deleted under the reader: the last ledger it read (retention deletes a
                # prefix of the list: then whatever came between went too), or -- before
                # it read any -- one it knew of before this one.
                if ledger_id >= 0:
                    deleted = ledger_id not in listed
                else:
                    deleted = any(k < batch.ledger_id and k not in listed for k in known)
                if deleted:
                    view = view_of(md)
                    if view is not None and reads_view(after, view.horizon):
                        yield None
                        return
                ledger_id = batch.ledger_id
            batch.previous = previous  # (acknowledging it covers what was compacted out)
            previous = after = batch.last_id
            yield batch

    async def _view_batches(
        self, view: View, after: MessageId, previous: MessageId
    ) -> AsyncIterator[EntryMessages]:
        handle = await self._open_view(view)
        try:
            last = handle.last_entry_id
            for first in range(0, last + 1, VIEW_READ_ENTRIES):
                entries = await self._view_entries(
                    handle, first, min(last, first + VIEW_READ_ENTRIES - 1)
                )
                for entry_id, payload in entries:
                    batch = self._compacted(view, entry_id, payload, after, previous)
                    if batch is None:
                        continue
                    if self.until is not None and batch.last_id > self.until:
                        return
                    previous = after = batch.last_id
                    yield batch
        finally:
            await handle.close()

    async def _view_entries(
        self, handle: ReadHandle, first: int, last: int
    ) -> list[tuple[int, bytes]]:
        try:
            entries = await self._read(handle, first, last)
        except (NoSuchLedgerError, NoSuchEntryError):
            raise ViewGone() from None
        return [(e.entry_id, e.payload) for e in entries or []]

    def _compacted(
        self, view: View, entry_id: int, payload: bytes, after: MessageId, previous: MessageId
    ) -> EntryMessages | None:
        """A compacted entry's messages after `after` (None: none)."""
        where = f"stream {self.name!r} compacted ledger {view.ledger_id} entry {entry_id}"
        stored = envelope.CompactedEntry()
        try:
            stored.ParseFromString(payload)
        except DecodeError as error:
            raise MessageDecodeError(f"{where}: not a compacted entry ({error})") from None
        start = first_index_after(stored.ledger_id, stored.entry_id, stored.first_index, after)
        if start is None:
            return None
        batch = entry_messages(
            self.name, stored.ledger_id, stored.entry_id, stored.batch, previous,
            keep_raw=self.keep_raw,
        )  # fmt: skip
        if batch is None or start >= len(batch.payloads):
            return None
        batch.start = start
        batch.previous = previous
        batch.compacted = True
        return batch
