"""`streamlib chaos` end to end: 20 seconds of seeded faults on five real bookies (kills,
stops, producer kills and duels, consumer kills), then the verdict: nothing
acknowledged lost, duplicated or reordered, every producer back after the heal. The
same with the bookies' disks failing (--disk-faults), in direct and in broker mode,
with the processes' resources sampled every 2 s. And a run leaves nothing behind: no
process, no temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Faults for 20 s, then at most 15 s to recover and 15 s to drain; starting and
# stopping the cluster and the workers takes a few seconds more.
CHAOS = ["--seconds", "20", "--seed", "1", "--json", "--recover-timeout", "15",
         "--drain-timeout", "15"]  # fmt: skip
TIMEOUT_S = 240.0  # a bound on a hung run; a healthy one takes about 30 s


def chaos(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "streamlib.cli", "chaos", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env=env,
    )
    assert result.stdout, f"no verdict (exit {result.returncode}):\n{result.stderr[-4000:]}"
    return result.returncode, json.loads(result.stdout)


def processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if text in argv:
            found.append(argv)
    return found


def test_twenty_seconds_of_faults_lose_nothing_acknowledged(tmp_path):
    # The workers' logs stay in tmp_path for a post-mortem.
    code, verdict = chaos(*CHAOS, "--data-dir", str(tmp_path / "run"))
    detail = json.dumps({k: x for k, x in verdict.items() if k != "faults"}, indent=1)[:8000]
    assert verdict["seed"] == 1
    assert verdict["replay"].startswith("streamlib chaos --seconds 20 --seed 1")
    assert {f["what"] for f in verdict["faults"]} >= {"kill-bookie", "duel", "kill-consumer"}
    assert verdict["acknowledged"] > 0, detail
    assert verdict["lost"] == 0, detail
    assert verdict["duplicated"] == 0, detail
    assert verdict["reordered"] == 0, detail
    assert verdict["misplaced"] == 0, detail
    assert verdict["never_recovered"] == [], detail
    assert verdict["crashes"] == [], detail
    assert verdict["ok"] is True
    assert code == 0, detail
    assert processes_mentioning(str(tmp_path)) == []


def test_broker_mode_loses_and_duplicates_nothing_through_broker_kills_and_stops(tmp_path):
    """Seed 36 plans all four kinds of fault in 15 s: a broker SIGKILLed and one
    SIGSTOPped past its session, a producer and a consumer SIGKILLed. Without --data-dir
    the run works in a temporary directory (under TMPDIR): it must leave none behind,
    and no process."""
    code, verdict = chaos("--brokers", "2", "--bookies", "3", "--seconds", "15", "--seed", "36",
                          "--json", "--drain-timeout", "30",
                          env=dict(os.environ, TMPDIR=str(tmp_path)))  # fmt: skip
    detail = json.dumps(verdict, indent=1)[:4000]
    assert set(verdict["faults"]) == {
        "broker-kill",
        "broker-stop",
        "producer-kill",
        "consumer-kill",
    }
    assert verdict["acknowledged"] > 0, detail
    assert verdict["lost"] == [] and verdict["duplicated"] == [], detail
    assert verdict["disordered_producers"] == [] and verdict["not_received"] == [], detail
    assert verdict["replay"] == "streamlib chaos --brokers 2 --bookies 3 --seconds 15 --seed 36"
    assert verdict["ok"] is True and code == 0, detail
    assert list(tmp_path.iterdir()) == []
    assert processes_mentioning(str(tmp_path)) == []


DISK_KINDS = {"eio-write", "eio-sync", "enospc", "slow-sync"}


def assert_disks_failed_and_healed(run: Path, verdict: dict[str, Any]) -> None:
    """Every kind of disk fault was injected, the bookies saw failures (their logs say
    so) and the heal left no failpoint armed. (Not every armed kind need fire: a bookie
    that a fault just before turned read-only writes nothing while the next is armed.)"""
    assert set(verdict["disk_faults"]) == DISK_KINDS, verdict["disk_faults"]
    logs = "".join(p.read_text() for p in (run / "cluster").glob("bookie-*.stderr.log"))
    fired = [e for e in ("Input/output error (failpoint", "No space left on device (failpoint")
             if e in logs]  # fmt: skip
    assert fired, logs[-2000:]
    assert [p for d in (run / "failpoints").iterdir() for p in d.iterdir()] == []


def assert_resources_sampled(run: Path, verdict: dict[str, Any], workers: set[str]) -> None:
    """Every bookie's and worker's RSS and descriptors were sampled, into the report and
    into logs/resources.jsonl."""
    series = verdict["resources"]["series"]
    sampled = {name.partition("#")[0] for name in series}
    assert {"chaos", "bookie-0", "bookie-1", "bookie-2"} | workers <= sampled, sorted(sampled)
    assert verdict["resources"]["judged"] > 0 and verdict["resources_flat"] is True
    assert all(s["max_rss_mib"] > 0 and s["max_fds"] > 0 for s in series.values())
    assert min(s["max_rss_mib"] for n, s in series.items() if n.startswith("bookie-")) > 10
    lines = (run / "logs" / "resources.jsonl").read_text().splitlines()
    assert len(lines) == sum(s["samples"] for s in series.values())


def test_failing_disks_lose_nothing_acknowledged_in_direct_mode(tmp_path):
    """Seed 133 plans every kind of disk fault in 15 s on five bookies, around its
    bookie kills and stops, duels and worker kills."""
    run = tmp_path / "run"
    code, verdict = chaos("--seconds", "15", "--seed", "133", "--disk-faults", "--json",
                          "--sample-interval", "2", "--recover-timeout", "15",
                          "--drain-timeout", "15", "--data-dir", str(run))  # fmt: skip
    detail = json.dumps({k: x for k, x in verdict.items() if k != "resources"}, indent=1)[:8000]
    assert verdict["replay"] == "streamlib chaos --seconds 15 --seed 133 --bookies 5 --disk-faults"
    assert_disks_failed_and_healed(run, verdict)
    assert verdict["acknowledged"] > 0, detail
    assert verdict["lost"] == 0 and verdict["lost_in_final_scan"] == 0, detail
    assert verdict["duplicated"] == 0 and verdict["reordered"] == 0, detail
    assert verdict["misplaced"] == 0 and verdict["never_recovered"] == [], detail
    assert verdict["ok"] is True and code == 0, detail
    streams = ("chaos-managed", "chaos-unbounded")
    workers = {f"{role} {s}" for role in ("producer", "consumer", "reader") for s in streams}
    assert_resources_sampled(run, verdict, workers)
    assert processes_mentioning(str(tmp_path)) == []


def test_failing_disks_lose_and_duplicate_nothing_in_broker_mode(tmp_path):
    """Seed 133 plans every kind of disk fault in 12 s on four bookies (one at a time:
    three must stay writable), besides a producer and a consumer SIGKILLed twice each."""
    run = tmp_path / "run"
    code, verdict = chaos("--brokers", "2", "--bookies", "4", "--seconds", "12", "--seed",
                          "133", "--disk-faults", "--sample-interval", "2", "--json",
                          "--drain-timeout", "30", "--data-dir", str(run))  # fmt: skip
    detail = json.dumps({k: x for k, x in verdict.items() if k != "resources"}, indent=1)[:4000]
    assert verdict["replay"] == (
        "streamlib chaos --brokers 2 --bookies 4 --seconds 12 --seed 133 --disk-faults"
    )
    assert_disks_failed_and_healed(run, verdict)
    assert verdict["acknowledged"] > 0, detail
    assert verdict["lost"] == [] and verdict["duplicated"] == [], detail
    assert verdict["disordered_producers"] == [] and verdict["not_received"] == [], detail
    assert verdict["ok"] is True and code == 0, detail
    workers = {"producer P0", "producer P1", "consumer C0", "consumer C1", "broker-0", "broker-1"}
    assert_resources_sampled(run, verdict, workers)
    assert processes_mentioning(str(tmp_path)) == []
