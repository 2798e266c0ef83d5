"""A stream writer stores no entry after one that failed, when it is fail-stop (a broker's).

The broker deduplicates a resend against the highest sequence id stored: an entry stored
after one that failed makes the failed one's resend a "duplicate", acknowledged and never
stored (an hour of chaos with partitions and disk faults lost 540 acknowledged messages
so, answered with -1:-1:-1). Two ways led there, both tested here on the StreamWriter
driver with a fake ledger layer whose appends the test settles by hand:

- a roll: the new ledger took appends while entries of the old one were in flight, and
  those failed (their ledger ran out of bookies, or a takeover fenced it);
- a broken ledger: an append made between the failure and the broker's noticing it was
  held, and written to the replacement ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import metadata
from metadata.schemas import StreamMetadata
from metadata.services.streams import StreamRegistry
from streamlib.protocol.errors import NotEnoughBookiesError, StreamlibError
from streamlib.protocol.stream_rules import LedgerSpan
from streamlib.protocol.stream_writer import (
    CloseLedger,
    CreateLedger,
    DiscardLedger,
    GiveUp,
    LedgerCreated,
    LedgerFailed,
    ListRead,
    ListWritten,
    ReadList,
    Serve,
    State,
    StreamWriterMachine,
)
from streamlib.stream.writer import StreamWriter


@dataclass
class _Md:
    unbounded: bool = False
    length: int = 0


@dataclass
class _Closed:
    ledger_id: int
    last_entry_id: int
    length: int


@dataclass
class FakeLedger:
    """A ledger whose appends the test acknowledges or fails; what it acknowledged is
    what it stores."""

    ledger_id: int
    pending: list[tuple[bytes, asyncio.Future[int]]] = field(default_factory=list)
    stored: list[bytes] = field(default_factory=list)
    failed: StreamlibError | None = None
    next_entry_id: int = 0
    length: int = 0
    last_add_confirmed: int = -1
    metadata: _Md = field(default_factory=_Md)

    def append_nowait(self, data: list[bytes]) -> list[asyncio.Future[int]]:
        if self.failed is not None:
            raise self.failed
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.pending.append((data[0], future))
        self.next_entry_id += 1
        self.length += len(data[0])
        return [future]

    def ack_all(self) -> None:
        for data, future in self.pending:
            self.last_add_confirmed += 1
            self.stored.append(data)
            future.set_result(self.last_add_confirmed)
        self.pending.clear()

    def fail(self, error: StreamlibError) -> None:
        self.failed = error
        for _, future in self.pending:
            future.set_exception(error)
        self.pending.clear()

    async def close(self) -> _Closed:
        while self.pending:  # (a close waits for the adds in flight, as a handle's)
            await asyncio.sleep(0.001)
        return _Closed(self.ledger_id, self.last_add_confirmed, self.length)


class FakeLedgers:
    def __init__(self) -> None:
        self.ledgers: dict[int, FakeLedger] = {}
        self._next = 1

    async def check_may_add(self, what: str) -> None:
        pass

    async def create(self, *args: Any, **kwargs: Any) -> FakeLedger:
        ledger = self.ledgers[self._next] = FakeLedger(self._next)
        self._next += 1
        return ledger

    async def delete(self, ledger_id: int) -> None:
        self.ledgers.pop(ledger_id, None)

    def stored(self) -> list[bytes]:
        return [data for _, ledger in sorted(self.ledgers.items()) for data in ledger.stored]


@contextlib.asynccontextmanager
async def _writer(fail_stop: bool) -> AsyncIterator[tuple[StreamWriter, FakeLedgers]]:
    """A started writer of stream "s" on FakeLedgers (and a memory metadata store)."""
    store = await metadata.connect(f"memory://prefix-{uuid.uuid4().hex}")
    try:
        registry = StreamRegistry(store)
        await registry.create(StreamMetadata(name="s"))
        ledgers = FakeLedgers()
        writer = StreamWriter(ledgers, registry, "s", fail_stop=fail_stop)  # type: ignore[arg-type]
        await writer.start()
        yield writer, ledgers
    finally:
        await store.close()


async def _settled(futures: list[asyncio.Future[Any]]) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5.0)


async def _until(predicate: Any) -> None:
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(wait(), 5.0)


async def test_a_roll_takes_no_append_to_the_new_ledger_while_the_old_has_some_in_flight():
    async with _writer(fail_stop=True) as (writer, ledgers):
        old = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        before = [writer.append_nowait(b"m0"), writer.append_nowait(b"m1")]
        await writer._run(writer._machine.roll())  # serves the new ledger from here on
        new = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        assert new is not old and old.pending
        after = [writer.append_nowait(b"m2"), writer.append_nowait(b"m3")]
        assert new.pending == []  # held: m0 and m1 are still in flight
        old.fail(NotEnoughBookiesError("no bookie left for an ensemble change"))
        outcomes = await _settled(before + after)
        assert all(isinstance(o, StreamlibError) for o in outcomes), outcomes
        assert ledgers.stored() == []  # m2 and m3 were never written after the failure
        with pytest.raises(StreamlibError):
            writer.append_nowait(b"m4")  # fail-stop: the writer gave up


async def test_held_appends_go_to_the_new_ledger_in_order_once_the_old_ones_are_in():
    async with _writer(fail_stop=True) as (writer, ledgers):
        old = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        before = [writer.append_nowait(b"m0"), writer.append_nowait(b"m1")]
        await writer._run(writer._machine.roll())
        new = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        after = [writer.append_nowait(b"m2"), writer.append_nowait(b"m3")]
        old.ack_all()
        await _until(lambda: len(new.pending) == 2)
        assert [data for data, _ in new.pending] == [b"m2", b"m3"]
        new.ack_all()
        outcomes = await _settled(before + after)
        assert [o[0] for o in outcomes] == [old.ledger_id] * 2 + [new.ledger_id] * 2
        assert ledgers.stored() == [b"m0", b"m1", b"m2", b"m3"]


async def test_a_fail_stop_writer_stores_nothing_appended_after_a_failed_entry():
    async with _writer(fail_stop=True) as (writer, ledgers):
        ledger = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        first = writer.append_nowait(b"m0")
        ledger.fail(NotEnoughBookiesError("no bookie left for an ensemble change"))
        # Before the failure reached anyone (its callbacks are queued): the broker's
        # next publish comes in here.
        with pytest.raises(StreamlibError):
            writer.append_nowait(b"m1")
        assert isinstance((await _settled([first]))[0], StreamlibError)
        with pytest.raises(StreamlibError):
            writer.append_nowait(b"m2")
        assert ledgers.stored() == [] and len(ledgers.ledgers) == 1  # nothing replaced it


async def test_a_writer_that_is_not_fail_stop_still_replaces_a_broken_ledger():
    async with _writer(fail_stop=False) as (writer, ledgers):
        ledger = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        first = writer.append_nowait(b"m0")
        ledger.fail(NotEnoughBookiesError("no bookie left for an ensemble change"))
        assert isinstance((await _settled([first]))[0], StreamlibError)
        second = writer.append_nowait(b"m1")  # held, then sent to the replacement
        await _until(lambda: writer.ledger_id != ledger.ledger_id and writer._held == [])
        ledgers.ledgers[writer.ledger_id].ack_all()  # type: ignore[index]
        assert (await _settled([second]))[0][0] == writer.ledger_id
        assert ledgers.stored() == [b"m1"]


def _rolled(fail_stop: bool) -> StreamWriterMachine:
    """A machine serving ledger 2, rolled to from ledger 1 (not closed yet)."""
    m = StreamWriterMachine("s", fail_stop=fail_stop)
    assert m.start() == [ReadList()]
    assert m.step(ListRead([], 0, False)) == [CreateLedger()]
    m.step(LedgerCreated(1))
    assert m.step(ListWritten(1)) == [Serve(1)]
    assert m.roll() == [CreateLedger()]
    m.step(LedgerCreated(2))
    m.step(ListRead([LedgerSpan(1)], 1, False))
    assert m.step(ListWritten(2)) == [Serve(2), CloseLedger(1)]
    return m


@pytest.mark.parametrize("ledger_id", [1, 2])
def test_the_machine_of_a_fail_stop_writer_gives_up_at_any_ledgers_failure(ledger_id):
    m = _rolled(fail_stop=True)
    (give_up,) = m.step(LedgerFailed(ledger_id, NotEnoughBookiesError("none left"), False))
    assert isinstance(give_up, GiveUp) and m.state is State.FENCED
    assert m.replace() == []  # no replacement: the next owner's takeover decides


def test_the_machine_of_another_writer_replaces_its_current_ledger_only():
    m = _rolled(fail_stop=False)
    assert m.step(LedgerFailed(1, NotEnoughBookiesError("none left"), False)) == []
    assert m.state is State.SERVING  # (the ledger rolled away from)
    assert m.step(LedgerFailed(2, NotEnoughBookiesError("none left"), False)) == []
    assert m.state is State.BROKEN


async def test_a_roll_that_completes_after_a_fail_stop_writer_gave_up_serves_nothing():
    async with _writer(fail_stop=True) as (writer, ledgers):
        old = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        cas = asyncio.Event()
        write = writer._registry.write

        async def held_cas(*args: Any, **kwargs: Any) -> int:
            await cas.wait()
            return await write(*args, **kwargs)

        writer._registry.write = held_cas  # type: ignore[method-assign]
        first = writer.append_nowait(b"X")
        writer._execute(writer._machine.roll())  # its list CAS waits
        await _until(lambda: writer._machine._new is not None)
        old.fail(NotEnoughBookiesError("no bookie left for an ensemble change"))
        assert isinstance((await _settled([first]))[0], StreamlibError)
        cas.set()  # the CAS goes through now: the new ledger is in the list
        await _until(lambda: writer._machine._new is None)
        assert writer._machine.state is State.FENCED and writer.ledger_id == old.ledger_id
        with pytest.raises(StreamlibError):
            writer.append_nowait(b"Y")
        assert ledgers.stored() == []


async def test_held_appends_settle_in_append_order_with_those_after_them():
    async with _writer(fail_stop=True) as (writer, ledgers):
        old = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        order: list[str] = []
        a = writer.append_nowait(b"A")
        await writer._run(writer._machine.roll())
        new = ledgers.ledgers[writer.ledger_id]  # type: ignore[index]
        x = writer.append_nowait(b"X")  # held: A is in flight on the old ledger
        old.ack_all()
        await _until(lambda: len(new.pending) == 1)
        z = writer.append_nowait(b"Z")
        for name, future in (("A", a), ("X", x), ("Z", z)):
            future.add_done_callback(lambda _, name=name: order.append(name))
        new.ack_all()
        await _settled([a, x, z])
        assert order == ["A", "X", "Z"]


def test_after_giving_up_the_machine_only_cleans_up_what_its_operations_answer():
    m = StreamWriterMachine("s", fail_stop=True)
    m.start()
    m.step(ListRead([], 0, False))
    m.step(LedgerCreated(1))
    m.step(ListWritten(1))
    assert m.roll() == [CreateLedger()]
    m.step(LedgerFailed(1, NotEnoughBookiesError("none left"), False))  # gives up
    assert m.step(LedgerCreated(2)) == [DiscardLedger(2)]  # (not in the list)
    assert m.step(ListWritten(3)) == [] and m.state is State.FENCED and m.current == 1
