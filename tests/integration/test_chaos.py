"""`streamlib chaos` end to end: 20 seconds of seeded faults on five real bookies (kills,
stops, producer kills and duels, consumer kills), then the verdict: nothing
acknowledged lost, duplicated or reordered, every producer back after the heal. And a
run leaves nothing behind: no process, no temporary directory."""

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


def test_a_run_leaves_no_process_and_no_temporary_directory(tmp_path):
    code, verdict = chaos("--seconds", "2", "--seed", "7", "--json",
                          env=dict(os.environ, TMPDIR=str(tmp_path)))  # fmt: skip
    assert code == (0 if verdict["ok"] else 1)
    assert verdict["acknowledged"] > 0
    assert list(tmp_path.iterdir()) == []
    assert processes_mentioning(str(tmp_path)) == []


def test_broker_mode_loses_and_duplicates_nothing_through_broker_kills_and_stops(tmp_path):
    """Seed 36 plans all four kinds of fault in 15 s: a broker SIGKILLed and one
    SIGSTOPped past its session, a producer and a consumer SIGKILLed."""
    code, verdict = chaos("--brokers", "2", "--bookies", "3", "--seconds", "15", "--seed", "36",
                          "--json", "--drain-timeout", "30", "--data-dir", str(tmp_path / "run"))  # fmt: skip
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
    assert processes_mentioning(str(tmp_path)) == []
