"""The README's refusals at start ("Operating a bookie"), each followed word for word.

Each test makes a real `bookie serve` refuse as the README's row says, checks the
advice in the refusal, does exactly what it says (runs the quoted command with the
`streamlib` console script, empties the directory it names, restarts with the flag
it names) and checks that the bookie then starts and serves, and that no entry
acknowledged before was lost.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import metadata
from bookie.launcher import BookieProcess
from bookie.wire import bookie_pb2 as pb
from metadata.services.cluster import ClusterInstance
from metadata.services.cookies import CookieStore
from tests.autorecovery import conftest as recovery
from tests.autorecovery.conftest import RecoveryCluster, assert_fully_replicated
from tests.autorecovery.test_admin import cli
from tests.autorecovery.test_autorecovery import write_ledger
from tests.bookie.conftest import FAST, Cluster, entry, payload_of
from tests.bookie.test_operations import cluster_instance, create_ledgers, with_store
from tests.integration.conftest import BOOKIE_FLAGS

rcluster = recovery.rcluster  # real bookies and a client that can decommission them


def refusal_of(bookie: BookieProcess) -> str:
    """Start the bookie expecting a refusal: exit 1 with the message on stderr."""
    rc, stderr = bookie.run_to_exit()
    assert rc == 1 and "CookieError" in stderr, (rc, stderr)
    return stderr


async def run_the_quoted_command(refusal: str) -> tuple[int, str]:
    """Run the one `command` the refusal quotes, as an operator pasting it would."""
    (command,) = re.findall(r"`([^`]+)`", refusal)
    argv = shlex.split(command)
    assert argv[0] == "streamlib", command
    # The console script the operator has on PATH, installed beside this interpreter.
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "streamlib"),
        *argv[1:],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def decommission_command(bookie_id: str, metadata_uri: str) -> str:
    return f"streamlib admin decommission {bookie_id} --metadata {shlex.quote(metadata_uri)}"


def cookie_on_disk(bookie: BookieProcess) -> dict[str, object]:
    found: dict[str, object] = json.loads((bookie.data_dir / "cookie").read_bytes())
    return found


def start_bookie(cluster: RecoveryCluster, directory: str, *flags: str) -> BookieProcess:
    """One more bookie of the cluster in ROOT/directory with extra `bookie serve` flags."""
    bookie = BookieProcess(
        cluster.root / directory,
        metadata_uri=cluster.metadata_uri,
        extra=[*BOOKIE_FLAGS, *flags],
    )
    cluster.bookies.append(bookie)  # stopped with the cluster
    return bookie.start()


async def assert_takes_writes(cluster: RecoveryCluster, bookie: BookieProcess) -> None:
    """A ledger on every running bookie, each of which must acknowledge every entry."""
    client = await cluster.client()  # a new client: it sees the bookie's registration
    running = sum(1 for b in cluster.bookies if b.proc is not None)
    writer = await client.ledgers.create(running, running, running)
    datas = [b"after the restart %d" % i for i in range(5)]
    await writer.append_many(datas)
    closed = await writer.close()
    assert bookie.bookie_id in closed.bookies(), closed
    reader = await client.ledgers.open(writer.ledger_id)
    assert await reader.read(0, 4) == datas


def test_a_bookie_started_with_another_id_starts_under_the_id_its_directories_name(
    cluster: Cluster,
) -> None:
    alpha = cluster.bookie("b0", ["--bookie-id", "alpha"])
    create_ledgers(cluster.metadata_uri, [1])
    client = cluster.client(alpha)
    assert all(r.status == pb.OK for r in client.add(entry(1, i) for i in range(5)).values())
    assert alpha.stop() == 0

    alpha.extra = [*FAST, "--bookie-id", "beta"]  # a mistyped id
    refusal = refusal_of(alpha)
    assert (
        "the directories belong to bookie alpha, not beta; start it with --bookie-id alpha "
        "or give it fresh directories" in refusal
    ), refusal

    # "start it with --bookie-id A": it is alpha again, with what it acknowledged.
    alpha.extra = [*FAST, "--bookie-id", "alpha"]
    alpha.start()
    assert alpha.bookie_id == "alpha"
    client = cluster.client(alpha)
    read = client.read(1, 0, 4)
    assert [r.status for r in read.results] == [pb.OK] * 5
    assert [r.entry.payload for r in read.results] == [payload_of(1, i) for i in range(5)]
    assert client.add_one(entry(1, 5)).status == pb.OK

    # "... or give it fresh directories": beta is then a bookie of its own.
    beta = cluster.bookie("fresh", ["--bookie-id", "beta"])
    assert beta.bookie_id == "beta"
    assert cluster.client(beta).add_one(entry(2, 0)).status == pb.OK


def forget_cluster_ids(bookie: BookieProcess, metadata_uri: str) -> None:
    """Make the bookie and its store what they were before cluster instance ids: cookies
    without one, on the disks and in the store, and no id in the store."""
    for path in bookie.data_dir.rglob("cookie"):  # the data and the journal directory
        cookie = json.loads(path.read_bytes())
        del cookie["cluster_instance_id"]
        path.write_text(json.dumps(cookie))

    async def forget(store: metadata.MetadataStore) -> None:
        cookies = CookieStore(store)
        found = await cookies.read(bookie.bookie_id)
        assert found is not None
        stored, version = found
        stored.ClearField("cluster_instance_id")
        await cookies.write(stored, version)
        await store.delete(ClusterInstance(store).path("instance"))

    with_store(metadata_uri, forget)


def test_a_bookie_formatted_before_cluster_ids_starts_with_the_store_it_was_formatted_against(
    cluster: Cluster,
) -> None:
    bookie = cluster.bookie()
    create_ledgers(cluster.metadata_uri, [1])
    client = cluster.client(bookie)
    assert all(r.status == pb.OK for r in client.add(entry(1, i) for i in range(5)).values())
    assert bookie.stop() == 0
    forget_cluster_ids(bookie, cluster.metadata_uri)
    empty = cluster.other_store("empty")  # a mistyped URI after the upgrade

    bookie.metadata_uri = empty
    refusal = refusal_of(bookie)
    assert (
        f"its cookie predates cluster instance ids and the metadata store {empty} (no cluster "
        f"instance id) has no cookie for this bookie" in refusal
    ), refusal
    assert "Start it with the metadata store it was formatted against." in refusal

    # "start it with the store it was formatted against (it adopts that store's id)"
    bookie.metadata_uri = cluster.metadata_uri
    bookie.start()
    adopted = cluster_instance(cluster.metadata_uri)
    assert adopted is not None
    assert cookie_on_disk(bookie)["cluster_instance_id"] == adopted
    found = with_store(cluster.metadata_uri, lambda s: CookieStore(s).read(bookie.bookie_id))
    assert found is not None and found[0].cluster_instance_id == adopted
    client = cluster.client(bookie)
    assert bookie.admin("POST", "/admin/gc")["deleted"] == []
    read = client.read(1, 0, 4)
    assert [r.entry.payload for r in read.results] == [payload_of(1, i) for i in range(5)]
    assert client.add_one(entry(1, 5)).status == pb.OK
    assert cluster_instance(empty) is None  # the refusal left the wrong store alone


async def test_a_bookie_with_one_wiped_directory_rejoins_by_following_its_refusal(
    rcluster: RecoveryCluster,
) -> None:
    rcluster.start_bookies(2)
    journal = rcluster.root / "split-journal"
    split = start_bookie(rcluster, "split-data", "--journal-dir", str(journal))
    client = await rcluster.client()
    ledger_id, expected = await write_ledger(client, 20, qw=3)  # on every bookie
    rcluster.start_bookies(1)  # the replacement
    before = cookie_on_disk(split)
    assert split.stop() == 0
    shutil.rmtree(journal)  # the journal disk was replaced

    refusal = refusal_of(split)
    assert (
        f"{journal} has no cookie while {split.data_dir} has one: a directory was wiped or "
        f"swapped" in refusal
    ), refusal
    command = decommission_command(split.bookie_id, rcluster.metadata_uri)
    assert (
        f"Decommission it (`{command}`, which re-replicates its ledgers and then deletes its "
        f"cookie), empty {split.data_dir}, then start it again to re-add it as a new bookie."
        in refusal
    ), refusal

    rc, out = await run_the_quoted_command(refusal)
    assert rc == 0, out
    assert await rcluster.ledgers_naming(split.bookie_id) == []
    await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)
    for child in split.data_dir.iterdir():  # "empty DIR"
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
    split.start()

    after = cookie_on_disk(split)
    assert split.bookie_id == after["bookie_id"] == before["bookie_id"]
    assert after["instance_id"] != before["instance_id"]  # a new bookie under the same id
    await assert_takes_writes(rcluster, split)


async def retire_and_reuse_the_id(
    cluster: RecoveryCluster, bookie_id: str
) -> tuple[BookieProcess, BookieProcess]:
    """A host runs as bookie_id, goes down and is decommissioned; a new host takes the
    id. (the old host, stopped with its disks as they were; the new host, serving)"""
    old_host = start_bookie(cluster, "old-host", "--bookie-id", bookie_id)
    assert old_host.stop() == 0
    rc, _, err = await cli(cluster, "admin", "decommission", bookie_id)
    assert rc == 0, err
    return old_host, start_bookie(cluster, "new-host", "--bookie-id", bookie_id)


async def test_a_bookie_whose_id_another_bookie_took_rejoins_once_the_id_is_decommissioned(
    rcluster: RecoveryCluster,
) -> None:
    rcluster.start_bookies(3)
    old_host, new_host = await retire_and_reuse_the_id(rcluster, "bookie-x")
    client = await rcluster.client()
    ledger_id, expected = await write_ledger(client, 20, e=4, qw=3)  # some on bookie-x
    assert await rcluster.ledgers_naming("bookie-x") == [ledger_id]
    rcluster.start_bookies(1)  # the replacement
    assert new_host.stop() == 0  # the new host goes down; the old one comes back instead

    refusal = refusal_of(old_host)
    instance = cookie_on_disk(old_host)["instance_id"]
    taken = cookie_on_disk(new_host)["instance_id"]
    command = decommission_command("bookie-x", rcluster.metadata_uri)
    assert (
        f"the cookie on disk (instance {instance}) does not match the metadata store's "
        f"(instance {taken}): another bookie uses this id or the directories moved. "
        f"Decommission the id (`{command}`) before re-adding it." in refusal
    ), refusal

    rc, out = await run_the_quoted_command(refusal)
    assert rc == 0, out
    assert await rcluster.ledgers_naming("bookie-x") == []
    await assert_fully_replicated(client, await client.ledgers.metadata(ledger_id), expected)

    old_host.start()  # re-added
    assert old_host.bookie_id == "bookie-x"
    assert cookie_on_disk(old_host)["instance_id"] == instance
    await assert_takes_writes(rcluster, old_host)


async def test_a_refused_start_leaves_the_live_bookie_of_that_id_registered(
    rcluster: RecoveryCluster,
) -> None:
    """While another bookie serves under the id, the refused one must not unregister it:
    the quoted command would then decommission a live, writable bookie."""
    rcluster.start_bookies(3)
    old_host, _ = await retire_and_reuse_the_id(rcluster, "bookie-x")
    client = await rcluster.client()
    assert await client.registry.get("bookie-x") is not None

    refusal = refusal_of(old_host)
    assert "another bookie uses this id" in refusal, refusal
    assert await client.registry.get("bookie-x") is not None, "the refused start unregistered it"
    rc, out = await run_the_quoted_command(refusal)
    assert rc == 1 and "stop it or make it read-only first" in out, out
