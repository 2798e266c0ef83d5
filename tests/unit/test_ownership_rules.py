"""streamlib.protocol.ownership: what counts as evidence that a stream's owner is gone
(a table), and the I/O that gathers it on this host (streamlib.liveness)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from metadata.backends.memory import MemoryStore
from metadata.services.brokers import BrokerInfo, BrokerRegistry
from streamlib import liveness
from streamlib.protocol.ownership import (
    Evidence,
    Incarnation,
    Probe,
    Process,
    may_answer_ready,
    may_take_over,
    owner_gone,
    process_state,
)

OWNER = Incarnation("b1", "i1", "host-a", 100, 5000)
AGAIN = Incarnation("b1", "i2", "host-a", 200, 6000)  # the same id, restarted


@pytest.mark.parametrize(
    ("registered", "probe", "process", "expected"),
    [
        # its own registration, nothing seen: wait for its session
        (OWNER, None, Process.ELSEWHERE, None),
        (OWNER, Probe.ANSWERED, Process.ELSEWHERE, None),
        (OWNER, Probe.SILENT, Process.ELSEWHERE, None),  # stopped, cut off: no evidence
        (OWNER, Probe.ANSWERED, Process.RUNNING, None),
        # positive evidence
        (OWNER, Probe.REFUSED, Process.ELSEWHERE, Evidence.REFUSED),
        (OWNER, None, Process.GONE, Evidence.GONE),
        (OWNER, Probe.ANSWERED, Process.GONE, Evidence.GONE),  # (its port reused)
        (AGAIN, None, Process.ELSEWHERE, Evidence.SUPERSEDED),
        (None, Probe.SILENT, Process.ELSEWHERE, None),  # (evicted falsely: registers again)
        (None, Probe.REFUSED, Process.ELSEWHERE, Evidence.REFUSED),
    ],
)
def test_evidence_that_an_owner_is_gone(registered, probe, process, expected):
    assert owner_gone(OWNER, registered, probe=probe, process=process) is expected


def test_the_mutation_takes_silence_for_evidence():
    assert owner_gone(OWNER, OWNER, probe=Probe.SILENT, evict_on_silence=True) is not None


@pytest.mark.parametrize(
    ("host", "running", "started", "expected"),
    [
        ("host-b", False, None, Process.ELSEWHERE),  # another host: nothing known
        ("host-a", False, None, Process.GONE),
        ("host-a", True, 5000, Process.RUNNING),
        ("host-a", True, 7777, Process.GONE),  # its pid, reused by another process
    ],
)
def test_what_this_host_knows_of_a_process(host, running, started, expected):
    assert process_state(OWNER, host, running, started) is expected


def test_an_owner_answers_and_fences_only_holding_the_lease():
    assert may_take_over(True) and not may_take_over(False)
    assert may_answer_ready(True, gone=False)
    assert not may_answer_ready(False, gone=False) and not may_answer_ready(True, gone=True)


def test_this_process_and_a_dead_child_as_this_host_sees_them():
    host, pid, started = liveness.identity()
    assert host and started > 0
    me = Incarnation("me", "x", host, pid, started)
    assert liveness.process_of(me) is Process.RUNNING
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child_started = liveness.start_time(child.pid)
    child.wait()
    assert liveness.start_time(child.pid) is None
    gone = Incarnation("child", "y", host, child.pid, child_started or 1)
    assert liveness.process_of(gone) is Process.GONE
    elsewhere = Incarnation("far", "z", "another-host", pid, started)
    assert liveness.process_of(elsewhere) is Process.ELSEWHERE


def test_a_zombie_counts_as_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Not reaped yet: a zombie once it exits (waitid with WNOWAIT leaves it so).
        import os

        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert liveness.start_time(child.pid) is None
    finally:
        child.wait()


async def test_probe_refused_answered_and_silent():
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    try:
        assert await liveness.probe(address) is Probe.ANSWERED
    finally:
        listening.close()
    assert await liveness.probe(address) is Probe.REFUSED
    assert await liveness.probe("not-an-address") is Probe.SILENT


async def test_two_evictors_of_one_dead_lease_delete_it_once():
    """The second evictor read the dead owner's lease too, but by the time it acts the
    next owner holds a new one (at version 0 as well): the epoch it read is stale, so it
    deletes nothing."""
    dead = BrokerInfo("b1", "h:1", incarnation="dead")
    nxt = BrokerInfo("b2", "h:2", incarnation="next")
    stores = [MemoryStore(f"evictors-{id(dead)}") for _ in range(3)]
    owner, evictor, stale = (BrokerRegistry(s) for s in stores)
    try:
        assert await owner.try_own("s", dead)
        read_first, epoch_first = await evictor.lease("s")
        read_late, epoch_late = await stale.lease("s")
        assert read_first == read_late == dead and epoch_first == epoch_late
        assert await evictor.evict_lease("s", epoch_first)
        assert await evictor.try_own("s", nxt)
        assert not await stale.evict_lease("s", epoch_late)  # (its read was stale)
        assert await owner.owner("s") == nxt
        assert not await evictor.try_own("s", dead)  # (held: no second lease)
        holder, epoch = await stale.lease("s")
        assert holder == nxt and epoch == epoch_first + 1
    finally:
        for store in stores:
            await store.close()


async def test_a_lease_from_before_epochs_is_never_evicted():
    assert not await BrokerRegistry(MemoryStore()).evict_lease("s", -1)


async def test_releasing_a_lease_frees_only_this_process_s():
    """A replacement process of the same broker id holds its own lease: the old one's
    release leaves it."""
    old = BrokerInfo("b1", "h:1", incarnation="old")
    new = BrokerInfo("b1", "h:1", incarnation="new")
    store = MemoryStore()
    registry = BrokerRegistry(store)
    try:
        assert await registry.try_own("s", new)
        await registry.release("s", old)
        assert await registry.owner("s") == new
        await registry.release("s", new)
        assert await registry.owner("s") is None
    finally:
        await store.close()
