"""The single writer of a managed stream: takeover, appends, rolling.

Takeover and rolling follow streamlib.protocol.stream_rules (protocol.txt "Opening a
log", "Rolling ledgers"). Acknowledgements are delivered in append order across
ledger boundaries. A writer that loses the stream to another (its ledger is fenced, or
the list moved on without it) fails every later append with StreamFencedError; what
it had acknowledged stays in the stream (the new writer recovered it).

A writer whose ledger fails for any other reason (no bookie left to replace a failed
one, too many ensemble changes, a metadata error) is BROKEN, not fenced: the appends in
flight fail with that error (they are not in the stream: the ledger is closed at its
LAC), and the next append replaces the ledger -- close it at its LAC, add a new one to
the list by CAS, as a roll does -- retrying for up to REPLACE_S seconds while bookies
come back. An unbounded stream takes its one ledger over again (a new term) instead.
So a writer with enough live bookies never stays failed.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from metadata.errors import BadVersionError
from metadata.schemas import LedgerInfo, StreamMetadata, StreamMode
from metadata.services.streams import StreamRegistry
from streamlib.ledger.handles import WriteHandle
from streamlib.ledger.manager import LedgerManager
from streamlib.protocol.errors import (
    InvalidTermError,
    LedgerFencedError,
    NoSuchLedgerError,
    StreamFencedError,
    StreamlibError,
)
from streamlib.protocol.stream_rules import (
    RolloverPolicy,
    ledgers_to_recover,
    may_roll,
    roll_deadline_ms,
    should_roll,
)
from streamlib.retry import retry_cas

log = logging.getLogger(__name__)

STREAM_PASSWORD = b""  # ledgers of a stream are opened by any reader of the stream
REPLACE_S = 30.0  # how long the append that finds the writer broken retries a new ledger
CLOSE_S = 10.0  # how long a roll retries closing the ledger it rolled away from
_FENCING = (LedgerFencedError, InvalidTermError, StreamFencedError)


def _retryable(error: BaseException) -> bool:
    return isinstance(error, StreamlibError) and not isinstance(error, _FENCING)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Pending:
    inner: asyncio.Future[int]
    outer: asyncio.Future[tuple[int, int]]
    ledger_id: int


@dataclass
class WriterStats:
    takeover_attempts: int = 0
    rolls: int = 0
    ledgers_created: list[int] = field(default_factory=list)


class StreamWriter:
    def __init__(
        self,
        ledgers: LedgerManager,
        registry: StreamRegistry,
        name: str,
        *,
        max_takeover_attempts: int = 10,
        on_roll: Callable[[], None] | None = None,
    ) -> None:
        self._ledgers = ledgers
        self._registry = registry
        self.name = name
        self._max_attempts = max_takeover_attempts
        self._current: WriteHandle | None = None
        self._current_created_ms = 0
        self._roll_deadline: int | None = None
        self._rolling: asyncio.Task[None] | None = None
        self._age_checks: asyncio.Task[None] | None = None  # idle streams roll by age too
        self._closing = False
        self._pending: collections.deque[_Pending] = collections.deque()
        self._fenced: StreamlibError | None = None
        self._rnd = random.Random()
        self._policy = RolloverPolicy()
        self._config: tuple[int, int, int] = (3, 2, 2)
        self._on_roll = on_roll
        self._fragment_first = -1
        self._fragment_base_length = 0
        self._unclosed: WriteHandle | None = None  # rolled away from, its close failed
        self._broken: StreamlibError | None = None  # the current ledger failed (not fenced)
        self._replacing: asyncio.Task[None] | None = None
        self._held: list[tuple[bytes, asyncio.Future[tuple[int, int]]]] = []  # meanwhile
        self.stats = WriterStats()

    @property
    def ledger_id(self) -> int | None:
        return self._current.ledger_id if self._current else None

    # -- takeover -----------------------------------------------------------------------

    async def start(self) -> None:
        """Take over the stream: recover the last two ledgers, add a new one by CAS. An
        unbounded stream lives in ONE unbounded ledger, taken over by term instead."""
        for _ in range(self._max_attempts):
            self.stats.takeover_attempts += 1
            md, version = await self._registry.read(self.name)
            self._load_config(md)
            if md.mode == StreamMode.UNBOUNDED:
                if await self._start_unbounded(md, version):
                    return
                continue
            for ledger_id in ledgers_to_recover([info.ledger_id for info in md.ledgers]):
                await self._recover(md, ledger_id)
            handle = await self._create_ledger()
            md.ledgers.append(LedgerInfo(ledger_id=handle.ledger_id, created_time_ms=now_ms()))
            try:
                await self._registry.write(self.name, md, version)
            except BadVersionError:
                await self._discard(handle)  # someone else moved: start again
                continue
            self._use(handle)
            return
        raise StreamFencedError(
            f"stream {self.name!r}: could not take over in {self._max_attempts} attempts; "
            "another writer keeps moving the ledger list"
        )

    async def _start_unbounded(self, md: StreamMetadata, version: int) -> bool:
        """Take the stream's one ledger over by term (creating it on first use)."""
        if md.ledgers:
            handle = await self._ledgers.take_over(md.ledgers[0].ledger_id, STREAM_PASSWORD)
            self._use(handle)
            return True
        e, qw, qa = self._config
        handle = await self._ledgers.create(
            e,
            qw,
            qa,
            password=STREAM_PASSWORD,
            custom_metadata={"stream": self.name.encode()},
            unbounded=True,
        )
        md.ledgers.append(LedgerInfo(ledger_id=handle.ledger_id, created_time_ms=now_ms()))
        try:
            await self._registry.write(self.name, md, version)
        except BadVersionError:
            await self._discard(handle)  # another producer created it first: take it over
            return False
        self._use(handle)
        return True

    def _load_config(self, md: StreamMetadata) -> None:
        cfg = md.ledger_config
        self._config = (cfg.ensemble_size or 3, cfg.write_quorum or 2, cfg.ack_quorum or 2)
        r = md.rollover
        self._policy = RolloverPolicy(r.max_entries, r.max_bytes, r.max_age_ms)

    async def _recover(self, md: StreamMetadata, ledger_id: int) -> None:
        """Fence and close a ledger of the list; record its final size in md."""
        try:
            handle = await self._ledgers.open(ledger_id, password=STREAM_PASSWORD)
        except NoSuchLedgerError:
            return  # deleted meanwhile (a leak swept up): nothing to fence
        for info in md.ledgers:
            if info.ledger_id == ledger_id:
                info.entries = handle.last_entry_id + 1
                info.size_bytes = handle.metadata.length

    async def _create_ledger(self) -> WriteHandle:
        e, qw, qa = self._config
        handle = await self._ledgers.create(
            e, qw, qa, password=STREAM_PASSWORD, custom_metadata={"stream": self.name.encode()}
        )
        self.stats.ledgers_created.append(handle.ledger_id)
        return handle

    async def _discard(self, handle: WriteHandle) -> None:
        try:
            await handle.close()
            await self._ledgers.delete(handle.ledger_id)
        except StreamlibError as error:  # left for the sweeper
            log.info(
                "stream %s: could not discard ledger %d: %s", self.name, handle.ledger_id, error
            )

    def _use(self, handle: WriteHandle) -> None:
        self._start_age_checks()
        self._current = handle
        self._current_created_ms = now_ms()
        self._roll_deadline = roll_deadline_ms(self._current_created_ms, self._policy, self._rnd)

    # -- appends ------------------------------------------------------------------------

    def append_nowait(self, data: bytes) -> asyncio.Future[tuple[int, int]]:
        """Append one entry; the future gives (ledger id, entry id) once acknowledged,
        in append order."""
        if self._fenced is not None:
            raise StreamFencedError(f"stream {self.name!r}: {self._fenced}")
        if self._current is None:
            raise StreamFencedError(f"stream {self.name!r}: the writer has not started")
        loop = asyncio.get_running_loop()
        outer: asyncio.Future[tuple[int, int]] = loop.create_future()
        if self._broken is not None or self._replacing is not None:
            self._held.append((data, outer))  # sent once the ledger is replaced
            if self._replacing is None:
                self._replacing = loop.create_task(self._replace())
            return outer
        handle = self._current
        try:
            inner = handle.append_nowait([data])[0]
        except StreamlibError as error:
            if not _retryable(error):
                raise
            self._broken = error  # failed with nothing in flight: replace it now
            return self.append_nowait(data)
        self._pending.append(_Pending(inner, outer, handle.ledger_id))
        inner.add_done_callback(self._drain)
        self._maybe_roll()
        return outer

    async def append(self, data: bytes) -> tuple[int, int]:
        return await self.append_nowait(data)

    def _drain(self, _: object = None) -> None:
        """Resolve outer futures strictly in append order."""
        while self._pending and self._pending[0].inner.done():
            item = self._pending.popleft()
            if item.outer.done():
                continue
            if item.inner.cancelled():
                item.outer.cancel()
                continue
            error = item.inner.exception()
            if error is None:
                item.outer.set_result((item.ledger_id, item.inner.result()))
                continue
            if isinstance(error, LedgerFencedError | InvalidTermError):
                self._fence(error)
                error = StreamFencedError(
                    f"stream {self.name!r} was taken over by another writer ({error})"
                )
            elif _retryable(error) and self._broken is None and item.ledger_id == self.ledger_id:
                self._broken = error  # type: ignore[assignment]  # the next append replaces it
                log.warning("stream %s: ledger %d failed: %s", self.name, item.ledger_id, error)
            item.outer.set_exception(error)
        handle = self._current
        if handle is not None and handle.metadata.unbounded and not self._stopped():
            self._maybe_roll_fragment(handle)  # fragments roll as the LAC moves

    def _stopped(self) -> bool:
        return self._fenced is not None or self._closing

    def _fence(self, cause: StreamlibError) -> None:
        if self._fenced is None:
            self._fenced = cause
            log.info("stream %s: fenced out (%s)", self.name, cause)

    # -- rolling ------------------------------------------------------------------------

    def _maybe_roll(self) -> None:
        handle = self._current
        if handle is None or self._rolling is not None or self._broken is not None:
            return
        if handle.metadata.unbounded:
            self._maybe_roll_fragment(handle)
            return
        entries = handle.next_entry_id  # entries handed to this ledger
        if should_roll(entries, handle.length, now_ms(), self._roll_deadline, self._policy):
            self._rolling = asyncio.get_running_loop().create_task(self._roll())

    def _maybe_roll_fragment(self, handle: WriteHandle) -> None:
        """An unbounded stream never rolls its ledger: the rollover policy rolls the
        ledger's fragments instead (a planned ensemble change, asynchronous)."""
        first = handle.metadata.last_fragment.first_entry_id
        if first != self._fragment_first:  # a new fragment began: restart its counters
            if self._fragment_first >= 0:
                self.stats.rolls += 1
                if self._on_roll is not None:  # retention may drop older fragments now
                    self._on_roll()
            self._fragment_first = first
            self._fragment_base_length = handle.length
            self._roll_deadline = roll_deadline_ms(now_ms(), self._policy, self._rnd)
        # Count what is acknowledged: a fragment roll starts the new fragment after the
        # LAC, so rolling before the LAC passed this fragment's first entry would only
        # replace the fragment (a fast pipelined producer would roll in vain).
        entries = handle.last_add_confirmed + 1 - first
        size = handle.length - self._fragment_base_length
        if should_roll(entries, size, now_ms(), self._roll_deadline, self._policy):
            handle.roll_fragment()  # a no-op while one is in flight

    async def roll(self) -> None:
        """Roll now (also used by age-based rolling on idle streams)."""
        if self._rolling is None:
            self._rolling = asyncio.get_running_loop().create_task(self._roll())
        await self._rolling

    async def _roll(self) -> None:
        old = self._current
        assert old is not None
        try:
            if not may_roll(previous_closed=self._unclosed is None):
                assert self._unclosed is not None
                await self._close_rolled(self._unclosed)  # first the one before
            new = await self._create_ledger()
            if not await self._add_to_list(old, new):
                return
            self._use(new)  # from here on appends go to the new ledger
            self.stats.rolls += 1
            self._unclosed = old
            await self._close_rolled(old)  # after its pending appends
            if self._on_roll is not None:
                self._on_roll()
        except StreamlibError as error:
            log.warning("stream %s: roll failed: %s", self.name, error)
        finally:
            self._rolling = None

    async def _add_to_list(self, old: WriteHandle, new: WriteHandle) -> bool:
        """CAS `new` into the list after `old`, recording old's size so far; False (and
        fenced) when the list moved on without us."""

        async def attempt() -> bool:
            md, version = await self._registry.read(self.name)
            if not md.ledgers or md.ledgers[-1].ledger_id != old.ledger_id:
                return False
            md.ledgers[-1].entries = old.next_entry_id
            md.ledgers[-1].size_bytes = old.length
            md.ledgers.append(LedgerInfo(ledger_id=new.ledger_id, created_time_ms=now_ms()))
            await self._registry.write(self.name, md, version)
            return True

        try:
            added = await retry_cas(f"stream {self.name!r}: adding a ledger", attempt)
        except StreamlibError:
            await self._discard(new)
            raise
        if not added:
            await self._discard(new)
            self._fence(StreamFencedError("the ledger list moved on without us"))
        return added

    async def _close_rolled(self, old: WriteHandle) -> None:
        """Close a ledger rolled away from (retried: readers wait for this close)."""
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_retryable),
                stop=stop_after_delay(CLOSE_S),
                wait=wait_random_exponential(multiplier=0.05, max=1.0),
                reraise=True,
            ):
                with attempt:
                    closed = await old.close()
        except (LedgerFencedError, InvalidTermError) as error:
            self._fence(error)  # a takeover recovered it: its end is the recovery's
            self._unclosed = None
            return
        self._unclosed = None
        await self._record_final(closed.ledger_id, closed.last_entry_id + 1, closed.length)

    # -- replacing a broken ledger --------------------------------------------------------

    async def _replace(self) -> None:
        """The current ledger failed (not fenced): replace it, then send what was held."""
        error: StreamlibError | None = None
        try:
            if self._rolling is not None:
                await asyncio.gather(self._rolling, return_exceptions=True)
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_retryable),
                stop=stop_after_delay(REPLACE_S),
                wait=wait_random_exponential(multiplier=0.1, max=2.0),
                reraise=True,
            ):
                with attempt:
                    await self._replace_once()
        except StreamlibError as failed:
            error = failed
            if isinstance(failed, LedgerFencedError | InvalidTermError):
                self._fence(failed)
                error = StreamFencedError(f"stream {self.name!r} was taken over ({failed})")
            log.warning("stream %s: could not replace the failed ledger: %s", self.name, error)
        finally:
            self._replacing = None
        held, self._held = self._held, []
        for data, outer in held:
            if outer.done():
                continue
            if error is not None:
                outer.set_exception(error)
                continue
            try:
                inner = self.append_nowait(data)
            except StreamlibError as failed:
                outer.set_exception(failed)
            else:
                inner.add_done_callback(functools.partial(_copy_outcome, outer=outer))

    async def _replace_once(self) -> None:
        if self._fenced is not None:
            raise StreamFencedError(f"stream {self.name!r}: {self._fenced}")
        old = self._current
        assert old is not None
        if old.metadata.unbounded:  # its one ledger lives on: take it over again
            handle = await self._ledgers.take_over(old.ledger_id, STREAM_PASSWORD)
            self._use(handle)
            self._broken = None
            return
        closed = await old.close()  # at its LAC: what failed after it is not in the stream
        await self._record_final(closed.ledger_id, closed.last_entry_id + 1, closed.length)
        new = await self._create_ledger()
        if not await self._add_to_list(old, new):
            raise StreamFencedError(f"stream {self.name!r}: the list moved on without us")
        self._use(new)
        self.stats.rolls += 1
        self._broken = None

    async def check_age(self) -> None:
        """Roll a ledger (or an unbounded ledger's fragment) past its age even when no
        append comes (idle streams)."""
        handle = self._current
        if handle is None or self._rolling is not None or self._fenced is not None:
            return
        if self._closing:
            return
        if handle.metadata.unbounded:
            self._maybe_roll_fragment(handle)
            return
        entries = handle.next_entry_id
        if should_roll(entries, handle.length, now_ms(), self._roll_deadline, self._policy):
            await self.roll()

    def _start_age_checks(self) -> None:
        if self._policy.max_age_ms > 0 and self._age_checks is None and not self._closing:
            self._age_checks = asyncio.get_running_loop().create_task(self._check_age_loop())

    async def _check_age_loop(self) -> None:
        # A timer, not synchronisation: age is the one roll trigger no append brings.
        period = min(60.0, max(0.05, self._policy.max_age_ms / 4000))
        while self._fenced is None and not self._closing:
            await asyncio.sleep(period)
            try:
                await self.check_age()
            except Exception as error:  # a metadata hiccup: try again next period
                log.warning("stream %s: age check failed: %s", self.name, error)

    # -- closing ------------------------------------------------------------------------

    async def flush(self) -> None:
        pending = [p.outer for p in self._pending]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        self._closing = True
        if self._age_checks is not None:
            self._age_checks.cancel()
            await asyncio.gather(self._age_checks, return_exceptions=True)
            self._age_checks = None
        if self._rolling is not None:
            await asyncio.gather(self._rolling, return_exceptions=True)
        await self.flush()
        if self._current is not None and self._fenced is None:
            if self._current.metadata.unbounded:
                await self._current.release()  # the stream's one ledger stays open
                return
            try:
                metadata = await self._current.close()
            except (LedgerFencedError, InvalidTermError) as error:
                self._fence(error)
                return
            await self._record_final(
                metadata.ledger_id, metadata.last_entry_id + 1, metadata.length
            )

    async def _record_final(self, ledger_id: int, entries: int, size: int) -> None:
        async def attempt() -> None:
            md, version = await self._registry.read(self.name)
            for info in md.ledgers:
                if info.ledger_id == ledger_id:
                    info.entries, info.size_bytes = entries, size
            await self._registry.write(self.name, md, version)

        await retry_cas(f"stream {self.name!r}: recording ledger {ledger_id}'s size", attempt)


def _copy_outcome(
    done: asyncio.Future[tuple[int, int]], outer: asyncio.Future[tuple[int, int]]
) -> None:
    if outer.done():
        return
    if done.cancelled():
        outer.cancel()
    elif done.exception() is not None:
        outer.set_exception(done.exception())  # type: ignore[arg-type]
    else:
        outer.set_result(done.result())
