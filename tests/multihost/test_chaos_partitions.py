"""`streamlib chaos --partitions` end to end, in both modes: ZooKeeper, each bookie,
each broker and the clients on hosts of their own, partitions planned from the seed
beside the mode's faults; nothing acknowledged is lost, duplicated or reordered, every
stream is live after the heal, and the run leaves no namespace, no /etc/netns entry
and no process behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.test_chaos import processes_mentioning
from tests.multihost.hosts import NETNS_ETC, netns_names

TIMEOUT_S = 180.0  # a bound on a hung run; a healthy one takes 25-40 s


def chaos_with_partitions(*args: str) -> tuple[int, dict[str, Any]]:
    """A run of `streamlib chaos --partitions ARGS --json`; its exit code and verdict,
    once every namespace it made is gone."""
    before = set(netns_names())
    result = subprocess.run(
        [sys.executable, "-m", "streamlib.cli", "chaos", "--partitions", "--json", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.stdout, f"no verdict (exit {result.returncode}):\n{result.stderr[-4000:]}"
    left = set(netns_names()) - before
    assert left == set(), f"the run left namespaces {left}"
    assert not [n for n in left if (NETNS_ETC / n).exists()]
    return result.returncode, json.loads(result.stdout)


def test_direct_mode_loses_nothing_through_partitions(tmp_path: Path) -> None:
    """Seed 33 cuts a majority of the five bookies off (writes stall until the heal),
    then one bookie host, beside bookie outages, producer kills and duels."""
    code, verdict = chaos_with_partitions(
        "--seconds", "12", "--seed", "33", "--bookies", "5", "--recover-timeout", "20",
        "--drain-timeout", "20", "--data-dir", str(tmp_path / "run"),
    )  # fmt: skip
    detail = json.dumps({k: x for k, x in verdict.items() if k != "faults"}, indent=1)[:4000]
    assert verdict["partition_faults"] == {"partition-majority": 1, "partition-host": 1}, detail
    assert verdict["acknowledged"] > 0, detail
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0, detail
    assert verdict["reordered"] == 0 and verdict["misplaced"] == 0, detail
    assert verdict["never_recovered"] == [] and verdict["drained"] is True, detail
    assert verdict["replay"].endswith("--seed 33 --bookies 5 --partitions")
    assert verdict["ok"] is True and code == 0, detail
    assert processes_mentioning(str(tmp_path)) == []


def test_broker_mode_loses_and_duplicates_nothing_through_partitions(tmp_path: Path) -> None:
    """Seed 12 pulls a broker host's cable (its streams move by fencing) and cuts a
    majority of the bookies off, beside broker kills and stops."""
    code, verdict = chaos_with_partitions(
        "--brokers", "2", "--bookies", "4", "--seconds", "12", "--seed", "12",
        "--drain-timeout", "30", "--data-dir", str(tmp_path / "run"),
    )  # fmt: skip
    detail = json.dumps(verdict, indent=1)[:4000]
    assert verdict["partition_faults"] == {"partition-host": 1, "partition-majority": 1}, detail
    assert verdict["acknowledged"] > 0, detail
    assert verdict["lost"] == [] and verdict["duplicated"] == [], detail
    assert verdict["disordered_producers"] == [] and verdict["not_received"] == [], detail
    assert verdict["replay"] == (
        "streamlib chaos --brokers 2 --bookies 4 --seconds 12 --seed 12 --partitions"
    )
    assert verdict["ok"] is True and code == 0, detail
    assert processes_mentioning(str(tmp_path)) == []


def test_a_machine_that_cannot_make_namespaces_is_refused(tmp_path: Path) -> None:
    """Without root (here: a user namespace of its own, where the run is not root) the
    run stops before starting anything, exit 3, saying why."""
    result = subprocess.run(
        ["unshare", "--user", sys.executable, "-m", "streamlib.cli", "chaos", "--partitions",
         "--seconds", "1", "--data-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "--partitions needs network namespaces: making network namespaces needs root" in (
        result.stderr
    )
