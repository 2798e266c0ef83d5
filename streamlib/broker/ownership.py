"""A broker's ownership of streams: its registration, a lease per stream in the
metadata store, the streams it owns (owned.py) and giving them up. The core any wire
front end serves (server.py: the gRPC one).

Ownership: a lease per stream in the metadata store (metadata/services/brokers.py). A
stream nobody owns goes to its pin, or to the least loaded live broker (lookup; the load
reports and the leader's shedding: balance.py, streamlib/protocol/load.py); that broker
takes the lease, then the stream over by fencing, and only then serves it. A broker
whose session expires loses its leases and stops serving; if it still runs unaware
(SIGSTOP, a partition), the next owner's fencing makes its writes fail: it can
acknowledge nothing more, and gives the stream up when it notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from typing import Any

from metadata.services.brokers import BrokerInfo, BrokerRegistry, same_process
from streamlib import liveness
from streamlib.broker.access import Budgets, ByteBudget
from streamlib.broker.balance import BalanceConfig, Balancer
from streamlib.broker.dedup import INACTIVITY_TIMEOUT_S, RecentBudget
from streamlib.broker.load import broker_load
from streamlib.broker.owned import SNAPSHOT_INTERVAL_S, OwnedStream
from streamlib.broker.sessions import StreamGone
from streamlib.protocol.errors import (
    StreamlibError,
)
from streamlib.protocol.load import assign
from streamlib.protocol.ownership import Evidence, Incarnation, Probe, owner_gone
from streamlib.retry import registration
from streamlib.tasks import HeldTasks

log = logging.getLogger(__name__)

ALIVE_FOR_S = 1.0  # an owner that answered a probe is not probed again for this long


def _incarnation(info: BrokerInfo) -> Incarnation:
    return Incarnation(info.broker_id, info.incarnation, info.host, info.pid, info.started)


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
        balance: BalanceConfig | None = None,
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
        # The positions of recent sequence ids every stream's dedup keeps, together.
        self.recent_ids = RecentBudget(self.budgets.dedup_recent_ids)
        self.broker_id = broker_id
        self.address = address
        # A producer name idle this long is forgotten by its streams' dedup (dedup.py).
        self.dedup_inactivity_timeout_s = dedup_inactivity_timeout_s
        self.dedup_snapshot_interval_s = dedup_snapshot_interval_s
        self.registry = BrokerRegistry(client.store)
        self.owned: dict[str, OwnedStream] = {}
        self._owning: dict[str, asyncio.Task[OwnedStream]] = {}
        self._tasks = HeldTasks(f"broker {broker_id}")
        self._load_dirty = False  # (the registration is behind what it owns: _update_load)
        self._load_writer: asyncio.Task[None] | None = None
        self.closed = False
        # Its Pulsar ports (streamlib/pulsar/), set before start when it serves them:
        # what lookups through them answer with.
        self.pulsar_url = ""
        self.pulsar_url_tls = ""
        self.http_url = ""
        # This process, as its registration and leases name it (evidence it is gone is
        # weighed against this: streamlib.protocol.ownership).
        self.incarnation = uuid.uuid4().hex
        self._host, self._pid, self._started = liveness.identity()
        self._session_timeout_s = 10.0
        # Owners found alive lately (incarnation -> loop time of the probe): a lookup
        # does not connect to the same owner again for ALIVE_FOR_S.
        self._alive: dict[str, float] = {}
        self.balancer = Balancer(self, balance)
        # Streams moving to another broker (stream -> loop time): not owned here again
        # until then -- a client that looked one up before its lease went comes here.
        self._leaving: dict[str, float] = {}

    @property
    def info(self) -> BrokerInfo:
        """Its registration: who it is, and its last load report."""
        report = self.balancer.meter.report
        return dataclasses.replace(
            self.lease_info,
            msgs_in_rate=report.msgs_in_rate,
            msgs_out_rate=report.msgs_out_rate,
            bytes_in_rate=report.bytes_in_rate,
            bytes_out_rate=report.bytes_out_rate,
            cpu_percent=report.cpu_percent,
            reported=report.reported,
            stream_rates=report.stream_rates,
        )

    @property
    def lease_info(self) -> BrokerInfo:
        """What its leases hold: who it is (no load report: a lease is written once)."""
        return BrokerInfo(
            self.broker_id,
            self.address,
            len(self.owned),
            self._pid,
            self.pulsar_url,
            self.pulsar_url_tls,
            self.http_url,
            self.incarnation,
            self._host,
            self._started,
        )

    async def start(self, session_timeout_s: float = 10.0) -> None:
        """Register. After a crash, the dead process's registration holds the id until
        its session is reaped: this waits for that (bounded) -- unless the process is
        provably gone (its port refuses, or it is not running on this host), when its
        registration is deleted at once."""
        self._session_timeout_s = session_timeout_s

        async def register() -> None:
            found = await self.registry.registered(self.broker_id)
            if found is not None and await self._gone(found[0], found[0]) is not None:
                log.info("broker %s: its predecessor %s is gone", self.broker_id, found[0].pid)
                await self.registry.evict(*found)
            await self.registry.register(self.info)

        await registration(session_timeout_s).run(f"broker {self.broker_id}: registering", register)
        self.client.store.add_session_listener(self._on_session)
        self._spawn(self._keep_registered())
        self.balancer.start()

    async def _keep_registered(self) -> None:
        """Register again whenever the registration is gone while the session lives: a
        broker evicted on false evidence (a firewall that rejects connections to its
        port) is alive, and lookups must see it so. Checked a few times a session."""
        while not self.closed:
            await asyncio.sleep(self._session_timeout_s / 3)  # (a timer, not a wait for a state)
            with contextlib.suppress(Exception):
                if self.closed or await self.registry.registered(self.broker_id) is not None:
                    continue
                log.warning("broker %s: its registration went; registering again",
                            self.broker_id)  # fmt: skip
                await self.registry.register(self.info)
                # Evicted while alive (an eviction deletes the registration and the
                # lease): a stream whose lease is another's now is no longer served here.
                for stream, owned in list(self.owned.items()):
                    if not await self.holds(stream):
                        self.give_up(owned, StreamGone(f"{stream!r} was taken over"))

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
        """Whether this broker process still holds the stream's lease (a broker that was
        stopped or cut off may not know yet that it lost it; another process of the same
        id -- a replacement -- is not this one)."""
        owner = await self.registry.owner(stream)
        return owner is not None and same_process(owner, self.info)

    async def lookup(self, stream: str) -> BrokerInfo:
        """The broker that serves `stream`; one is assigned when none owns it (this one:
        it starts taking the stream over and answers at once -- the client's producer or
        consumer waits for the takeover, not the lookup). An owner, or a broker to
        assign, whose process is provably gone loses its lease / registration first
        (streamlib.protocol.ownership): its clients need not wait for its session."""
        found = self.owned.get(stream)
        if found is not None and found.gone is None and not self.closed:
            # Served here: no read. (Should the lease have gone meanwhile, the session's
            # Ready is refused after the lease is read: BrokerService.still_owner.)
            return self.info
        if stream in self._owning and not self.closed:
            return self.info  # (being taken over here: its producer or consumer waits)
        for _ in range(3):  # (an evicted owner: once more; then give what there is)
            owner, epoch = await self.registry.lease(stream)
            if owner is not None:
                if not await self._evict_if_gone(stream, owner, epoch):
                    return owner
                continue
            # (this broker, as it is now rather than as last written: a candidate too)
            live = {b.broker_id: b for b in await self.registry.live()}
            live[self.broker_id] = self.info
            placement = await self.balancer.placement(stream)
            chosen = assign(map(broker_load, live.values()), placement, prefer=self.broker_id)
            least = live[chosen or self.broker_id]
            if least.broker_id == self.broker_id:
                self._start_owning(stream)
                return self.info
            if not await self._evict_if_gone(None, least, -1):
                return least
        return self.info if owner is None else owner

    async def _gone(self, owner: BrokerInfo, registered: BrokerInfo | None) -> Evidence | None:
        """The evidence that `owner`'s process is gone (None: none; wait for its
        session). Its address is connected to only when nothing else decides."""
        if owner.incarnation == self.incarnation:
            return None
        mine = _incarnation(owner)
        now = _incarnation(registered) if registered is not None else None
        found = owner_gone(mine, now, process=liveness.process_of(mine))
        if found is not None or not owner.address:
            return found
        loop = asyncio.get_running_loop()
        if loop.time() - self._alive.get(owner.incarnation, -ALIVE_FOR_S) < ALIVE_FOR_S:
            return None
        answer = await liveness.probe(owner.address)
        if answer is not Probe.REFUSED:
            self._alive[owner.incarnation] = loop.time()
            if len(self._alive) > 10_000:  # (bounded: the oldest go)
                for key in list(self._alive)[:1000]:
                    del self._alive[key]
        return owner_gone(mine, now, probe=answer)

    async def _evict_if_gone(self, stream: str | None, owner: BrokerInfo, epoch: int) -> bool:
        """Whether `owner` (of `stream`'s lease, taken at `epoch`, or a live broker to
        assign it to) was provably gone and is evicted: its registration, and the lease."""
        if same_process(owner, self.info):
            return False
        found = await self.registry.registered(owner.broker_id)
        registered = found[0] if found is not None else None
        evidence = await self._gone(owner, registered)
        if evidence is None:
            return False
        log.info("broker %s: %s (%s) is gone: %s", self.broker_id, owner.broker_id,
                 owner.address, evidence.value)  # fmt: skip
        if found is not None and found[0].incarnation == owner.incarnation:
            await self.registry.evict(*found)
        if stream is not None:
            await self.registry.evict_lease(stream, epoch)  # (False: another was first)
        return True

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
        loop = asyncio.get_running_loop()
        if self._leaving.get(stream, 0.0) > loop.time():
            raise NotOwnerError(f"stream {stream!r} is moving to another broker: look it up")
        self._leaving.pop(stream, None)
        await self.client.streams.read(stream)  # (NoSuchStream, bad names: before the lease)
        if not await self.registry.try_own(stream, self.lease_info):
            owner = await self.registry.owner(stream)
            where = owner.address if owner is not None else "(released meanwhile)"
            raise NotOwnerError(f"stream {stream!r} is owned by broker at {where}")
        owned = OwnedStream(self, stream)
        self.owned[stream] = owned
        self._update_load()
        log.info("broker %s owns %s", self.broker_id, stream)
        return owned

    def _update_load(self) -> None:
        """Rewrite the registration (the streams it owns: what lookups balance on) soon:
        one write at a time, covering every change made while the last was under way --
        a broker opening thousands of streams at once wrote its registration for each."""
        self._load_dirty = True
        if self._load_writer is None or self._load_writer.done():
            self._load_writer = self._spawn(self._write_load())

    async def _write_load(self) -> None:
        while self._load_dirty:
            self._load_dirty = False
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
            await self.registry.release(stream, self.info)
        self._update_load()

    async def unload(self, stream: str, refuse_s: float = 0.0) -> bool:
        """Give the stream up (its dedup snapshot written first); refuse_s: and do not
        own it again for that long (it moves to another broker)."""
        owned = self.owned.get(stream)
        if owned is None:
            return False
        if refuse_s > 0:
            now = asyncio.get_running_loop().time()
            if len(self._leaving) > 1000:  # (bounded: those past go)
                self._leaving = {s: t for s, t in self._leaving.items() if t > now}
            self._leaving[stream] = now + refuse_s
        await owned.write_snapshot()  # the next owner scans less
        await self._drop(stream, owned, StreamGone(f"stream {stream!r} was unloaded"))
        return True

    async def close(self) -> None:
        self.closed = True
        await self.balancer.close()
        for stream, owned in list(self.owned.items()):
            await owned.write_snapshot()
            await self._drop(stream, owned, StreamGone(f"broker {self.broker_id} stopped"))
        with contextlib.suppress(Exception):
            await self.registry.unregister(self.broker_id)
        await self._tasks.close()
