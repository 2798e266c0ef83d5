"""TableView (pulsar-client's): the latest value of every key of a stream, as a live
read-only mapping, kept by a compacted reader (streamlib/stream/compacted.py) -- so it
starts from the compacted view, not from every update ever made, and then follows the
stream. Either mode: it reads through the client's create_reader.

A message without a key is skipped; a message with a key and an empty payload (a
tombstone) removes the key, as Pulsar's TableView does. Values are decoded with the
schema given (bytes without one); a value that does not decode is logged and skipped,
never the end of the view.

Listeners (for_each_and_listen, listen) are called on the client's event loop for every
update after the view caught up, key and value (None for a removal); one that raises is
logged and kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from streamlib.protocol.errors import StreamlibError
from streamlib.stream.admin import partition_name
from streamlib.stream.positions import EARLIEST
from streamlib.stream.reader import Message, Reader

log = logging.getLogger(__name__)

Listener = Callable[[str, Any], object]


class TableView(Mapping[str, Any]):
    """The latest value of each key of a stream. Make one with
    ``await client.create_table_view(stream, schema=...)``: it returns once the view
    holds every key up to the end of the stream at that moment."""

    def __init__(self, readers: list[Reader], stream: str) -> None:
        self.stream = stream
        self._readers = readers  # one per partition of a partitioned stream
        self._values: dict[str, Any] = {}
        self._listeners: list[Listener] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.error: BaseException | None = None  # what ended the following, if anything

    @classmethod
    async def create(cls, client: Any, stream: str, schema: Any = None) -> TableView:
        """Read the stream's compacted view and what follows it up to the end confirmed
        now (each partition's, for a partitioned stream: a key is always in the same
        one), then follow it."""
        partitions = await client.streams.partitions(stream)
        names = [partition_name(stream, i) for i in range(partitions)] if partitions else [stream]
        view = cls([], stream)
        try:
            for name in names:
                reader = await client.create_reader(
                    name, EARLIEST, schema=schema, read_compacted=True
                )
                view._readers.append(reader)
                while await reader.has_message_available():
                    view._apply(await reader.read_next())
        except BaseException:
            await view.close()
            raise
        loop = asyncio.get_running_loop()
        view._tasks = [loop.create_task(view._follow(reader)) for reader in view._readers]
        return view

    # -- the mapping ----------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The key's latest value (default: None when the stream has none for it)."""
        return self._values.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def snapshot(self) -> list[tuple[str, Any]]:
        """Every (key, value) now, copied in one step (safe from another thread)."""
        return list(self._values.items())

    def for_each(self, callback: Listener) -> None:
        """callback(key, value) for every key now."""
        for key, value in self.snapshot():
            callback(key, value)

    def for_each_and_listen(self, callback: Listener) -> None:
        """for_each, then callback(key, value) for every update from now on."""
        self.for_each(callback)
        self.listen(callback)

    def listen(self, callback: Listener) -> None:
        """callback(key, value) for every update from now on (value None: removed)."""
        self._listeners.append(callback)

    # -- following the stream -------------------------------------------------------------

    def _apply(self, message: Message) -> None:
        key = message.key
        if key is None:
            return
        if not message.data:
            if self._values.pop(key, None) is None:
                return
            value = None
        else:
            try:
                value = message.value()
            except (StreamlibError, ValueError) as error:
                log.warning("table view of %r: %s: value skipped: %s", self.stream, key, error)
                return
            self._values[key] = value
        for listener in list(self._listeners):
            try:
                listener(key, value)
            except Exception:  # a listener's bug must not end the view
                log.exception("table view of %r: a listener failed", self.stream)

    async def _follow(self, reader: Reader) -> None:
        try:
            while True:
                self._apply(await reader.read_next())
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self.error = error
            log.warning("table view of %r stopped following: %s", self.stream, error)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for reader in self._readers:
            await reader.close()

    async def __aenter__(self) -> TableView:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<streamlib.TableView {self.stream!r}: {len(self._values)} keys>"
