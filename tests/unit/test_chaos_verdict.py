"""The verdict of `streamlib chaos` on hand-made histories: each violation it looks for
(lost, duplicated, reordered, misplaced) is shown to fire, and what at-least-once
allows (redeliveries to a later consumer session, unacknowledged sends that landed)
is shown not to, in both modes. Also the fault plans: seeded, never too many bookies
down (or with a failing disk), broker mode's one fault at a time, a seed's plan the same
as before disk faults came; and the judgement of the processes' resources."""

from __future__ import annotations

import itertools

import pytest

from streamlib.chaos.events import payload
from streamlib.chaos.plan import (
    DISK_KINDS,
    SESSION_S,
    Fault,
    last_end_s,
    max_down,
    plan_faults,
    plan_service_faults,
    timeline,
    with_disk_faults,
)
from streamlib.chaos.resources import Series
from streamlib.chaos.resources import judge as judge_resources
from streamlib.chaos.verdict import (
    Ack,
    Delivery,
    Failure,
    ProducerRun,
    StreamHistory,
    deliveries,
    judge,
    producer_run,
    unavailable_intervals,
)

HEALED_AT = 100.0


def acked(incarnation: int, seqs: range, ledger_id: int = 7, t0: float = 101.0) -> ProducerRun:
    """An incarnation whose sends seq were all acknowledged at (ledger_id, seq, 0)."""
    acks = [
        Ack(incarnation, seq, payload(f"p{incarnation}", seq), (ledger_id, seq, 0), t0 + seq / 100)
        for seq in seqs
    ]
    return ProducerRun(incarnation, started=t0 - 1, ended=t0 + len(seqs), acks=acks)


def read_as(run: ProducerRun, order: list[int] | None = None, session: str = "r") -> list[Delivery]:
    """The run's acknowledged messages delivered in that order of seq (default: as sent)."""
    by_seq = {a.seq: a for a in run.acks}
    seqs = order if order is not None else sorted(by_seq)
    return [Delivery(session, by_seq[s].message_id, by_seq[s].payload) for s in seqs]


def history(run: ProducerRun, reads: list[Delivery], receipts: list[Delivery] | None = None):
    return StreamHistory(
        producers=[run],
        reads=reads,
        receipts=read_as(run, session="c1") if receipts is None else receipts,
        final_producer=run.incarnation,
    )


def test_a_clean_history_passes():
    run = acked(1, range(1, 11))
    verdict = judge({"s": history(run, read_as(run))}, HEALED_AT)
    assert verdict.ok and verdict.safe
    assert verdict.to_json()["acknowledged"] == 10
    assert verdict.lost == verdict.duplicated == verdict.reordered == verdict.misplaced == 0


def test_an_acknowledged_message_the_reader_never_read_is_lost():
    run = acked(1, range(1, 11))
    verdict = judge({"s": history(run, read_as(run, [1, 2, 3, 5, 6, 7, 8, 9, 10]))}, HEALED_AT)
    assert not verdict.safe and not verdict.ok
    assert verdict.lost == 1
    assert verdict.streams["s"].lost_by_reader == ["p1-4"]
    assert verdict.streams["s"].lost_by_consumer == []


def test_an_acknowledged_message_no_consumer_session_received_is_lost():
    run = acked(1, range(1, 6))
    receipts = read_as(run, [1, 2], session="c1") + read_as(run, [2, 3, 5], session="c2")
    verdict = judge({"s": history(run, read_as(run), receipts)}, HEALED_AT)
    assert verdict.streams["s"].lost_by_consumer == ["p1-4"]
    assert verdict.lost == 1


def test_the_reader_reading_a_message_twice_is_a_duplicate():
    run = acked(1, range(1, 6))
    verdict = judge({"s": history(run, read_as(run, [1, 2, 3, 3, 4, 5]))}, HEALED_AT)
    assert verdict.duplicated == 1
    assert verdict.reordered == 0  # an equal id is a duplicate, not a reordering
    assert not verdict.safe


