"""A broker's part in balancing the stream service (Pulsar's load manager; the rules
are streamlib/protocol/load.py's): it reports its load every report interval; it
campaigns to lead, and the leader runs a shedding pass every shed interval -- asking
the owners of the streams to move (brokers/moves/STREAM); and it unloads the streams
it is asked to move (its dedup snapshot written, as `unload` does), which their next
lookup assigns to the target. Its tasks are held by it and stopped with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from metadata.errors import MetadataError
from metadata.services.broker_moves import LoadManagerElection, MoveRequest, StreamMoves
from metadata.services.broker_pins import BrokerPins
from streamlib.broker.load import DEFAULT_REPORT_INTERVAL_S, LoadMeter, broker_load
from streamlib.protocol.errors import StreamlibError
from streamlib.protocol.load import DEFAULT_MAX_STREAMS, DEFAULT_THRESHOLD, Placement, shed
from streamlib.tasks import HeldTasks

log = logging.getLogger(__name__)

DEFAULT_SHED_INTERVAL_S = 60.0  # Pulsar's loadBalancerSheddingIntervalMinutes: 1
GRACE_INTERVALS = 5  # a moved stream stays put this many shed intervals
ERROR_BACKOFF_S = 1.0
# A stream moved away is not owned again by its source for this long: a client that
# looked it up while the source still held its lease comes back there, and must look
# it up again -- its next lookup sees the move.
REFUSE_AFTER_MOVE_S = 5.0


@dataclass(frozen=True)
class BalanceConfig:
    report_interval_s: float = DEFAULT_REPORT_INTERVAL_S
    shed_interval_s: float = DEFAULT_SHED_INTERVAL_S
    threshold: float = DEFAULT_THRESHOLD
    max_streams: int = DEFAULT_MAX_STREAMS  # moved per pass, at most
    shedding: bool = True  # (False: it reports and follows moves, never leads)

    def __post_init__(self) -> None:
        for name in ("report_interval_s", "shed_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.threshold >= 0:
            raise ValueError(f"the shedding threshold must be >= 0, got {self.threshold}")
        if self.max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {self.max_streams}")

    @property
    def grace_s(self) -> float:
        """How long a moved stream is neither moved again nor assigned back to its
        source (Pulsar's loadBalancerSheddingGracePeriodMinutes)."""
        return GRACE_INTERVALS * self.shed_interval_s


class Balancer:
    def __init__(self, broker: Any, config: BalanceConfig | None = None) -> None:
        self.broker = broker
        self.config = config or BalanceConfig()
        store = broker.client.store
        self.meter = LoadMeter()
        self.moves = StreamMoves(store)
        self.pins = BrokerPins(store)
        self.election = LoadManagerElection(store, broker.broker_id)
        self._tasks = HeldTasks(f"broker {broker.broker_id} balancing")
        self._moves_changed = asyncio.Event()
        self.passes = 0  # shedding passes run as leader

    def start(self) -> None:
        self._tasks.spawn(self._report(), name="load report")
        self._tasks.spawn(self._follow_moves(), name="moves")
        if self.config.shedding:
            self._tasks.spawn(self._lead(), name="load manager")

    async def close(self) -> None:
        await self._tasks.close()
        with contextlib.suppress(MetadataError):
            await self.election.resign()

    # -- the report -----------------------------------------------------------------------

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(self.config.report_interval_s)  # (a timer, not a wait)
            self.meter.measure(self.broker.owned)
            try:
                await self.broker.registry.update(self.broker.info)
            except MetadataError as error:  # (gone: the broker registers again)
                log.warning("broker %s: load report: %s", self.broker.broker_id, error)
            self._moves_changed.set()  # (and a look at the moves: a watch may have lapsed)

    # -- the owner's side of a move ----------------------------------------------------------

    async def _follow_moves(self) -> None:
        watch = self.broker.client.store.watch(self.moves.directory, children=True)

        async def woken() -> None:
            async for _event in watch:
                self._moves_changed.set()

        waking = self._tasks.spawn(woken(), name="moves watch")
        try:
            while True:
                await self._moves_changed.wait()
                self._moves_changed.clear()
                try:
                    await self._move_mine()
                except (MetadataError, StreamlibError) as error:
                    log.warning("broker %s: moving streams: %s", self.broker.broker_id, error)
        finally:
            waking.cancel()
            await watch.close()

    async def _move_mine(self) -> None:
        """Unload the streams this broker is asked to move."""
        me = self.broker.broker_id
        for stream in await self.moves.streams():
            found = await self.moves.get(stream) if stream in self.broker.owned else None
            if found is None:
                continue  # (not ours: the request is not even read)
            request, version = found
            if request.done or request.source != me or request.stream not in self.broker.owned:
                continue
            log.info("broker %s: moving %s to %s (%s)", me, request.stream, request.target,
                     request.reason)  # fmt: skip
            await self.broker.unload(request.stream, refuse_s=REFUSE_AFTER_MOVE_S)
            await self.moves.mark_done(request, version, time.time())

    # -- lookups ------------------------------------------------------------------------

    async def placement(self, stream: str) -> Placement:
        """What a lookup of `stream` (nobody owns it) weighs besides the loads."""
        pinned_to = await self.pins.pinned_to(stream)
        found = await self.moves.get(stream)
        if found is None or time.time() - found[0].at > self.config.grace_s:
            return Placement(pinned_to)
        move = found[0]
        return Placement(pinned_to, move.target, frozenset({move.source}))

    # -- the leader ---------------------------------------------------------------------

    async def _lead(self) -> None:
        while True:
            try:
                await self.election.campaign()
                log.info("broker %s leads the load manager", self.broker.broker_id)
                while self.election.is_leader:
                    await self._until_next_pass()
                    # (a pass that must wait for the reports is tried again with the next)
                    while self.election.is_leader and await self.shed_once() is None:
                        await asyncio.sleep(self.config.report_interval_s)  # (a timer)
                log.warning("broker %s no longer leads the load manager", self.broker.broker_id)
                await self.election.resign()
            except (MetadataError, StreamlibError) as error:
                log.warning("load manager: %s; again in %.1fs", error, ERROR_BACKOFF_S)
                with contextlib.suppress(MetadataError):
                    await self.election.resign()
                await asyncio.sleep(ERROR_BACKOFF_S)

    async def _until_next_pass(self) -> None:
        """A shed interval -- or less when a broker joins: a pass once it has reported
        (so a broker started in a loaded cluster gets streams within about one report
        interval of the leader seeing it, not a whole shed interval later)."""
        watch = self.broker.client.store.watch(self.broker.registry.live_directory, children=True)
        try:
            known = {info.broker_id for info in await self.broker.registry.live()}
            async with asyncio.timeout(self.config.shed_interval_s):
                while True:
                    await watch.__anext__()
                    now = {info.broker_id for info in await self.broker.registry.live()}
                    if now - known:
                        break
                    known = now
            # (a timer: the newcomer's first report, a whole interval after it joined)
            await asyncio.sleep(1.5 * self.config.report_interval_s)
        except TimeoutError:
            pass  # (the interval is up)
        finally:
            await watch.close()

    async def shed_once(self) -> list[MoveRequest] | None:
        """One shedding pass: the moves asked for; None when the reports do not show the
        last moves yet, or a broker has not reported (settled())."""
        self.passes += 1
        now = time.time()
        recent: list[MoveRequest] = []
        for request, version in await self.moves.all():
            if now - request.at > self.config.grace_s:
                await self.moves.forget(request, version)
            else:
                recent.append(request)
        live = await self.broker.registry.live()
        if not settled(recent, [info.reported for info in live], now, self.config):
            log.debug("load manager: pass %d waits for the reports", self.passes)
            return None
        pins = await self.pins.pins()
        owners: dict[str, str] = {}
        moved = {request.stream for request in recent}
        for stream in pins:
            if stream in moved:
                continue
            owner = await self.broker.registry.owner(stream)
            if owner is not None:
                owners[stream] = owner.broker_id
        decided = shed(
            [broker_load(info) for info in live],
            threshold=self.config.threshold,
            max_streams=self.config.max_streams,
            pins={s: b for s, b in pins.items() if s not in moved},
            owners=owners,
            recent=moved,
        )
        log.debug("load manager: pass %d over %d brokers: %d moves", self.passes, len(live),
                  len(decided))  # fmt: skip
        asked: list[MoveRequest] = []
        for move in decided:
            request = MoveRequest(move.stream, move.source, move.target, now, move.reason)
            if await self.moves.request(request):
                asked.append(request)
        if asked:
            log.info("load manager: moving %s",
                     ", ".join(f"{r.stream} {r.source}->{r.target}" for r in asked))  # fmt: skip
        return asked


def settled(
    recent: list[MoveRequest], reported: list[float], now: float, config: BalanceConfig
) -> bool:
    """Whether the reports show the cluster as the last moves left it: every move done
    (or older than a pass: its source no longer owned the stream), and every broker's
    report measured over a whole interval after the last one was. (Otherwise the leader
    would weigh the rates of streams that already left, and shed again.) A broker that
    has not reported yet (just started; or one that does not report) holds the pass."""
    if any(at == 0 for at in reported):
        return False
    if any(not r.done and now - r.at < config.shed_interval_s for r in recent):
        return False
    last_done = max((r.done_at for r in recent if r.done), default=0.0)
    return all(at >= last_done + config.report_interval_s for at in reported)
