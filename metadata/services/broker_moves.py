"""The load manager's work in the store: its election (one broker leads at a time) and
its requests to move a stream (brokers/moves/STREAM: the owner to unload it from, the
broker its next lookup assigns it to, when). The owner watches the requests, unloads
what is its own and marks the request done; the request stays for the grace period:
meanwhile lookups send the stream to its target (or at least not back to its source),
and the leader does not move it again."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass

from metadata.errors import BadVersionError, InvalidValueError, NodeExistsError, NoNodeError
from metadata.services._base import Service, validate_name
from metadata.services.auditor import ElectedRole


@dataclass(frozen=True)
class MoveRequest:
    stream: str
    source: str  # the owner's broker id
    target: str  # the broker the stream's next lookup assigns it to (when live)
    at: float  # wall-clock time of the request
    reason: str = "shed"
    done: bool = False  # the source unloaded it
    done_at: float = 0.0  # when (wall clock)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> MoveRequest:
        try:
            raw = json.loads(data)
            return cls(
                str(raw["stream"]),
                str(raw["source"]),
                str(raw["target"]),
                float(raw["at"]),
                str(raw.get("reason", "shed")),
                bool(raw.get("done", False)),
                float(raw.get("done_at", 0.0)),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise InvalidValueError(f"not a move request: {data[:80]!r}") from error


class LoadManagerElection(ElectedRole):
    """The brokers' load manager's election (ARCHITECTURE.md §4a): one sheds at a time."""

    path_parts = ("brokers", "leader")


class StreamMoves(Service):
    @property
    def directory(self) -> str:
        return self.path("brokers", "moves")

    def _move_path(self, stream: str) -> str:
        return self.path("brokers", "moves", validate_name("stream", stream))

    async def request(self, move: MoveRequest) -> bool:
        """Ask for a move; False while another request for the stream stands."""
        await self.ensure(self.directory)
        try:
            await self.store.create(self._move_path(move.stream), move.encode())
        except NodeExistsError:
            return False
        return True

    async def get(self, stream: str) -> tuple[MoveRequest, int] | None:
        try:
            node = await self.store.get(self._move_path(stream))
        except NoNodeError:
            return None
        return MoveRequest.decode(node.data), node.version

    async def streams(self) -> list[str]:
        """The streams with a move request."""
        try:
            return await self.store.children(self.directory)
        except NoNodeError:
            return []

    async def all(self) -> list[tuple[MoveRequest, int]]:
        found = []
        for stream in await self.streams():
            request = await self.get(stream)
            if request is not None:
                found.append(request)
        return found

    async def mark_done(self, move: MoveRequest, version: int, now: float) -> None:
        done = dataclasses.replace(move, done=True, done_at=now)
        try:
            await self.store.set(self._move_path(move.stream), done.encode(), version=version)
        except (NoNodeError, BadVersionError):
            pass  # (forgotten, or asked again meanwhile)

    async def forget(self, move: MoveRequest, version: int) -> None:
        """Delete a request past the grace period (only the one read)."""
        try:
            await self.store.delete(self._move_path(move.stream), version=version)
        except (NoNodeError, BadVersionError):
            pass