def test_the_same_payload_under_two_message_ids_is_a_duplicate():
    run = acked(1, range(1, 4))
    reads = [*read_as(run), Delivery("r", (8, 0, 0), "p1-3")]
    verdict = judge({"s": history(run, reads)}, HEALED_AT)
    assert verdict.duplicated == 1


def test_a_consumer_session_receiving_twice_is_a_duplicate_a_later_session_a_redelivery():
    run = acked(1, range(1, 5))
    twice_in_one = read_as(run, [1, 2, 2, 3, 4], session="c1")
    verdict = judge({"s": history(run, read_as(run), twice_in_one)}, HEALED_AT)
    assert verdict.duplicated == 1

    # The consumer crashed after receiving 1-3; the cursor had only 1: 2 and 3 again.
    restarted = read_as(run, [1, 2, 3], session="c1") + read_as(run, [2, 3, 4], session="c2")
    verdict = judge({"s": history(run, read_as(run), restarted)}, HEALED_AT)
    assert verdict.duplicated == 0 and verdict.reordered == 0
    assert verdict.streams["s"].redelivered == 2
    assert verdict.ok


def test_a_sequence_number_read_after_a_higher_one_is_reordered():
    # The ids still increase: only the producer's order betrays it.
    run = acked(1, range(1, 5))
    swapped = [
        Delivery("r", (7, i + 1, 0), payload("p1", seq)) for i, seq in enumerate([1, 3, 2, 4])
    ]
    verdict = judge({"s": history(run, swapped, swapped)}, HEALED_AT)
    assert verdict.reordered == 2  # once for the reader, once for the consumer session
    assert verdict.misplaced > 0  # and p1-2, p1-3 were acknowledged at other ids
    assert not verdict.safe


def test_a_message_id_below_one_read_before_is_reordered():
    run = acked(1, range(1, 5))
    verdict = judge({"s": history(run, read_as(run, [1, 2, 4, 3]))}, HEALED_AT)
    assert verdict.reordered == 1
    assert "id 7:3:0 after 7:4:0" in str(verdict.streams["s"].reordered[0])


def test_sequences_of_different_incarnations_interleave_freely():
    # A duel: incarnation 2 took over, then 1 (recreated) took it back. Each one's own
    # acknowledged messages keep their order; across incarnations anything goes.
    first, second = acked(1, range(1, 4), ledger_id=7), acked(2, range(1, 4), ledger_id=8)
    late = Ack(1, 10, payload("p1", 10), (9, 0, 0), 105.0)
    first.acks.append(late)
    reads = [*read_as(first)[:3], *read_as(second), Delivery("r", (9, 0, 0), late.payload)]
    h = StreamHistory([first, second], reads, reads, final_producer=1)
    assert judge({"s": h}, HEALED_AT).ok


def test_an_acknowledged_message_read_at_another_id_is_misplaced():
    run = acked(1, range(1, 4))
    reads = read_as(run)
    reads[1] = Delivery("r", (7, 2, 1), reads[1].payload)
    verdict = judge({"s": history(run, reads)}, HEALED_AT)
    assert verdict.misplaced == 1 and not verdict.safe


def test_unacknowledged_sends_that_landed_are_allowed():
    run = acked(1, range(1, 4))
    run.failures.append(Failure(sent=102.0, t=105.0, error="TimeoutError"))
    reads = [*read_as(run), Delivery("r", (7, 4, 0), payload("p1", 4))]
    verdict = judge({"s": history(run, reads, reads)}, HEALED_AT)
    assert verdict.ok
    assert verdict.streams["s"].unacknowledged_read == 1
    assert verdict.streams["s"].failed_sends == 1


def test_a_producer_with_nothing_acknowledged_after_the_heal_never_recovered():
    run = acked(1, range(1, 4), t0=90.0)  # every ack before the heal at 100
    verdict = judge({"s": history(run, read_as(run))}, HEALED_AT)
    assert verdict.safe and not verdict.ok
    assert verdict.never_recovered == ["s"]


