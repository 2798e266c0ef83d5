"""`client.streams` of a service client: the streams' administration, asked of a
broker (streamlib/broker/admin.py runs it, after checking the caller may). The same
methods, arguments and results as direct mode's StreamManager, for those offered."""

from __future__ import annotations

import builtins
import dataclasses
from typing import Any

from streamlib.service.connection import Brokers
from streamlib.stream.compaction import CompactionResult
from streamlib.stream.positions import MessageId
from streamlib.wire import broker_pb2 as pb
from streamlib.wire.convert import from_json, to_json

ADMIN_TIMEOUT_S = 60.0
# Calls that change nothing: another broker may be asked if one does not answer in time.
READS = frozenset({"list", "read", "partitions", "stats", "cursors", "defaults"})


class ServiceStreams:
    def __init__(self, brokers: Brokers) -> None:
        self._brokers = brokers

    async def _call(self, call: str, **arguments: Any) -> Any:
        brokers = self._brokers
        answer = await brokers.ask(
            lambda stub: stub.Admin(
                pb.AdminRequest(call=call, arguments_json=to_json(arguments)),
                timeout=ADMIN_TIMEOUT_S,
                metadata=brokers.metadata,
            ),
            once=call not in READS,
        )
        return from_json(answer.result_json)

    async def list(self) -> builtins.list[str]:
        return list(await self._call("list"))

    async def create(self, name: str, *args: Any, **options: Any) -> Any:
        keys = ("ensemble", "write_quorum", "ack_quorum", "rollover", "retention")
        options.update(zip(keys, args, strict=False))
        return await self._call("create", name=name, **_plain(options))

    async def read(self, name: str) -> tuple[Any, int]:
        metadata, version = await self._call("read", name=name)
        return metadata, int(version)

    async def delete(self, name: str) -> None:
        await self._call("delete", name=name)

    async def partitions(self, name: str) -> int:
        return int(await self._call("partitions", name=name))

    async def stats(self, name: str, *, count_messages: bool = True) -> dict[str, Any]:
        found: dict[str, Any] = await self._call("stats", name=name, count_messages=count_messages)
        return found

    async def cursors(self, name: str) -> dict[str, MessageId]:
        found: dict[str, MessageId] = await self._call("cursors", name=name)
        return found

    async def defaults(self) -> Any:
        return await self._call("defaults")

    async def set_defaults(self, **policies: Any) -> Any:
        return await self._call("set_defaults", **_plain(policies))

    async def trim(self, name: str) -> builtins.list[int]:
        return list(await self._call("trim", name=name))

    async def trim_fragments(self, name: str) -> builtins.list[int]:
        return list(await self._call("trim_fragments", name=name))

    async def compact(self, name: str) -> CompactionResult:
        return CompactionResult(**await self._call("compact", name=name))

    async def set_policies(self, name: str, **policies: Any) -> Any:
        return await self._call("set_policies", name=name, **_plain(policies))

    async def skip(self, name: str, subscription: str, count: int) -> MessageId:
        found: MessageId = await self._call(
            "skip", name=name, subscription=subscription, count=count
        )
        return found

    async def reset_cursor(self, name: str, subscription: str, position: MessageId | str) -> None:
        await self._call("reset_cursor", name=name, subscription=subscription, position=position)

    async def unsubscribe(self, name: str, subscription: str) -> None:
        await self._call("unsubscribe", name=name, subscription=subscription)


def _plain(options: dict[str, Any]) -> dict[str, Any]:
    """Policy objects (RolloverPolicy, RetentionPolicy) as their fields."""
    for policy in ("rollover", "retention"):
        value = options.get(policy)
        if value is not None and not isinstance(value, dict):
            options[policy] = dataclasses.asdict(value)
    return options
