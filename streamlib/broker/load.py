"""A broker's load report: what it measures of its streams and its process, and turns
into the rates its registration carries every --load-report-interval seconds
(metadata/services/brokers.py BrokerInfo; streamlib/protocol/load.py weighs them).
Rates are over the last interval; the CPU is smoothed over several (CPU_HISTORY).

The counting is an integer add per entry published or handed to a consumer (Traffic,
kept by each OwnedStream and its dispatchers); the rates are differences of the counts
over the interval, and the CPU the process's user + system time over it (os.times).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from streamlib.protocol.load import BrokerLoad, StreamLoad

DEFAULT_REPORT_INTERVAL_S = 10.0  # Pulsar reports every loadBalancerReportUpdateMinIntervalMillis
MAX_REPORTED_STREAMS = 100  # the busiest streams named in the report (what may be shed)
# The CPU reported is smoothed over the intervals (a garbage collection, a snapshot, a
# neighbour on a shared host make one interval's noisy): this much of it is the last
# report's. (Pulsar smooths its brokers' usage so: loadBalancerHistoryResourcePercentage.)
CPU_HISTORY = 0.75


@dataclass
class Traffic:
    """A stream's counts since it came to this broker (never reset: rates are
    differences)."""

    msgs_in: int = 0
    bytes_in: int = 0
    msgs_out: int = 0
    bytes_out: int = 0


@dataclass(frozen=True)
class Report:
    msgs_in_rate: float = 0.0
    msgs_out_rate: float = 0.0
    bytes_in_rate: float = 0.0
    bytes_out_rate: float = 0.0
    cpu_percent: float = 0.0
    reported: float = 0.0  # wall-clock time (0: none yet)
    stream_rates: tuple[tuple[str, float, float], ...] = ()


class LoadMeter:
    """Rates of the streams a broker owns and its CPU, from one report to the next."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Traffic, int, int, int, int]] = {}
        self._last_time = time.monotonic()
        self._last_cpu = _cpu_s()
        self.report = Report()

    def measure(self, owned: dict[str, Any]) -> Report:
        """The rates since the last call, over `owned` (stream -> OwnedStream)."""
        now, cpu = time.monotonic(), _cpu_s()
        elapsed = max(1e-3, now - self._last_time)
        totals = [0, 0, 0, 0]
        rates: list[tuple[str, float, float]] = []
        last: dict[str, tuple[Traffic, int, int, int, int]] = {}
        for stream, owner in owned.items():
            traffic: Traffic = owner.traffic
            counts = (traffic.msgs_in, traffic.bytes_in, traffic.msgs_out, traffic.bytes_out)
            before = self._last.get(stream)
            # (a stream new here, or owned again since: counted from its start)
            base = before[1:] if before is not None and before[0] is traffic else (0, 0, 0, 0)
            delta = [now_count - then for now_count, then in zip(counts, base, strict=True)]
            for i, value in enumerate(delta):
                totals[i] += value
            rates.append((stream, (delta[0] + delta[2]) / elapsed, (delta[1] + delta[3]) / elapsed))
            last[stream] = (traffic, *counts)
        rates.sort(key=lambda r: (-r[1], -r[2], r[0]))
        cpu_percent = 100.0 * max(0.0, cpu - self._last_cpu) / elapsed
        if self.report.reported:
            cpu_percent = CPU_HISTORY * self.report.cpu_percent + (1 - CPU_HISTORY) * cpu_percent
        self._last, self._last_time, self._last_cpu = last, now, cpu
        self.report = Report(
            round(totals[0] / elapsed, 3),
            round(totals[2] / elapsed, 3),
            round(totals[1] / elapsed, 3),
            round(totals[3] / elapsed, 3),
            round(cpu_percent, 2),
            time.time(),
            tuple((s, round(m, 3), round(b, 3)) for s, m, b in rates[:MAX_REPORTED_STREAMS]),
        )
        return self.report


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def broker_load(info: Any) -> BrokerLoad:
    """What streamlib.protocol.load weighs of a registration (a BrokerInfo)."""
    return BrokerLoad(
        info.broker_id,
        info.owned,
        info.msgs_in_rate + info.msgs_out_rate,
        info.bytes_in_rate + info.bytes_out_rate,
        info.cpu_percent,
        tuple(StreamLoad(s, m, b) for s, m, b in info.stream_rates),
    )