def test_unavailability_runs_from_the_first_failure_to_the_next_ack():
    run = ProducerRun(1, started=0.0, ended=20.0)
    run.acks = [Ack(1, 1, "p1-1", (1, 0, 0), 1.0), Ack(1, 4, "p1-4", (2, 0, 0), 9.0)]
    run.failures = [
        Failure(sent=2.0, t=5.0, error="timeout"),
        Failure(sent=6.0, t=6.5, error="fenced", send=False),
        Failure(sent=10.0, t=12.0, error="fenced"),  # never followed by an ack
    ]
    assert unavailable_intervals(run) == [(0.0, 1.0), (2.0, 9.0), (10.0, 20.0)]
    verdict = judge({"s": StreamHistory([run], final_producer=1)}, HEALED_AT)
    assert verdict.streams["s"].longest_unavailable_s == 10.0
    assert verdict.streams["s"].longest_without_ack_s == 11.0  # from 9 to its failing end
    assert verdict.streams["s"].failed_sends == 2  # the takeover that failed is no send


def test_a_producer_stopping_cleanly_is_not_unavailable_while_it_closes():
    run = ProducerRun(1, started=0.0, ended=9.0)  # its close took from 5 s to 9 s
    run.acks = [Ack(1, s, f"p1-{s}", (1, s, 0), float(s)) for s in range(1, 6)]
    verdict = judge({"s": StreamHistory([run], final_producer=1)}, HEALED_AT)
    assert unavailable_intervals(run) == [(0.0, 1.0)]
    assert verdict.streams["s"].longest_without_ack_s == 1.0


def test_a_duel_loser_is_unavailable_while_the_stream_is_not():
    winner = ProducerRun(2, started=0.0, ended=10.0)
    winner.acks = [Ack(2, s, f"p2-{s}", (2, s, 0), float(s)) for s in range(1, 11)]
    loser = ProducerRun(1, started=0.0, ended=10.0, acks=[Ack(1, 1, "p1-1", (1, 0, 0), 0.5)])
    loser.failures = [Failure(sent=1.0, t=1.5, error="fenced")]
    verdict = judge({"s": StreamHistory([loser, winner], final_producer=2)}, HEALED_AT)
    stream = verdict.streams["s"]
    assert stream.longest_unavailable_s == 9.0 and stream.longest_unavailable_incarnation == 1
    assert stream.longest_without_ack_s == 1.0  # someone had an ack every second


def test_histories_come_from_the_workers_event_logs():
    events = [
        {"ev": "start", "t": 1.0},
        {"ev": "producer", "t": 1.5},
        {"ev": "ack", "t": 2.0, "seq": 1, "payload": "p3-1", "id": "5:0:0"},
        {"ev": "fail", "t": 3.0, "seq": 2, "sent": 2.5, "error": "StreamFencedError: x"},
        {"ev": "fail", "t": 3.5, "seq": -1, "sent": 3.2, "error": "StreamFencedError: y"},
        {"ev": "exit", "t": 4.0},
    ]
    run = producer_run(3, events)
    assert run.started == 1.0 and run.ended == 4.0
    assert run.acks == [Ack(3, 1, "p3-1", (5, 0, 0), 2.0)]
    assert [f.send for f in run.failures] == [True, False]
    received = [{"ev": "msg", "t": 2.0, "session": "1.2", "id": "5:0:0", "payload": "p3-1"}]
    assert deliveries(received, "x") == [Delivery("1.2", (5, 0, 0), "p3-1")]


