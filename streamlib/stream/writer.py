"""The single writer of a managed stream: the asyncio driver of
:class:`streamlib.protocol.stream_writer.StreamWriterMachine` (takeover, rolling,
replacing a broken ledger: every decision is the machine's) plus the appends.

Acknowledgements are delivered in append order across ledger boundaries. A writer that
loses the stream to another (its ledger is fenced, or the list moved on without it)
fails every later append with StreamFencedError; what it had acknowledged stays in the
stream (the new writer recovered it). A writer whose ledger fails for another reason is
broken, not fenced: the appends in flight fail with that error (they are not in the
stream: the ledger is closed at its LAC) and the next append replaces the ledger,
retried while bookies come back (streamlib.retry.STREAM_LEDGER_REPLACE).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from metadata.errors import BadVersionError, MetadataError
from metadata.schemas import LedgerInfo, StreamMetadata, StreamMode
from metadata.services.streams import StreamRegistry
from streamlib.ledger.driver import MetadataStoreFailure
from streamlib.ledger.handles import WriteHandle
from streamlib.ledger.manager import LedgerManager
from streamlib.protocol.errors import (
    InvalidTermError,
    LedgerFencedError,
    StreamFencedError,
    StreamlibError,
)
from streamlib.protocol.stream_rules import (
    LedgerSpan,
    RolloverPolicy,
    may_append,
    roll_deadline_ms,
    should_roll,
)
from streamlib.protocol.stream_writer import (
    CloseLedger,
    CreateLedger,
    DiscardLedger,
    GiveUp,
    LedgerClosed,
    LedgerCloseFailed,
    LedgerCreated,
    LedgerCreateFailed,
    LedgerFailed,
    LedgerRecovered,
    LedgerRecoveryFailed,
    LedgerTakenOver,
    ListConflict,
    ListFailed,
    ListRead,
    ListWritten,
    ReadList,
    RecordSize,
    RecoverLedger,
    ReplaceFailed,
    Rolled,
    Serve,
    State,
    StreamAction,
    StreamEvent,
    StreamWriterMachine,
    TakeOverLedger,
    WriteList,
)
from streamlib.retry import (
    FENCING,
    STREAM_LEDGER_CLOSE,
    STREAM_LEDGER_REPLACE,
    retriable_unless_fenced,
    retry_cas,
)
from streamlib.tasks import HeldTasks

log = logging.getLogger(__name__)

# A stream's ledgers each get a random password (their secret, kept in the ledger's
# private metadata node); readers open them with none (crc32c digests need no key) and a
# taking-over writer recovers them with the stored secret (LedgerManager.material).
# Ledgers made before key version 1 had the empty password; the same calls open them.
STREAM_PASSWORD = None


def now_ms() -> int:
    return int(time.time() * 1000)


def _failure(error: Exception) -> StreamlibError:
    if isinstance(error, StreamlibError):
        return error
    return MetadataStoreFailure(f"metadata store: {error}")


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
        fail_stop: bool = False,
    ) -> None:
        self._ledgers = ledgers
        self._registry = registry
        self.name = name
        self._machine = StreamWriterMachine(
            name, max_takeover_attempts=max_takeover_attempts, fail_stop=fail_stop
        )
        self._handles: dict[int, WriteHandle] = {}  # ledgers we write, until closed
        self._md = StreamMetadata()  # the list as last read (WriteList rewrites it)
        self._current: WriteHandle | None = None
        self._roll_deadline: int | None = None
        self._age_checks: asyncio.Task[None] | None = None  # idle streams roll by age too
        self._closing = False
        self._pending: collections.deque[_Pending] = collections.deque()
        # Appends waiting: while the ledger is broken, or entries of the ledger a roll
        # moved away from are still in flight (one ledger at a time, see append_nowait)
        self._held: list[tuple[bytes, asyncio.Future[tuple[int, int]]]] = []
        self._replacing: asyncio.Task[None] | None = None
        self._outcome: asyncio.Future[None] | None = None  # of start() or a replace()
        self._op_done = asyncio.Event()  # set while the machine has no operation going
        self._op_done.set()
        self._tasks = HeldTasks(f"stream {name!r}")
        self._rnd = random.Random()
        self._policy = RolloverPolicy()
        self._config: tuple[int, int, int] = (3, 2, 2)
        self._on_roll = on_roll
        self._fragment_first = -1
        self._fragment_base_length = 0
        self.stats = WriterStats()

    @property
    def ledger_id(self) -> int | None:
        return self._current.ledger_id if self._current else None

    @property
    def _fenced(self) -> StreamlibError | None:
        return self._machine.error if self._machine.state is State.FENCED else None

    # -- carrying the machine's actions ---------------------------------------------------

    def _step(self, event: StreamEvent) -> None:
        self._execute(self._machine.step(event))

    def _execute(self, actions: list[StreamAction]) -> None:
        for action in actions:
            if isinstance(action, Serve):
                self._serve(self._handles[action.ledger_id])
            elif isinstance(action, GiveUp):
                self._give_up(action.error)
            elif isinstance(action, ReplaceFailed):
                self._settle(action.error)
            elif isinstance(action, Rolled):
                self.stats.rolls += 1
                if self._on_roll is not None:
                    self._on_roll()
            else:
                self._tasks.spawn(self._carry(action))
        if self._machine.op is None:
            self._op_done.set()
        else:
            self._op_done.clear()

    async def _carry(self, action: StreamAction) -> None:
        if isinstance(action, ReadList):
            await self._read_list()
        elif isinstance(action, WriteList):
            await self._write_list(action)
        elif isinstance(action, RecoverLedger):
            await self._recover(action.ledger_id)
        elif isinstance(action, CreateLedger):
            await self._create(action.unbounded)
        elif isinstance(action, TakeOverLedger):
            await self._take_over(action.ledger_id)
        elif isinstance(action, CloseLedger):
            await self._close_ledger(action.ledger_id)
        elif isinstance(action, DiscardLedger):
            await self._discard(action.ledger_id)
        elif isinstance(action, RecordSize):
            await self._record_size(action)
        else:  # pragma: no cover - every action kind must be carried
            raise TypeError(f"no I/O for {action!r}")

    async def _read_list(self) -> None:
        try:
            md, version = await self._registry.read(self.name)
        except (StreamlibError, MetadataError) as error:
            self._step(ListFailed(_failure(error)))
            return
        self._md = md
        self._load_config(md)
        spans = [
            LedgerSpan(i.ledger_id, i.entries, i.size_bytes, i.created_time_ms) for i in md.ledgers
        ]
        self._step(ListRead(spans, version, md.mode == StreamMode.UNBOUNDED))

    async def _write_list(self, action: WriteList) -> None:
        md = self._md
        infos = []
        for span in action.ledgers:
            info = LedgerInfo(
                ledger_id=span.ledger_id,
                entries=span.entries,
                size_bytes=span.size_bytes,
                created_time_ms=span.created_time_ms or now_ms(),
            )
            handle = self._handles.get(span.ledger_id)
            if handle is not None and handle.next_entry_id:  # its size so far
                info.entries, info.size_bytes = handle.next_entry_id, handle.length
            infos.append(info)
        del md.ledgers[:]
        md.ledgers.extend(infos)
        try:
            version = await self._registry.write(self.name, md, action.expected_version)
        except BadVersionError:
            self._step(ListConflict())
            return
        except (StreamlibError, MetadataError) as error:
            self._step(ListFailed(_failure(error)))
            return
        self._step(ListWritten(version))

    async def _recover(self, ledger_id: int) -> None:
        try:
            handle = await self._ledgers.open(ledger_id, password=STREAM_PASSWORD)
        except StreamlibError as error:
            self._step(LedgerRecoveryFailed(ledger_id, error))
            return
        self._step(LedgerRecovered(ledger_id, handle.last_entry_id + 1, handle.metadata.length))

    async def _create(self, unbounded: bool) -> None:
        e, qw, qa = self._config
        try:
            handle = await self._ledgers.create(
                e,
                qw,
                qa,
                password=secrets.token_bytes(32),
                custom_metadata={"stream": self.name.encode()},
                unbounded=unbounded,
            )
        except (StreamlibError, MetadataError) as error:
            self._step(LedgerCreateFailed(_failure(error)))
            return
        self._handles[handle.ledger_id] = handle
        self.stats.ledgers_created.append(handle.ledger_id)
        self._step(LedgerCreated(handle.ledger_id))

    async def _take_over(self, ledger_id: int) -> None:
        try:
            handle = await self._ledgers.take_over(ledger_id, STREAM_PASSWORD)
        except StreamlibError as error:
            self._step(LedgerRecoveryFailed(ledger_id, error))
            return
        self._handles[ledger_id] = handle
        self._step(LedgerTakenOver(ledger_id))

    async def _close_ledger(self, ledger_id: int) -> None:
        handle = self._handles[ledger_id]
        try:  # transient failures retried here: readers wait for this close
            closed = await STREAM_LEDGER_CLOSE.run(
                f"stream {self.name!r}: closing ledger {ledger_id}", handle.close
            )
        except StreamlibError as error:
            fenced = isinstance(error, FENCING)
            if fenced:
                self._handles.pop(ledger_id, None)
            self._step(LedgerCloseFailed(ledger_id, error, fenced))
            return
        if self._handles.get(ledger_id) is handle:
            del self._handles[ledger_id]
        self._step(LedgerClosed(ledger_id, closed.last_entry_id + 1, closed.length))

    async def _discard(self, ledger_id: int) -> None:
        handle = self._handles.pop(ledger_id, None)
        try:
            if handle is not None:
                await handle.close()
            await self._ledgers.delete(ledger_id)
        except StreamlibError as error:  # left for the sweeper
            log.info("stream %s: could not discard ledger %d: %s", self.name, ledger_id, error)

    async def _record_size(self, action: RecordSize) -> None:
        async def attempt() -> None:
            md, version = await self._registry.read(self.name)
            for info in md.ledgers:
                if info.ledger_id == action.ledger_id:
                    info.entries, info.size_bytes = action.entries, action.size_bytes
            await self._registry.write(self.name, md, version)

        try:
            await retry_cas(f"stream {self.name!r}: ledger {action.ledger_id}'s size", attempt)
        except (StreamlibError, MetadataError) as error:  # informational: retention waits
            log.warning("stream %s: %s", self.name, error)

    def _load_config(self, md: StreamMetadata) -> None:
        cfg = md.ledger_config
        self._config = (cfg.ensemble_size or 3, cfg.write_quorum or 2, cfg.ack_quorum or 2)
        r = md.rollover
        self._policy = RolloverPolicy(r.max_entries, r.max_bytes, r.max_age_ms)

    # -- outcomes -------------------------------------------------------------------------

    def _serve(self, handle: WriteHandle) -> None:
        self._start_age_checks()
        self._current = handle
        self._roll_deadline = roll_deadline_ms(now_ms(), self._policy, self._rnd)
        self.stats.takeover_attempts = self._machine.takeover_attempts
        self._settle(None)

    def _give_up(self, error: StreamlibError) -> None:
        log.info("stream %s: fenced out (%s)", self.name, error)
        self._settle(error)

    def _settle(self, error: StreamlibError | None) -> None:
        outcome, self._outcome = self._outcome, None
        if outcome is not None and not outcome.done():
            if error is None:
                outcome.set_result(None)
            else:
                outcome.set_exception(error)

    async def _run(self, actions: list[StreamAction]) -> None:
        """Carry actions until the machine serves a ledger (or says why not)."""
        self._outcome = asyncio.get_running_loop().create_future()
        outcome = self._outcome
        self._execute(actions)
        await outcome

    # -- takeover -------------------------------------------------------------------------

    async def start(self) -> None:
        """Take over the stream: recover the last two ledgers, add a new one by CAS. An
        unbounded stream lives in ONE unbounded ledger, taken over by term instead."""
        # Before anything is fenced: a principal that may not add would otherwise fence
        # the live writer's ledgers and only then fail.
        await self._ledgers.check_may_add(f"produce to stream {self.name!r}")
        await self._run(self._machine.start())

    # -- appends --------------------------------------------------------------------------

    def append_nowait(self, data: bytes) -> asyncio.Future[tuple[int, int]]:
        """Append one entry; the future gives (ledger id, entry id) once acknowledged,
        in append order."""
        outer: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        return self._append(data, outer)

    def _append(
        self, data: bytes, outer: asyncio.Future[tuple[int, int]]
    ) -> asyncio.Future[tuple[int, int]]:
        """append_nowait, settling `outer` (a held entry's own future, when it goes)."""
        if self._fenced is not None:
            raise StreamFencedError(str(self._fenced))  # (it names the stream)
        if self._current is None:
            raise StreamFencedError(f"stream {self.name!r}: the writer has not started")
        loop = asyncio.get_running_loop()
        if self._machine.state is State.BROKEN or self._replacing is not None:
            self._held.append((data, outer))  # sent once the ledger is replaced
            if self._replacing is None:
                self._replacing = loop.create_task(self._replace())
            return outer
        handle = self._current
        in_flight_on = self._pending[-1].ledger_id if self._pending else None
        if self._held or (
            self._machine.fail_stop and not may_append(handle.ledger_id, in_flight_on)
        ):
            # One ledger at a time (a fail-stop writer's): a roll's new ledger takes
            # nothing while entries of the old one are in flight. Were one of those to
            # fail, what went to the new one would be stored after it -- and a resend of
            # the failed one deduplicated against it (a broker's), lost. They go once the
            # old ones are in (_drain). (A writer that replaces a failed ledger and goes on
            # stores after a failure anyway: it pipelines through its rolls.)
            self._held.append((data, outer))
            return outer
        try:
            inner = handle.append_nowait([data])[0]
        except StreamlibError as error:
            if not retriable_unless_fenced(error):
                raise
            # It failed with nothing in flight: replace it now.
            self._step(LedgerFailed(handle.ledger_id, error, False))
            return self._append(data, outer)
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
            if isinstance(error, StreamlibError):
                fenced = isinstance(error, LedgerFencedError | InvalidTermError)
                self._step(LedgerFailed(item.ledger_id, error, fenced))
                if fenced:
                    error = StreamFencedError(
                        f"stream {self.name!r} was taken over by another writer ({error})"
                    )
            item.outer.set_exception(error)
        if self._held and not self._pending and self._replacing is None:
            self._release_held()  # (the old ledger's entries are in: the new one's turn)
        handle = self._current
        if handle is not None and handle.metadata.unbounded and not self._stopped():
            self._maybe_roll_fragment(handle)  # fragments roll as the LAC moves

    def _release_held(self, error: StreamlibError | None = None) -> None:
        """Append what was held, in order (or fail it with `error`), each settling its
        own future in its place (before anything appended later). A fenced or fail-stop
        writer that gave up meanwhile fails it: nothing goes after a failure."""
        held, self._held = self._held, []
        for data, outer in held:
            if outer.done():
                continue
            if error is not None:
                outer.set_exception(error)
                continue
            try:
                self._append(data, outer)
            except StreamlibError as failed:
                outer.set_exception(failed)

    def _stopped(self) -> bool:
        return self._fenced is not None or self._closing

    async def _replace(self) -> None:
        """The current ledger failed (not fenced): replace it, then send what was held."""
        error: StreamlibError | None = None

        async def replace_once() -> None:
            await self._op_done.wait()  # a roll in flight ends first
            if self._machine.state is State.BROKEN:
                await self._run(self._machine.replace())

        try:
            await STREAM_LEDGER_REPLACE.run(
                f"stream {self.name!r}: replacing its failed ledger", replace_once
            )
        except StreamlibError as failed:
            error = failed
            log.warning("stream %s: could not replace the failed ledger: %s", self.name, error)
        finally:
            self._replacing = None
        self._release_held(error)

    # -- rolling --------------------------------------------------------------------------

    def _maybe_roll(self) -> None:
        handle = self._current
        if handle is None or self._machine.op is not None:
            return
        if handle.metadata.unbounded:
            self._maybe_roll_fragment(handle)
            return
        entries = handle.next_entry_id  # entries handed to this ledger
        if should_roll(entries, handle.length, now_ms(), self._roll_deadline, self._policy):
            self._execute(self._machine.roll())

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
        """Roll now (also used by age-based rolling on idle streams); returns once the
        roll (or whatever operation was in flight) is over."""
        self._execute(self._machine.roll())
        await self._op_done.wait()

    async def check_age(self) -> None:
        """Roll a ledger (or an unbounded ledger's fragment) past its age even when no
        append comes (idle streams)."""
        handle = self._current
        if handle is None or self._machine.op is not None or self._stopped():
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

    # -- closing --------------------------------------------------------------------------

    async def flush(self) -> None:
        pending = [p.outer for p in self._pending] + [outer for _, outer in self._held]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        self._closing = True
        if self._age_checks is not None:
            self._age_checks.cancel()
            await asyncio.gather(self._age_checks, return_exceptions=True)
            self._age_checks = None
        if self._replacing is not None:
            await asyncio.gather(self._replacing, return_exceptions=True)
        await self._op_done.wait()  # a roll in flight finishes (and closes its old ledger)
        await self.flush()
        current = self._current
        self._machine.close()
        if current is not None and self._fenced is None:
            if current.metadata.unbounded:
                await current.release()  # the stream's one ledger stays open
            else:
                try:  # (a broken ledger too: it closes at its LAC)
                    closed = await current.close()
                except StreamlibError as error:
                    log.info("stream %s: could not close at the end (%s)", self.name, error)
                else:
                    await self._record_size(
                        RecordSize(closed.ledger_id, closed.last_entry_id + 1, closed.length)
                    )
        await self._tasks.wait()
