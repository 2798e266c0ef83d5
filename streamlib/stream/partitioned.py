"""A producer of a partitioned stream (Pulsar's partitioned topic): one producer per
partition stream (NAME-partition-I), a message routed by its key -- the same key always
to the same partition, so its messages keep their order -- and messages without a key
spread round robin, a batch at a time. Consumers of NAME consume every partition
(streamlib.stream.multi)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import mmh3

from streamlib.stream.positions import MessageId
from streamlib.stream.producer import Checked, Outcome, Producer


def partition_of(key: str, partitions: int) -> int:
    """The partition a key goes to: Pulsar's Murmur3_32Hash of its UTF-8 bytes (murmur3
    x86 32-bit, seed 0, & 0x7fffffff) modulo the partitions -- a Pulsar producer's with
    hashing scheme Murmur3_32Hash, and what pulsar-client's Python producers do given
    ``message_router=streamlib.pulsar.entries.murmur3_router``. Stable across processes
    and languages.

    Upgrading: before, it was CRC32C of the key modulo the partitions. A key's partition
    changes for a stream that was already partitioned, so its order holds only within the
    messages sent after every producer of the stream is upgraded (the earlier ones stay in
    their old partition). Drain or recreate a partitioned stream whose per-key order
    matters across the upgrade, or upgrade all its producers at once."""
    return murmur3_32(key) % partitions


def murmur3_32(key: str) -> int:
    """Pulsar's Murmur3_32Hash of a key: murmur3 x86 32-bit of its UTF-8 bytes, seed 0,
    its sign bit cleared (Java's and the C++ client's makeHash)."""
    return mmh3.hash(key.encode(), 0, signed=False) & 0x7FFFFFFF


class PartitionedProducer:
    """Sends to a partitioned stream through one producer per partition."""

    def __init__(self, name: str, producers: Sequence[Producer]) -> None:
        self.stream = name
        self._producers = list(producers)
        self._next = 0  # round robin for messages without a key
        first = self._producers[0]
        self.max_pending_messages = first.max_pending_messages * len(self._producers)
        self.block_if_queue_full = first.block_if_queue_full
        self.chunking_enabled = first.chunking_enabled
        self.schema = first.schema

    @property
    def partitions(self) -> int:
        return len(self._producers)

    @property
    def last_sequence_id(self) -> int:
        return max(p.last_sequence_id for p in self._producers)

    @property
    def pending_messages(self) -> int:
        return sum(p.pending_messages for p in self._producers)

    def _route(self, key: str | None) -> Producer:
        if key is not None:
            return self._producers[partition_of(key, len(self._producers))]
        producer = self._producers[self._next]
        if producer.next_partitions_turn():
            self._next = (self._next + 1) % len(self._producers)
        return producer

    async def send_async(
        self, data: Any, key: str | None = None, **options: Any
    ) -> asyncio.Future[MessageId]:
        """As Producer.send_async, routed by key (round robin without one)."""
        return await self._route(key).send_async(data, key, **options)

    async def send(self, data: Any, key: str | None = None, **options: Any) -> MessageId:
        return await (await self.send_async(data, key, **options))

    async def send_checked(
        self, checked: Checked, sequence_id: int | None = None
    ) -> asyncio.Future[MessageId]:
        return await self._route(_key(checked)).send_checked(checked, sequence_id)

    def queue_checked(
        self,
        checked: Checked,
        sequence_id: int | None = None,
        producer: str = "",
        outcome: Outcome | None = None,
    ) -> Outcome:
        return self._route(_key(checked)).queue_checked(  # type: ignore[no-any-return]
            checked, sequence_id, producer, outcome
        )

    async def flush(self) -> None:
        await asyncio.gather(*(p.flush() for p in self._producers))

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self._producers))


async def produce_each(
    stream: str, partitions: int, create_one: Callable[[str], Awaitable[Any]]
) -> PartitionedProducer:
    """A producer of each partition of `stream` (create_one(partition stream): direct
    mode's or the service's) behind one; those made are closed again if one fails."""
    from streamlib.stream.admin import partition_name

    parts: list[Any] = []
    try:
        for i in range(partitions):
            parts.append(await create_one(partition_name(stream, i)))
    except BaseException:
        for made in parts:
            await made.close()
        raise
    return PartitionedProducer(stream, parts)


def _key(checked: Checked) -> str | None:
    metadata = checked[2]
    return metadata.key if metadata is not None and metadata.HasField("key") else None