@pytest.mark.parametrize("seed", range(20))
def test_the_fault_plan_is_seeded_and_keeps_enough_bookies_up(seed):
    streams = ["a", "b"]
    plan = plan_faults(seed, 60, 5, streams)
    assert plan == plan_faults(seed, 60, 5, streams)
    assert {f.kind for f in plan} <= {"kill-bookie", "pause-bookie", "kill-producer", "duel",
                                      "kill-consumer"}  # fmt: skip
    outages = [f for f in plan if f.kind in ("kill-bookie", "pause-bookie")]
    for f in outages:
        down = {g.target for g in outages if g.at_s <= f.at_s < g.at_s + g.duration_s}
        assert len(down) <= max_down(5) == 2
    duels = [f for f in plan if f.kind == "duel"]
    for f in duels:
        assert sum(g.target == f.target and g.at_s <= f.at_s < g.at_s + g.duration_s
                   for g in duels) == 1  # fmt: skip


def test_three_bookies_get_no_bookie_faults():
    plan = plan_faults(1, 60, 3, ["a"])
    assert plan and all(isinstance(f, Fault) for f in plan)
    assert not [f for f in plan if f.kind.endswith("-bookie")]


def test_an_unacknowledged_message_read_out_of_its_producers_order_is_reordered():
    # p1-3 failed (no ack) but landed, after p1-4: still out of the producer's order.
    run = acked(1, [1, 2, 4])
    reads = [*read_as(run, [1, 2, 4]), Delivery("r", (7, 5, 0), payload("p1", 3))]
    verdict = judge({"s": history(run, reads, read_as(run, session="c1"))}, HEALED_AT)
    assert verdict.reordered == 1
    assert "seq 3 after p1-4" in str(verdict.streams["s"].reordered[0])


def test_a_shared_subscription_may_deliver_twice_and_out_of_order_but_not_lose():
    # Broker mode's consumers: a message again in the same session, or out of order, is
    # at-least-once; one never received is still lost.
    run = acked(1, range(1, 6))
    receipts = read_as(run, [2, 1, 1, 3], session="c1") + read_as(run, [3], session="c2")
    h = StreamHistory([run], read_as(run), receipts, consumer_type="shared")
    stream = judge({"s": h}, None).streams["s"]
    assert stream.duplicated == [] and stream.reordered == []
    assert stream.redelivered == 2  # p1-1 again in c1, p1-3 again in c2
    assert stream.lost_by_consumer == [payload("p1", 4), payload("p1", 5)]


def test_without_a_reader_beside_the_faults_the_final_scan_is_the_reader():
    run = acked(1, range(1, 5))
    scan = read_as(run, [1, 2, 2, 4], session="scan")
    h = StreamHistory([run], receipts=read_as(run, session="c1"), scan=scan)
    stream = judge({"s": h}, None).streams["s"]
    assert stream.lost_by_reader == [payload("p1", 3)]
    assert len(stream.duplicated) == 1
    assert stream.recovered_after_heal is None  # (no heal to recover from)


def test_an_acknowledgement_without_a_position_is_not_misplaced():
    # A broker answers a resend it no longer places with EARLIEST: no place to check.
    stored = acked(1, range(1, 4))
    run = acked(1, range(1, 4))
    run.acks[1] = Ack(1, 2, payload("p1", 2), (-1, -1, -1), run.acks[1].t)
    h = history(run, read_as(stored), read_as(stored, session="c1"))
    verdict = judge({"s": h}, HEALED_AT)
    assert verdict.misplaced == 0 and verdict.safe


@pytest.mark.parametrize("seed", range(20))
def test_the_broker_mode_plan_is_seeded_and_one_fault_at_a_time(seed):
    def plan():
        return plan_service_faults(seed, 60, 2, ["P0", "P1"], ["C0", "C1"])

    faults = plan()
    assert faults == plan()
    assert {f.kind for f in faults} <= {"kill-broker", "pause-broker", "kill-producer",
                                        "kill-consumer"}  # fmt: skip
    for before, after in itertools.pairwise(faults):
        assert after.at_s >= before.at_s + before.duration_s + 1.0
    for f in faults:
        assert f.target in ({"0", "1"} if f.kind.endswith("broker") else {"P0", "P1", "C0", "C1"})
        if f.kind == "pause-broker":
            assert f.duration_s > SESSION_S  # past its metadata session: a failover
    steps = timeline(faults, last_end_s(faults))
    assert len(steps) == len(faults) + sum(f.kind.endswith("broker") for f in faults)


