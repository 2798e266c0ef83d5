"""The partitions of `streamlib chaos --partitions`, planned from the seed alone: the
same seed gives the same partitions; a seed's plan without --partitions is what it was
before partitions existed (they draw from a sequence of their own); bookies cut off
stay within max_down but for the majority fault; every partition heals in time."""

from __future__ import annotations

import itertools

from streamlib.chaos.partition_plan import (
    HEAL,
    KINDS,
    bookie_host,
    cut_bookies,
    plan_partitions,
    with_heals,
)
from streamlib.chaos.plan import (
    RESTART_SLACK_S,
    Fault,
    max_down,
    plan_faults,
    plan_service_faults,
)

STREAMS = ["chaos-managed", "chaos-unbounded"]


def test_a_seed_keeps_its_plan_without_partitions():
    """Written down before --partitions existed: the mode's own plans do not move."""
    assert plan_faults(5, 8, 5, STREAMS) == [
        Fault(1.623, "duel", "chaos-managed", 4.361, "older"),
        Fault(3.096, "kill-consumer", "chaos-managed"),
        Fault(4.899, "pause-bookie", "0", 3.296),
        Fault(6.496, "pause-bookie", "4", 4.665),
        Fault(7.235, "duel", "chaos-managed", 3.472, "newer"),
    ]
    assert plan_service_faults(36, 8, 2, ["P0", "P1"], ["C0", "C1"]) == [
        Fault(1.657, "kill-broker", "1", 1.813),
        Fault(5.471, "pause-broker", "1", 4.539),
    ]


def test_the_same_seed_plans_the_same_partitions():
    faults = plan_faults(33, 12, 5, STREAMS)
    first = plan_partitions(33, 12, 5, 0, faults)
    assert first == plan_partitions(33, 12, 5, 0, plan_faults(33, 12, 5, STREAMS))
    assert [f.kind for f in first] == ["partition-majority", "partition-host"]
    assert first != plan_partitions(34, 12, 5, 0, faults)


def test_broker_kinds_only_in_broker_mode_and_every_kind_is_planned_somewhere():
    seen: set[str] = set()
    for seed in range(60):
        direct = plan_partitions(seed, 20, 5, 0, plan_faults(seed, 20, 5, STREAMS))
        assert {f.kind for f in direct} <= {"partition-host", "partition-majority", "asymmetric"}
        assert not any(f.target.startswith("k") or "k" in f.target for f in direct)
        service = plan_service_faults(seed, 20, 2, ["P0", "P1"], ["C0", "C1"])
        seen |= {f.kind for f in plan_partitions(seed, 20, 4, 2, service)}
        seen |= {f.kind for f in direct}
    assert seen == set(KINDS)


def test_partitions_are_one_at_a_time_and_heal_within_the_run():
    for seed in range(60):
        planned = plan_partitions(seed, 15, 5, 0, plan_faults(seed, 15, 5, STREAMS))
        for before, after in itertools.pairwise(planned):
            assert before.at_s + before.duration_s < after.at_s
        assert all(f.at_s + f.duration_s <= 15 for f in planned)
        steps = with_heals(planned)
        assert [s.kind for s in steps if s.kind.startswith(HEAL)] == [
            HEAL + f.kind for f in planned
        ]


def test_bookies_cut_off_stay_within_max_down_beside_the_modes_outages():
    bookies = 5
    for seed in range(80):
        faults = plan_faults(seed, 20, bookies, STREAMS)
        outages = [
            (f.at_s, f.at_s + f.duration_s + RESTART_SLACK_S, bookie_host(int(f.target)))
            for f in faults
            if f.kind in ("kill-bookie", "pause-bookie")
        ]
        for p in plan_partitions(seed, 20, bookies, 0, faults):
            cut = cut_bookies(p)
            if p.kind == "partition-majority":
                assert len(cut) == bookies // 2 + 1
                continue
            if not cut:  # (a client host: no bookie out of anyone's reach)
                continue
            start, end = p.at_s, p.at_s + p.duration_s
            # every bookie out at some moment of the partition and its reconnection
            down = {b for (a, z, b) in outages if a < end + RESTART_SLACK_S and start < z}
            assert len(down | cut) <= max_down(bookies), (seed, p, down)
