"""Several processes on one store: the guarantees the embedded store must give across
processes, checked on sqlite and on a real ZooKeeper."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import metadata
from metadata.services import LedgerIdGenerator

WORKERS = Path(__file__).with_name("workers.py")
PROCESSES = 4


def spawn(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKERS), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(processes: list[subprocess.Popen[str]], timeout_s: float) -> list[str]:
    outputs = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=timeout_s)
            assert process.returncode == 0, err
            outputs.append(out)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return outputs


@pytest.mark.slow
async def test_concurrent_cas_from_four_processes_has_exactly_one_winner_per_version(
    shared_metadata_uri, subprocess_env
):
    rounds = 1000
    async with await metadata.connect(shared_metadata_uri) as store:
        await store.create("/counter", (0).to_bytes(8, "big"))
        workers = [
            spawn(subprocess_env, "cas", shared_metadata_uri, "/counter", str(rounds))
            for _ in range(PROCESSES)
        ]
        outputs = await asyncio.to_thread(finish, workers, 240)
        final = await store.get("/counter")
    won = [int(v) for out in outputs for v in out.split()]
    assert int.from_bytes(final.data, "big") == PROCESSES * rounds
    assert final.version == PROCESSES * rounds
    # Each version was won by exactly one CAS: no lost update, no double win.
    assert sorted(won) == list(range(PROCESSES * rounds))


async def test_ledger_ids_are_unique_across_processes(shared_metadata_uri, subprocess_env):
    workers = [
        spawn(subprocess_env, "ids", shared_metadata_uri, "100", str(batch))
        for batch in (1, 3, 7, 16)
    ]
    outputs = await asyncio.to_thread(finish, workers, 120)
    ids = [int(v) for out in outputs for v in out.split()]
    async with await metadata.connect(shared_metadata_uri) as store:
        ids += [await LedgerIdGenerator(store).next_id() for _ in range(10)]
    assert len(ids) == 410
    assert len(set(ids)) == len(ids)
    assert min(ids) >= 1


async def test_ephemeral_node_of_a_killed_process_goes_away(shared_metadata_uri, subprocess_env):
    # The observer's own session timeout also sets how often a sqlite store reaps.
    async with await metadata.connect(shared_metadata_uri, session_timeout_s=2.0) as observer:
        owner = spawn(subprocess_env, "ephemeral", shared_metadata_uri, "/reg/bookie-1", "1.5")
        try:
            assert owner.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(owner.stdout.readline), 60)
            assert line.strip() == "ready", owner.stderr.read() if owner.stderr else ""
            assert await observer.get("/reg/bookie-1") == metadata.Versioned(b"mine", 0)
            async with observer.watch("/reg/bookie-1") as watch:
                killed_at = time.monotonic()
                os.kill(owner.pid, signal.SIGKILL)
                async with asyncio.timeout(30):
                    async for event in watch:
                        if event.kind == "deleted":
                            break
                gone_after_s = time.monotonic() - killed_at
        finally:
            owner.kill()
            owner.wait()
        assert await observer.exists("/reg/bookie-1") is None
        # Not before the owner's session timeout (1.5 s) has passed.
        assert gone_after_s >= 1.0


async def test_watch_sees_another_process_write_promptly(shared_metadata_uri, subprocess_env):
    async with await metadata.connect(shared_metadata_uri) as store:
        await store.create("/counter", (0).to_bytes(8, "big"))
        async with store.watch("/counter") as watch:
            writer = spawn(subprocess_env, "cas", shared_metadata_uri, "/counter", "1")
            try:
                event = await watch.next(30)
            finally:
                await asyncio.to_thread(finish, [writer], 60)
        assert event == metadata.WatchEvent("changed", "/counter")
