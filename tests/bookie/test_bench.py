"""The benchmark runs end to end (its figures are reported, not asserted)."""

from __future__ import annotations

from pathlib import Path

from bookie.bench import run_bookie_bench


def test_bookie_bench_acknowledges_every_entry(tmp_path: Path) -> None:
    result = run_bookie_bench(entries=2000, in_flight=400, batch=50, workdir=tmp_path)
    assert result.errors == 0 and result.entries == 2000
    assert result.entries_per_fsync >= 1 and result.p99_ms >= result.p50_ms
    assert "entries/s" in result.render()
