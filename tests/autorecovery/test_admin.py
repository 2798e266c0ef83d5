"""The admin commands, run as the real command line against real bookies."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

from metadata.services.cookies import CookieStore
from streamlib.client import Client
from tests.autorecovery.conftest import (
    RecoveryCluster,
    assert_fully_replicated,
    equals,
    is_empty,
    make_read_only,
    wait_for,
)
from tests.autorecovery.test_autorecovery import write_ledger
from tests.integration.conftest import BOOKIE_FLAGS


async def cli(cluster: RecoveryCluster, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streamlib.autorecovery.cli",
        *args,
        "--metadata",
        cluster.metadata_uri,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_decommission_re_replicates_everything_and_waits(rcluster: RecoveryCluster) -> None:
    rcluster.start_bookies(3)  # every ledger on all three; the fourth is the replacement
    client = await rcluster.client()
    written = [
        await write_ledger(client, 30, qw=2),
        await write_ledger(client, 15, qw=3),
        await write_ledger(client, 20, qw=2, close=False),
    ]
    rcluster.start_bookies(1)
    target = rcluster.bookies[0].bookie_id

    rc, _, err = await cli(rcluster, "admin", "decommission", target)
    assert rc == 1 and "BookieStillWritableError" in err and err.count("\n") == 1, err

    make_read_only(rcluster.by_id(target))
    rc, out, err = await cli(
        rcluster, "admin", "decommission", target, "--grace-period", "1", "--timeout", "60"
    )
    assert rc == 0, err
    assert f"{target}: 3 ledgers re-replicated; no ledger references it" in out
    assert f"{target}: cookie deleted" in out
    assert await CookieStore(client.store).read(target) is None
    assert await rcluster.ledgers_naming(target) == []
    assert await rcluster.marks() == []
    for ledger_id, expected in written:
        await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)


async def test_a_wiped_bookie_rejoins_by_following_its_refusal_word_for_word(
    rcluster: RecoveryCluster,
) -> None:
    rcluster.start_bookies(3)
    client = await rcluster.client()
    ledger_id, expected = await write_ledger(client, 20, qw=3)  # on every bookie
    rcluster.start_bookies(1)  # the replacement
    wiped = rcluster.bookies[0]
    before = json.loads((wiped.data_dir / "cookie").read_bytes())
    assert wiped.stop() == 0
    shutil.rmtree(wiped.data_dir)  # the disks were replaced

    rc, stderr = wiped.run_to_exit()
    assert rc != 0 and "CookieError" in stderr, stderr
    (command,) = [c for c in re.findall(r"`([^`]+)`", stderr) if "decommission" in c]
    argv = shlex.split(command)
    assert argv[0] == "streamlib", command
    # The console script the operator has on PATH, installed beside this interpreter.
    script = Path(sys.executable).parent / "streamlib"
    proc = await asyncio.create_subprocess_exec(
        str(script),
        *argv[1:],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, (command, out.decode(), err.decode())
    assert await rcluster.ledgers_naming(before["bookie_id"]) == []
    await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)

    wiped.start()
    after = json.loads((wiped.data_dir / "cookie").read_bytes())
    assert wiped.bookie_id == after["bookie_id"] == before["bookie_id"]
    assert after["instance_id"] != before["instance_id"]  # a new bookie under the same id


async def test_unknown_bookie_is_a_clear_error(rcluster: RecoveryCluster) -> None:
    rcluster.start_bookies(1)
    rc, _, err = await cli(rcluster, "admin", "recover", "no-such-bookie:1")
    assert rc == 1 and "UnknownBookieError" in err and err.count("\n") == 1, err


async def test_status_switches_and_audit_now(rcluster: RecoveryCluster) -> None:
    rcluster.start_bookies(4)
    client = await rcluster.client()
    ledger_id, expected = await write_ledger(client, 12, qw=3)
    victim = sorted((await client.ledgers.metadata(ledger_id)).bookies())[0]

    assert (await cli(rcluster, "admin", "autorecovery", "disable"))[0] == 0
    rc, out, _ = await cli(rcluster, "admin", "autorecovery", "status", "--json")
    assert rc == 0
    assert json.loads(out) == {"enabled": False, "auditor": None, "under_replicated": []}

    rcluster.by_id(victim).kill()
    await wait_for(lambda: _gone(client, victim), "the dead bookie's registration to expire")
    rc, out, _ = await cli(rcluster, "admin", "autorecovery", "audit-now")
    assert rc == 0 and "marked 1 ledgers" in out and victim in out, out
    rc, out, _ = await cli(rcluster, "admin", "autorecovery", "status", "--json")
    (mark,) = json.loads(out)["under_replicated"]
    assert mark["ledger_id"] == ledger_id and mark["missing_bookies"] == [victim]

    assert (await cli(rcluster, "admin", "autorecovery", "enable"))[0] == 0
    daemon = rcluster.start_daemon("node", "--lost-bookie-delay", "60", "--check-interval", "0")
    await wait_for(lambda: is_empty(rcluster.marks()), "the daemon to repair the ledger")
    await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)
    rc, out, _ = await cli(rcluster, "admin", "autorecovery", "status")
    assert "auto-recovery: enabled" in out and "auditor: node" in out, out
    assert daemon.stop() == 0  # SIGTERM: a clean exit that gives up the leadership
    assert await rcluster.auditor() is None


async def test_bookie_serve_autorecovery_runs_a_node_that_dies_with_it(
    rcluster: RecoveryCluster,
) -> None:
    rcluster.start_bookies(1)
    rcluster.bookies[0].extra = [
        *BOOKIE_FLAGS,
        "--autorecovery",
        "--autorecovery-option=--session-timeout=2",
    ]
    bookie = rcluster.bookies[0]
    bookie.stop()
    bookie.start()
    await wait_for(lambda: equals(rcluster.auditor(), bookie.bookie_id), "the bookie's node")
    bookie.kill()  # SIGKILL: the node sees its stdin close and stops too
    await wait_for(lambda: equals(rcluster.auditor(), None), "the node to go", 30)


async def _gone(client: Client, bookie_id: str) -> bool:
    return await client.registry.get(bookie_id) is None
