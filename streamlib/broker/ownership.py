"""A broker's ownership of streams: its registration, a lease per stream in the
metadata store, the streams it owns (owned.py) and giving them up. The core any wire
front end serves (server.py: the gRPC one).

Ownership: a lease per stream in the metadata store (metadata/services/brokers.py). A
stream nobody owns goes to the live broker owning the fewest (lookup); that broker
takes the lease, then the stream over by fencing, and only then serves it. A broker
whose session expires loses its leases and stops serving; if it still runs unaware
(SIGSTOP, a partition), the next owner's fencing makes its writes fail: it can
acknowledge nothing more, and gives the stream up when it notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from metadata.services.brokers import BrokerInfo, BrokerRegistry
from streamlib.broker.access import Budgets, ByteBudget
from streamlib.broker.dedup import INACTIVITY_TIMEOUT_S
from streamlib.broker.owned import SNAPSHOT_INTERVAL_S, OwnedStream
from streamlib.broker.sessions import StreamGone
from streamlib.protocol.errors import (
    StreamlibError,
)
from streamlib.retry import registration
from streamlib.tasks import HeldTasks

log = logging.getLogger(__name__)


class NotOwnerError(StreamlibError):
    """Another broker owns the stream (its address is in the message)."""

    retriable = True


class Broker:
    def __init__(
        self,
        client: Any,
        broker_id: str,
        address: str,
        *,
        allow_auto_create: bool = True,
        budgets: Budgets | None = None,
        dedup_inactivity_timeout_s: float = INACTIVITY_TIMEOUT_S,
        dedup_snapshot_interval_s: float = SNAPSHOT_INTERVAL_S,
    ) -> None:
        if not dedup_inactivity_timeout_s > 0:
            raise ValueError(
                f"the dedup inactivity timeout must be > 0 s, got {dedup_inactivity_timeout_s}"
            )
        self.client = client
        #: Whether naming a stream that does not exist creates it (for a caller that may
        #: create streams): Pulsar's allowAutoTopicCreation.
        self.allow_auto_create = allow_auto_create
        self.budgets = budgets or Budgets()
        self.publish_buffer = ByteBudget(self.budgets.publish_buffer_bytes)
        self.broker_id = broker_id
        self.address = address
        # A producer name idle this long is forgotten by its streams' dedup (dedup.py).
        self.dedup_inactivity_timeout_s = dedup_inactivity_timeout_s
        self.dedup_snapshot_interval_s = dedup_snapshot_interval_s
        self.registry = BrokerRegistry(client.store)
        self.owned: dict[str, OwnedStream] = {}
        self._owning: dict[str, asyncio.Task[OwnedStream]] = {}
        self._tasks = HeldTasks(f"broker {broker_id}")
        self.closed = False
        # Its Pulsar ports (streamlib/pulsar/), set before start when it serves them:
        # what lookups through them answer with.
        self.pulsar_url = ""
        self.pulsar_url_tls = ""
        self.http_url = ""

    @property
    def info(self) -> BrokerInfo:
        return BrokerInfo(
            self.broker_id,
            self.address,
            len(self.owned),
            os.getpid(),
            self.pulsar_url,
            self.pulsar_url_tls,
            self.http_url,
        )

    async def start(self, session_timeout_s: float = 10.0) -> None:
        """Register; after a crash, wait (bounded) for the dead process's session to be
        reaped: its registration holds the id until then."""
        await registration(session_timeout_s).run(
            f"broker {self.broker_id}: registering", lambda: self.registry.register(self.info)
        )
        self.client.store.add_session_listener(self._on_session)

    def _on_session(self, state: str) -> None:
        """The session expired: its leases are gone. Stop serving every stream (another
        broker may own them now) and register again."""
        self._spawn(self._session_lost())

    async def _session_lost(self) -> None:
        error = StreamGone(f"broker {self.broker_id} lost its metadata session")
        gone = [(name, owned) for name, owned in self.owned.items()]
        for _name, owned in gone:
            owned.mark_gone(error)  # at once, all of them: nothing more is served
        await asyncio.gather(*(self._drop(n, o, error) for n, o in gone), return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.registry.register(self.info)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro)

    # -- ownership ----------------------------------------------------------------------

    async def holds(self, stream: str) -> bool:
        """Whether this broker's session still holds the stream's lease (a broker that
        was stopped or cut off may not know yet that it lost it)."""
        owner = await self.registry.owner(stream)
        return owner is not None and owner.broker_id == self.broker_id

    async def lookup(self, stream: str) -> BrokerInfo:
        """The broker that serves `stream`; one is assigned when none owns it (this one:
        it starts taking the stream over and answers at once -- the client's producer or
        consumer waits for the takeover, not the lookup)."""
        owner = await self.registry.owner(stream)
        if owner is not None:
            return owner
        live = await self.registry.live()
        if not live:
            return self.info
        least = min(live, key=lambda b: (b.owned, b.broker_id))
        if least.broker_id == self.broker_id or least.owned >= len(self.owned):
            self._start_owning(stream)
            return self.info
        return least

    def _start_owning(self, stream: str) -> asyncio.Future[OwnedStream]:
        """The takeover of `stream`, in a task of the broker's own: a caller that goes
        away (a lookup's deadline) does not abort it half done."""
        owning = self._owning.get(stream)
        if owning is None:
            owning = self._spawn(self._acquire(stream))
            self._owning[stream] = owning
            owning.add_done_callback(lambda done: self._owning.pop(stream, None))
            owning.add_done_callback(lambda done: done.cancelled() or done.exception())
        return owning

    async def own(self, stream: str) -> OwnedStream:
        """The stream, served here: the lease taken and the stream taken over first."""
        if self.closed:
            raise StreamGone(f"broker {self.broker_id} is stopping")
        found = self.owned.get(stream)
        if found is not None and found.gone is None:
            return found
        return await asyncio.shield(self._start_owning(stream))

    async def _acquire(self, stream: str) -> OwnedStream:
        """The lease (the stream must exist: the caller created it if it may). The
        writer's takeover waits for the first producer (OwnedStream.ensure_writer)."""
        await self.client.streams.read(stream)  # (NoSuchStream, bad names: before the lease)
        if not await self.registry.try_own(stream, self.info):
            owner = await self.registry.owner(stream)
            where = owner.address if owner is not None else "(released meanwhile)"
            raise NotOwnerError(f"stream {stream!r} is owned by broker at {where}")
        owned = OwnedStream(self, stream)
        self.owned[stream] = owned
        await self._update_load()
        log.info("broker %s owns %s", self.broker_id, stream)
        return owned

    async def _update_load(self) -> None:
        with contextlib.suppress(Exception):
            await self.registry.update(self.info)

    def give_up(self, owned: OwnedStream, error: BaseException | None) -> None:
        """The stream's writer failed (fenced: someone else owns it now)."""
        gone = StreamGone(f"stream {owned.stream!r} moved: {error}")
        owned.mark_gone(gone)
        if self.owned.get(owned.stream) is owned:
            self._spawn(self._drop(owned.stream, owned, gone))

    async def _drop(self, stream: str, owned: OwnedStream, error: BaseException) -> None:
        """Stop serving this instance of the stream (not a newer one of the same name)."""
        if self.owned.get(stream) is not owned:
            return
        del self.owned[stream]
        await owned.close(error)
        with contextlib.suppress(Exception):
            await self.registry.release(stream, self.broker_id)
        await self._update_load()

    async def unload(self, stream: str) -> bool:
        owned = self.owned.get(stream)
        if owned is None:
            return False
        await owned.write_snapshot()  # the next owner scans less
        await self._drop(stream, owned, StreamGone(f"stream {stream!r} was unloaded"))
        return True

    async def close(self) -> None:
        self.closed = True
        for stream, owned in list(self.owned.items()):
            await owned.write_snapshot()
            await self._drop(stream, owned, StreamGone(f"broker {self.broker_id} stopped"))
        with contextlib.suppress(Exception):
            await self.registry.unregister(self.broker_id)
        await self._tasks.close()
