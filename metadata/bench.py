"""How fast the store does compare-and-swap: one process, one node, read + CAS in a loop.

`streamlib bench metadata` prints this; tests do not assert on it (ARCHITECTURE.md §8).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid

from metadata.store import MetadataStore
from metadata.uri import connect


async def cas_benchmark_async(uri: str, seconds: float) -> dict[str, float | int | str]:
    """Read-then-CAS increments of one counter node for `seconds`; ops/s and latency."""
    store: MetadataStore = await connect(uri)
    path = f"/bench-{uuid.uuid4().hex[:12]}"
    latencies: list[float] = []
    try:
        await store.create(path, (0).to_bytes(8, "big"))
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            current = await store.get(path)
            value = int.from_bytes(current.data, "big") + 1
            await store.set(path, value.to_bytes(8, "big"), version=current.version)
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        final = int.from_bytes((await store.get(path)).data, "big")
        await store.delete(path)
    finally:
        await store.close()
    latencies.sort()
    quantile = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {
        "uri": uri,
        "seconds": round(elapsed, 3),
        "cas_ops": final,
        "cas_ops_per_s": round(final / elapsed, 1),
        "p50_ms": round(quantile[49] * 1000, 3),
        "p99_ms": round(quantile[98] * 1000, 3),
    }


def cas_benchmark(uri: str, seconds: float) -> dict[str, float | int | str]:
    """Synchronous wrapper (runs its own event loop) for the CLI."""
    return asyncio.run(cas_benchmark_async(uri, seconds))
