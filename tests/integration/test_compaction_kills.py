"""A compactor SIGKILLed at each of its steps (streamlib/stream/compaction.py) leaves a
readable, correct compacted view, and the next compaction completes it; the ledgers the
killed one leaked are swept, never the installed view nor the stream's own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import pytest

from metadata.errors import NoNodeError
from streamlib.stream.compacted import view_of
from streamlib.stream.compaction import compactor_path
from streamlib.stream.positions import EARLIEST
from tests.integration.conftest import LedgerCluster, script_process

pytestmark = pytest.mark.timeout(300)

STEPS = ("scanned", "created", "written", "closed", "installed", "done")

# Compacts the stream, stopping for good at the named step (the test kills it there).
KILLED_COMPACTOR = """
import asyncio, sys
import streamlib

async def main(uri, stream, stop_at):
    client = await streamlib.Client.connect(uri, session_timeout_s=3)
    def step(name):
        if name == stop_at:
            print("at " + name, flush=True)
            sys.stdin.readline()  # (holds the loop: nothing more happens until the kill)
    await client.streams.compact(stream, on_step=step)

asyncio.run(main(*sys.argv[1:]))
"""


async def latest_by_compacted_read(client: Any, stream: str) -> dict[str, bytes]:
    reader = await client.create_reader(stream, EARLIEST, read_compacted=True)
    found: dict[str, bytes] = {}
    while await reader.has_message_available():
        message = await reader.read_next(timeout=30)
        if message.data:
            found[message.key] = message.data
        else:
            found.pop(message.key, None)
    await reader.close()
    return found


async def test_a_compactor_killed_at_each_step_leaves_a_correct_view(
    cluster: LedgerCluster,
) -> None:
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("ledger-of-accounts")
    latest: dict[str, bytes] = {}
    round_number = 0

    async def update(count: int) -> None:
        nonlocal round_number
        round_number += 1
        for i in range(count):
            key, value = f"acct{i % 40}", b"r%d-%d" % (round_number, i)
            if i % 97 == 13:  # now and then a tombstone
                value = b""
            await producer.send_async(value, key=key)
            if value:
                latest[key] = value
            else:
                latest.pop(key, None)
        await producer.flush()

    await update(600)
    first = await client.streams.compact("ledger-of-accounts")
    assert first.compacted
    for step in STEPS:
        await update(300)
        md, _ = await client.streams.read("ledger-of-accounts")
        before = view_of(md)
        assert before is not None
        known = set(await client.ledgers.list())
        async with script_process(
            KILLED_COMPACTOR, cluster.metadata_uri, "ledger-of-accounts", step, ready=f"at {step}"
        ) as compactor:
            os.kill(compactor.pid, signal.SIGKILL)
            compactor.wait()
        # Its node (one compactor at a time) goes with its metadata session; until then the
        # sweeper leaves the ledger it names alone (a live compactor's, for all it knows).
        node = compactor_path(client.streams.registry, "ledger-of-accounts")
        made = set(await client.ledgers.list()) - known
        if step == "written":
            assert made and not made & set(await client.streams.sweep(grace_s=0)), step
            deadline = asyncio.get_running_loop().time() + 30
            while await client.store.exists(node) is not None:
                assert asyncio.get_running_loop().time() < deadline, "the node outlived its session"
                await asyncio.sleep(0.1)
        else:  # (its session would end it in seconds: the test does not wait for every one)
            with contextlib.suppress(NoNodeError):
                await client.store.delete(node)
        md, _ = await client.streams.read("ledger-of-accounts")
        view = view_of(md)
        assert view is not None
        installed = step in ("installed", "done")
        assert (view.ledger_id != before.ledger_id) == installed, step
        # The installed view is whole and readable, and view + tail is the changelog's end.
        handle = await client.ledgers.open(view.ledger_id, password=None, recover=False)
        assert handle.is_closed and handle.last_entry_id + 1 == view.entries
        await handle.close()
        assert await latest_by_compacted_read(client, "ledger-of-accounts") == latest, step
        # What it leaked is swept (the sweeper's grace at 0), and nothing else.
        leaked = set(await client.ledgers.list()) - known
        if step == "installed":
            leaked = {before.ledger_id}  # (the new view is installed: the old one leaked)
        else:
            leaked -= {view.ledger_id}
        swept = set(await client.streams.sweep(grace_s=0))
        assert swept == leaked, step
        assert view.ledger_id not in swept
        assert not swept & {i.ledger_id for i in md.ledgers}
        # The next compaction completes the work.
        again = await client.streams.compact("ledger-of-accounts")
        assert again.compacted == (not installed), step
        assert await latest_by_compacted_read(client, "ledger-of-accounts") == latest, step
    await producer.close()
