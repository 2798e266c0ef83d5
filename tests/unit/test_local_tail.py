"""LocalTail (streamlib/ledger/local.py) and its read rule, in one layer: what a writer of
this client hands its readers never passes the LAC, stays bounded, and ends with it."""

from __future__ import annotations

import asyncio

from streamlib.ledger.local import MAX_ENTRIES, LocalTail, LocalTails, TailBudget
from streamlib.protocol.actions import EntryData
from streamlib.protocol.read_rules import local_lac_usable
from streamlib.protocol.states import LedgerState


def entry(entry_id: int, size: int = 10) -> EntryData:
    return EntryData(entry_id, entry_id - 1, 0, bytes([entry_id % 256]) * size, b"")


def test_only_an_open_writer_of_the_current_term_of_an_open_ledger_is_used() -> None:
    assert local_lac_usable(True, 3, 3, LedgerState.OPEN)
    assert local_lac_usable(True, 4, 3, LedgerState.OPEN)  # our copy is older: fine
    assert not local_lac_usable(False, 3, 3, LedgerState.OPEN)  # stopped
    assert not local_lac_usable(True, 2, 3, LedgerState.OPEN)  # deposed by a newer term
    assert not local_lac_usable(True, 3, 3, LedgerState.IN_RECOVERY)
    assert not local_lac_usable(True, 3, 3, LedgerState.CLOSED)


async def test_entries_are_handed_out_up_to_the_lac_consecutively() -> None:
    tail = LocalTail(1, -1)
    tail.followers = 1
    assert tail.keeping
    tail.acknowledged(2, [entry(0), entry(1), entry(2)])
    assert [e.entry_id for e in tail.entries_from(0)] == [0, 1, 2]
    assert [e.entry_id for e in tail.entries_from(1)] == [1, 2]
    assert tail.entries_from(3) == []  # past the LAC: nothing
    tail.acknowledged(4, [entry(4)])  # 3 was not kept (no follower when it was sent)
    assert [e.entry_id for e in tail.entries_from(0)] == [0, 1, 2]
    assert [e.entry_id for e in tail.entries_from(4)] == [4]
    tail.acknowledged(3, [entry(3)])  # a LAC going back is ignored
    assert tail.lac == 4 and tail.entries_from(3) == []


async def test_what_is_kept_is_bounded() -> None:
    tail = LocalTail(1, -1)
    tail.followers = 1
    for i in range(MAX_ENTRIES + 50):
        tail.acknowledged(i, [entry(i)])
    assert tail.entries_from(0) == []  # the oldest went
    assert len(tail.entries_from(50)) == MAX_ENTRIES
    big = LocalTail(2, -1)
    big.followers = 1
    for i in range(20):
        big.acknowledged(i, [entry(i, size=1 << 20)])
    assert sum(len(e.payload) for e in big.entries_from(big.lac - 7)) <= 8 << 20
    assert big.entries_from(0) == []


async def test_a_waiter_wakes_on_progress_on_the_end_and_after_its_timeout() -> None:
    tail = LocalTail(1, 4)
    waiting = asyncio.ensure_future(tail.wait(4, 30))
    await asyncio.sleep(0)
    assert not waiting.done()
    tail.acknowledged(5, [])
    await asyncio.wait_for(waiting, 5)
    ended = asyncio.ensure_future(tail.wait(5, 30))
    await asyncio.sleep(0)
    tails = LocalTails()
    tails._tails[1] = tail
    tails.stop(tail)
    await asyncio.wait_for(ended, 5)
    assert not tail.open and tails.get(1) is None
    tail.acknowledged(9, [entry(9)])  # a stopped writer hands out nothing more
    assert tail.lac == 5 and tail.entries_from(9) == []
    await asyncio.wait_for(LocalTail(2, 0).wait(0, 0.01), 5)  # times out, returns


async def test_a_newer_writer_of_a_ledger_ends_the_older_ones_tail() -> None:
    tails = LocalTails()
    old = tails.start(7, 3, term=1)
    new = tails.start(7, 3, term=2)
    assert not old.open and tails.get(7) is new
    tails.stop(old)  # the old writer stopping later leaves the new one registered
    assert tails.get(7) is new


def test_the_tails_of_one_client_share_one_budget_the_oldest_going_first() -> None:
    """A broker tailing thousands of ledgers keeps what one budget allows across them
    (256 entries a ledger at 10,000 ledgers was most of its memory), each ledger's kept
    entries its newest ones, consecutive."""
    tails = LocalTails(TailBudget(max_entries=5, max_bytes=1000))
    a, b = tails.start(1, -1), tails.start(2, -1)
    for i in range(3):
        a.acknowledged(i, [entry(i)])
    for i in range(4):
        b.acknowledged(i, [entry(i)])
    assert tails.budget.entries == 5 and tails.budget.bytes == 50
    assert [e.entry_id for e in a.entries_from(2)] == [2]  # 0 and 1 went first
    assert a.entries_from(1) == []  # (older: from the bookies)
    assert [e.entry_id for e in b.entries_from(0)] == [0, 1, 2, 3]
    a.acknowledged(3, [entry(3, size=900)])  # the client's oldest (a's 2) goes for it
    assert [e.entry_id for e in a.entries_from(3)] == [3] and a.entries_from(2) == []
    assert tails.budget.bytes == 940
    b.acknowledged(4, [entry(4, size=100)])  # past the bytes: b's 0 to 3 go
    assert tails.budget.bytes == 1000 and tails.budget.entries == 2
    assert b.entries_from(3) == [] and [e.entry_id for e in b.entries_from(4)] == [4]
    tails.stop(a)  # an ended tail gives its share back
    assert tails.budget.entries == 1 and tails.budget.bytes == 100
    c = tails.start(3, -1)
    for i in range(10):
        c.acknowledged(i, [entry(i)])
    assert [e.entry_id for e in c.entries_from(5)] == [5, 6, 7, 8, 9]
    assert c.entries_from(4) == [] and b.entries_from(4) == []
    assert tails.budget.entries == 5


def test_an_entry_larger_than_the_budget_is_not_kept() -> None:
    tails = LocalTails(TailBudget(max_entries=10, max_bytes=100))
    tail = tails.start(1, -1)
    tail.acknowledged(0, [entry(0, size=101)])
    assert tail.lac == 0 and tail.entries_from(0) == [] and tails.budget.bytes == 0
