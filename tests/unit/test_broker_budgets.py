"""The broker's byte budget for sends in flight (streamlib/broker/access.py ByteBudget,
HeldBytes) and its session limits, this layer alone."""

from __future__ import annotations

import asyncio

import pytest

from streamlib.broker.access import ByteBudget, HeldBytes, SessionLimits
from streamlib.errors import TooManySessionsError
from streamlib.protocol.service_access import Caller


async def test_a_taker_waits_while_the_budget_is_spent_and_goes_when_bytes_come_back() -> None:
    budget = ByteBudget(100)
    first, second = HeldBytes(budget), HeldBytes(budget)
    await first.take(80)
    waiting = asyncio.ensure_future(second.take(30))
    await asyncio.sleep(0)  # (one turn: it found the budget spent)
    assert not waiting.done() and budget.held == 80
    first.give_back(50)
    await asyncio.wait_for(waiting, 5)
    assert (budget.held, first.held, second.held) == (60, 30, 30)


async def test_a_send_larger_than_the_whole_budget_goes_alone() -> None:
    budget = ByteBudget(100)
    held = HeldBytes(budget)
    await asyncio.wait_for(held.take(1_000), 5)  # nothing else held: it goes
    other = asyncio.ensure_future(HeldBytes(budget).take(1))
    await asyncio.sleep(0)
    assert not other.done()
    held.give_back_all()
    await asyncio.wait_for(other, 5)
    assert budget.held == 1


async def test_a_sessions_end_gives_back_what_it_still_holds() -> None:
    budget = ByteBudget(100)
    held = HeldBytes(budget)
    await held.take(40)
    await held.take(40)
    held.give_back(40)
    held.give_back_all()
    assert budget.held == 0 and held.held == 0


def test_sessions_are_capped_per_broker_and_per_principal() -> None:
    limits = SessionLimits(max_sessions=3, max_per_principal=2)
    alice, bob = Caller("alice"), Caller("bob")
    limits.take(alice)
    limits.take(alice)
    with pytest.raises(TooManySessionsError, match="principal alice holds 2 sessions"):
        limits.take(alice)
    limits.take(bob)
    with pytest.raises(TooManySessionsError, match="this broker holds 3 sessions"):
        limits.take(bob)
    limits.give_back(alice)
    limits.take(bob)
    assert limits.by_principal == {"alice": 1, "bob": 2}