# Plans computed before disk faults existed: a seed keeps meaning these.
STREAMS = ["chaos-managed", "chaos-unbounded"]
SEED_1_DIRECT = [
    Fault(1.134, "duel", "chaos-managed", 2.02, "newer"),
    Fault(2.776, "pause-bookie", "0", 4.155),
    Fault(4.008, "duel", "chaos-unbounded", 2.731, "older"),
    Fault(5.551, "kill-bookie", "1", 3.365),
    Fault(7.917, "duel", "chaos-managed", 4.876, "older"),
    Fault(9.209, "duel", "chaos-unbounded", 3.211, "newer"),
    Fault(10.055, "kill-bookie", "0", 4.809),
    Fault(11.179, "kill-consumer", "chaos-managed"),
]
SEED_2_DIRECT = [
    Fault(1.956, "kill-consumer", "chaos-managed"),
    Fault(2.998, "kill-bookie", "1", 2.006),
    Fault(4.408, "kill-producer", "chaos-managed"),
    Fault(5.866, "duel", "chaos-unbounded", 3.177, "newer"),
    Fault(7.119, "kill-consumer", "chaos-managed"),
]
SEED_36_SERVICE = [
    Fault(1.657, "kill-broker", "1", 1.813),
    Fault(5.471, "pause-broker", "1", 4.539),
    Fault(12.314, "kill-producer", "P0"),
    Fault(15.467, "kill-consumer", "C0"),
]


def test_without_disk_faults_a_seed_keeps_its_plan():
    assert plan_faults(1, 12, 5, STREAMS) == SEED_1_DIRECT
    assert plan_faults(2, 8, 4, STREAMS) == SEED_2_DIRECT
    assert plan_service_faults(36, 15, 2, ["P0", "P1"], ["C0", "C1"]) == SEED_36_SERVICE


def test_disk_faults_are_added_around_a_seeds_plan_not_into_it():
    plan = with_disk_faults(SEED_1_DIRECT, 1, 12, 5)
    assert [f for f in plan if f.kind not in DISK_KINDS] == SEED_1_DIRECT
    assert plan == sorted(plan, key=lambda f: f.at_s)


def bookies_out(plan: list[Fault]) -> list[set[str]]:
    """At each start of an outage or a disk fault, the bookies out then."""
    out = [f for f in plan if f.kind in ("kill-bookie", "pause-bookie", *DISK_KINDS)]
    return [{g.target for g in out if g.at_s <= f.at_s < g.at_s + g.duration_s} for f in out]


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("bookies", [3, 4, 5])
def test_disk_faults_are_seeded_and_count_as_bookies_down(seed, bookies):
    def direct():
        return with_disk_faults(plan_faults(seed, 60, bookies, STREAMS), seed, 60, bookies)

    def service():
        base = plan_service_faults(seed, 60, 2, ["P0", "P1"], ["C0", "C1"])
        return with_disk_faults(base, seed, 60, bookies)

    for plan in (direct(), service()):
        disk = [f for f in plan if f.kind in DISK_KINDS]
        assert all(len(out) <= max_down(bookies) for out in bookies_out(plan))
        if max_down(bookies) == 0:
            assert disk == []  # three bookies: none may fail
        for f in disk:
            assert 1.0 <= f.duration_s <= 3.0 and int(f.target) in range(bookies)
            steps = dict(f.failpoints)
            assert steps and set(steps) <= {"journal-write", "entrylog-write", "journal-sync",
                                            "entrylog-sync"}  # fmt: skip
            if f.kind == "slow-sync":
                assert 0.2 <= float(steps["journal-sync"].removeprefix("slow=")) <= 0.5
            else:
                assert set(steps.values()) == {"ENOSPC" if f.kind == "enospc" else "EIO"}
        ends = [s for s in timeline(plan, 60) if s[1] == "heal-disk"]
        assert len(ends) == sum(f.at_s + f.duration_s <= 60 for f in disk)
    assert direct() == direct() and service() == service()
    if max_down(bookies):
        assert any(f.kind in DISK_KINDS for f in service())


