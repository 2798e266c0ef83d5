"""The CAS benchmark runs and reports (its figures are not asserted: §8)."""

from __future__ import annotations

from metadata.bench import cas_benchmark_async


async def test_cas_benchmark_reports_throughput_and_latency():
    result = await cas_benchmark_async("memory://", 0.2)
    assert result["cas_ops"] > 0
    assert set(result) >= {"cas_ops_per_s", "p50_ms", "p99_ms", "seconds"}
