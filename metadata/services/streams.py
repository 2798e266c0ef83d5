"""Streams: the ledger list of each stream (CAS'd as a whole) and its cursors.

Names are one path component of [A-Za-z0-9._:-] (no '/': a stream named "a/b" would
collide with stream "a"'s children); map hierarchical names before calling. Each cursor
is its own node with its own version, so cursors move without touching the list.
"""

from __future__ import annotations

import builtins

from metadata.errors import (
    BadVersionError,
    InvalidValueError,
    NodeExistsError,
    NoNodeError,
    NoSuchStreamError,
    NotEmptyError,
    StreamExistsError,
    TransactionError,
)
from metadata.schemas import CursorState, StreamMetadata, decode, encode
from metadata.services._base import Service, validate_name
from metadata.store import Create


class StreamRegistry(Service):
    def stream_path(self, name: str) -> str:
        return self.path("streams", validate_name("stream", name))

    def cursor_path(self, name: str, subscription: str) -> str:
        return f"{self.stream_path(name)}/cursors/{validate_name('subscription', subscription)}"

    def subscribers_path(self, name: str, subscription: str) -> str:
        """The lock a subscription's consumers contend for (streamlib/stream/subscription.py)."""
        return f"{self.stream_path(name)}/subscribers/{validate_name('subscription', subscription)}"

    async def read_defaults(self) -> StreamMetadata | None:
        """The cluster's defaults for new streams (quorums, rollover, retention), kept
        as a StreamMetadata without name or ledgers; None when none were set."""
        try:
            stored = await self.store.get(self.path("stream-defaults"))
        except NoNodeError:
            return None
        return decode(StreamMetadata, stored.data)

    async def write_defaults(self, md: StreamMetadata) -> None:
        path = self.path("stream-defaults")
        try:
            await self.store.set(path, encode(md))
        except NoNodeError:
            await self.store.create(path, encode(md), make_parents=True)

    async def create(self, md: StreamMetadata) -> int:
        path = self.stream_path(md.name)
        await self.ensure(self.path("streams"))
        try:
            await self.store.transaction([Create(path, encode(md)), Create(f"{path}/cursors")])
        except TransactionError as exc:
            if isinstance(exc.cause, NodeExistsError):
                raise StreamExistsError(f"stream {md.name} already exists") from None
            raise exc.cause from None
        return 0

    async def read(self, name: str) -> tuple[StreamMetadata, int]:
        try:
            stored = await self.store.get(self.stream_path(name))
        except NoNodeError:
            raise NoSuchStreamError(f"stream {name} does not exist") from None
        return decode(StreamMetadata, stored.data), stored.version

    async def write(self, name: str, md: StreamMetadata, version: int) -> int:
        """CAS the stream's metadata (its ledger list); BadVersionError if it moved."""
        if md.name != name:
            raise InvalidValueError(f"metadata of stream {md.name!r} written to {name!r}")
        try:
            return await self.store.set(self.stream_path(name), encode(md), version=version)
        except NoNodeError:
            raise NoSuchStreamError(f"stream {name} does not exist") from None

    async def cursor_moved_back(self, name: str) -> None:
        """Call after a cursor was created or moved back (a seek, a reset): moves the
        stream node's version, so a retention plan made from older cursor positions
        fails its CAS (or its version check) and is made again. A conflict means the
        version moved anyway."""
        try:
            md, version = await self.read(name)
            await self.write(name, md, version)
        except BadVersionError:
            pass

    async def delete(self, name: str, version: int = -1) -> None:
        """Delete the stream and its cursors (not its ledgers: the caller deletes those)."""
        try:
            await self.store.delete(self.stream_path(name), version=version, recursive=True)
        except NoNodeError:
            raise NoSuchStreamError(f"stream {name} does not exist") from None
        # (the brokers' epoch of its lease: metadata/services/brokers.py)
        from metadata.services.brokers import BrokerRegistry

        await BrokerRegistry(self.store, self.root).forget_stream(name)

    async def list(self) -> list[str]:
        try:
            return await self.store.children(self.path("streams"))
        except NoNodeError:
            return []

    async def read_cursor(self, name: str, subscription: str) -> tuple[CursorState, int] | None:
        try:
            stored = await self.store.get(self.cursor_path(name, subscription))
        except NoNodeError:
            return None
        return decode(CursorState, stored.data), stored.version

    async def write_cursor(
        self, name: str, subscription: str, state: CursorState, version: int | None = None
    ) -> int:
        """Create the cursor (version None) or CAS it; returns the new version."""
        path = self.cursor_path(name, subscription)
        try:
            if version is None:
                await self.store.create(path, encode(state))
                return 0
            return await self.store.set(path, encode(state), version=version)
        except NoNodeError:
            if await self.store.exists(self.stream_path(name)) is None:
                raise NoSuchStreamError(f"stream {name} does not exist") from None
            raise

    async def delete_cursor(self, name: str, subscription: str) -> None:
        try:
            await self.store.delete(self.cursor_path(name, subscription))
        except NoNodeError:
            pass
        # The subscription's lock directory too, unless a consumer is in it (then it
        # stays: the consumer's next cursor write re-creates the subscription).
        try:
            await self.store.delete(self.subscribers_path(name, subscription))
        except (NoNodeError, NotEmptyError):
            pass

    async def list_cursors(self, name: str) -> builtins.list[str]:
        try:
            return await self.store.children(f"{self.stream_path(name)}/cursors")
        except NoNodeError:
            raise NoSuchStreamError(f"stream {name} does not exist") from None