def test_the_chaos_tests_seed_plans_every_kind_of_disk_fault():
    # tests/integration/test_chaos.py relies on it, in both modes.
    direct = with_disk_faults(plan_faults(133, 15, 5, STREAMS), 133, 15, 5)
    service = plan_service_faults(133, 12, 2, ["P0", "P1"], ["C0", "C1"])
    for plan in (direct, with_disk_faults(service, 133, 12, 4)):
        assert {f.kind for f in plan} >= set(DISK_KINDS)


def series(name: str, rss: list[float], fds: list[int], start_s: float = 0.0) -> Series:
    return Series(
        name, [(start_s + 60.0 * i, r, f) for i, (r, f) in enumerate(zip(rss, fds, strict=True))]
    )


def test_flat_series_are_flat_and_noise_is_ignored():
    hour = 3600.0  # warm-up: 5 minutes, then 55 samples
    bookie = series("bookie-0#1", [50.0] * 5 + [80.0, 81.0, 79.0] + [80.0] * 50 + [140.0],
                    [20] * 5 + [30] * 53 + [200])  # fmt: skip
    verdict = judge_resources([bookie], hour)
    figures = verdict["series"]["bookie-0#1"]
    assert verdict["flat"] and verdict["judged"] == 1 and verdict["warmup_s"] == 300
    assert figures["grows"] is False  # (a spike in the last sample is not a trend)
    assert figures["first_rss_mib"] == 80.0 and figures["max_rss_mib"] == 140.0


def test_a_leaking_series_grows_in_memory_or_in_descriptors():
    hour = 3600.0
    memory = series("producer P0#1", [60.0 + 1.0 * i for i in range(60)], [25] * 60)
    descriptors = series("broker-1#1", [70.0] * 60, [20 + i for i in range(60)])
    slow = series("consumer C0#1", [60.0 + 0.2 * i for i in range(60)], [25] * 60)
    verdict = judge_resources([memory, descriptors, slow], hour)
    assert verdict["growing"] == ["broker-1#1", "producer P0#1"] and not verdict["flat"]
    assert verdict["series"]["producer P0#1"]["growth_rss_mib"] == 52.0  # i = 58 vs i = 6
    assert verdict["series"]["consumer C0#1"]["grows"] is False  # +10.4 MiB: under 32 MiB


def test_a_restarted_process_is_a_series_of_its_own_with_its_own_warm_up():
    hour = 3600.0
    # The first incarnation leaked until it was killed at 30 minutes; the second warms
    # up from 50 to 90 MiB in its first five minutes, then stays flat.
    first = series("bookie-2#1", [60.0 + 2.0 * i for i in range(30)], [30] * 30)
    second = series("bookie-2#2", [50.0, 70.0, 80.0, 85.0, 90.0] + [90.0] * 25, [30] * 30,
                    start_s=1800.0)  # fmt: skip
    short = series("producer P1#4", [60.0, 200.0, 400.0], [20] * 3, start_s=3400.0)
    verdict = judge_resources([first, second, short], hour)
    assert verdict["series"]["bookie-2#1"]["grows"] is True
    assert verdict["series"]["bookie-2#2"]["grows"] is False
    assert verdict["series"]["producer P1#4"]["grows"] is None  # too short to judge
    assert verdict["growing"] == ["bookie-2#1"] and verdict["judged"] == 2


def test_the_verifiers_own_growth_is_reported_but_not_judged():
    hour = 3600.0
    # The chaos process keeps every event for the verdict: it grows with the messages.
    verifier = series("chaos#1", [100.0 + 50.0 * i for i in range(60)], [30] * 60)
    verdict = judge_resources([verifier], hour)
    assert verdict["series"]["chaos#1"]["grows"] is True
    assert verdict["growing"] == [] and verdict["flat"]
