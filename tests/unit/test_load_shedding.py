"""streamlib.protocol.load: how loaded each broker is, which streams the load manager
moves (and where), and where a lookup assigns a stream nobody owns -- as tables."""

from __future__ import annotations

import random

import pytest

from metadata.services.broker_moves import MoveRequest
from metadata.services.brokers import BrokerInfo
from streamlib.broker import load as load_module
from streamlib.broker.balance import BalanceConfig, settled
from streamlib.broker.load import LoadMeter, Traffic, broker_load
from streamlib.protocol.load import BrokerLoad, Move, Placement, StreamLoad, assign, loads, shed


def broker(name: str, streams: int, msgs: float = 0.0, cpu: float = 0.0) -> BrokerLoad:
    """`streams` streams named NAME-0.., sharing `msgs` msgs/s evenly (100 bytes each)."""
    each = msgs / streams if streams else 0.0
    return BrokerLoad(
        name,
        streams,
        msgs,
        msgs * 100,
        cpu,
        tuple(StreamLoad(f"{name}-{i}", each, each * 100) for i in range(streams)),
    )


def moved(moves: list[Move]) -> dict[tuple[str, str], int]:
    """(source, target) -> how many streams."""
    found: dict[tuple[str, str], int] = {}
    for move in moves:
        key = (move.source, move.target)
        found[key] = found.get(key, 0) + 1
    return found


@pytest.mark.parametrize(
    ("brokers", "expected"),
    [
        # a new broker in a loaded cluster takes streams from both
        ([broker("a", 8), broker("b", 8), broker("c", 0)], {("a", "c"): 2, ("b", "c"): 3}),
        # idle brokers, balanced within one stream: nothing moves (no swapping who is loaded)
        ([broker("a", 6), broker("b", 5), broker("c", 5)], {}),
        ([broker("a", 2), broker("b", 1)], {}),
        # balanced
        ([broker("a", 4), broker("b", 4)], {}),
        # one broker: nowhere to go
        ([broker("a", 10)], {}),
        # equal stream counts, but one carries all the traffic and the CPU
        (
            [broker("a", 4, msgs=4000, cpu=80), broker("b", 4), broker("c", 4)],
            {("a", "b"): 1, ("a", "c"): 1},
        ),
        # noise below the floors (a few msgs/s, a few % CPU) is not load
        ([broker("a", 4, msgs=30, cpu=3), broker("b", 4, msgs=1, cpu=0.5)], {}),
    ],
)
def test_shedding_moves_streams_from_overloaded_brokers(
    brokers: list[BrokerLoad], expected: dict[tuple[str, str], int]
) -> None:
    assert moved(shed(brokers)) == expected


def test_a_pass_moves_at_most_max_streams() -> None:
    brokers = [broker("a", 40), broker("b", 0)]
    assert len(shed(brokers)) == 10
    assert len(shed(brokers, max_streams=3)) == 3


def test_a_higher_threshold_tolerates_more() -> None:
    brokers = [broker("a", 8), broker("b", 4), broker("c", 4)]
    assert moved(shed(brokers, threshold=0.1)) == {("a", "b"): 1, ("a", "c"): 1}
    assert shed(brokers, threshold=0.5) == []


def test_pinned_and_recently_moved_streams_are_never_shed() -> None:
    brokers = [broker("a", 3), broker("b", 0)]
    pins = {"a-0": "a", "a-1": "a"}
    moves = shed(brokers, pins=pins, owners={"a-0": "a", "a-1": "a"}, recent={"a-2"})
    assert moves == []
    moves = shed(brokers, pins=pins, owners={"a-0": "a", "a-1": "a"})
    assert moves == [Move("a-2", "a", "b", "shed")]


def test_a_stream_pinned_elsewhere_moves_to_its_pin() -> None:
    brokers = [broker("a", 2), broker("b", 2)]
    moves = shed(brokers, pins={"a-0": "b", "a-1": "gone"}, owners={"a-0": "a", "a-1": "a"})
    # (a pin to a broker that is not live moves nothing)
    assert moves == [Move("a-0", "a", "b", "pin")]


def test_the_heaviest_stream_that_narrows_the_gap_goes_first() -> None:
    heavy = BrokerLoad(
        "a",
        3,
        3000,
        0,
        0,
        (StreamLoad("big", 2900), StreamLoad("small", 50), StreamLoad("tiny", 50)),
    )
    moves = shed([heavy, broker("b", 3)], max_streams=1)
    # (moving "big" would leave b the loaded one: the gap narrows only by the others)
    assert moves == [Move("small", "a", "b", "shed")]


def test_loads_are_relative_to_the_cluster_average() -> None:
    found = loads([broker("a", 8, msgs=1000), broker("b", 8, msgs=1000)])
    assert found["a"] == pytest.approx(found["b"])
    assert found["a"] == pytest.approx(0.75)  # (CPU below its floor: 0)


@pytest.mark.parametrize(
    ("placement", "prefer", "expected"),
    [
        (Placement(), None, "c"),  # the least loaded
        (Placement(), "b", "c"),  # the asker only when as little loaded
        (Placement(), "c", "c"),
        (Placement(pinned_to="a"), "c", "a"),  # its pin, however loaded
        (Placement(pinned_to="gone"), None, "c"),  # a pin that is not live: as usual
        (Placement(moved_to="b"), "c", "b"),  # where the leader moves it
        (Placement(moved_to="gone", moved_from=frozenset({"c"})), "c", "b"),  # not back
        (Placement(pinned_to="b", moved_to="c"), None, "b"),
    ],
)
def test_a_lookup_assigns_by_pin_move_and_load(
    placement: Placement, prefer: str | None, expected: str
) -> None:
    brokers = [broker("a", 9), broker("b", 5), broker("c", 1)]
    assert assign(brokers, placement, prefer) == expected


def test_nothing_to_assign_to() -> None:
    assert assign([]) is None
    assert assign([broker("a", 3)], Placement(moved_from=frozenset({"a"}))) == "a"


def test_a_registration_without_a_load_report_decodes_with_defaults() -> None:
    old = b'{"broker_id": "b1", "address": "h:1", "owned": 3, "pid": 7}'
    info = BrokerInfo.decode(old)
    assert (info.owned, info.reported, info.msgs_in_rate, info.stream_rates) == (3, 0.0, 0.0, ())
    reported = BrokerInfo("b1", "h:1", 2, msgs_in_rate=5.0, stream_rates=(("s", 5.0, 50.0),))
    again = BrokerInfo.decode(reported.encode())
    assert again == reported
    assert broker_load(again) == BrokerLoad("b1", 2, 5.0, 0.0, 0.0, (StreamLoad("s", 5.0, 50.0),))


def test_a_move_request_round_trips() -> None:
    request = MoveRequest("s", "a", "b", 12.5, "pin")
    assert MoveRequest.decode(request.encode()) == request


CONFIG = BalanceConfig(report_interval_s=1.0, shed_interval_s=2.0)


@pytest.mark.parametrize(
    ("recent", "reported", "expected"),
    [
        ([], [100.0, 100.0], True),
        ([], [100.0, 0.0], False),  # a broker that has not reported yet
        # a move not done yet (and younger than a pass): its rates would mislead
        ([MoveRequest("s", "a", "b", 99.0)], [100.0, 100.0], False),
        # ... older than a pass: its source no longer owned it; it holds nothing up
        ([MoveRequest("s", "a", "b", 97.0)], [100.0, 100.0], True),
        # done, but a report does not cover a whole interval after it yet
        ([MoveRequest("s", "a", "b", 98.0, done=True, done_at=99.5)], [100.0, 100.0], False),
        ([MoveRequest("s", "a", "b", 98.0, done=True, done_at=99.0)], [100.0, 100.0], True),
    ],
)
def test_a_pass_waits_until_the_reports_show_the_last_moves(
    recent: list[MoveRequest], reported: list[float], expected: bool
) -> None:
    assert settled(recent, reported, 100.0, CONFIG) is expected


class _Owned:
    def __init__(self) -> None:
        self.traffic = Traffic()


def test_the_meter_reports_rates_over_the_interval_busiest_first(monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(load_module.time, "monotonic", lambda: clock[0])
    meter = LoadMeter()
    owned = {"quiet": _Owned(), "busy": _Owned()}
    owned["busy"].traffic.msgs_in, owned["busy"].traffic.bytes_in = 100, 10_000
    owned["busy"].traffic.msgs_out, owned["busy"].traffic.bytes_out = 300, 30_000
    owned["quiet"].traffic.msgs_in = 10
    clock[0] += 10
    report = meter.measure(owned)
    assert (report.msgs_in_rate, report.msgs_out_rate) == (11.0, 30.0)
    assert (report.bytes_in_rate, report.bytes_out_rate) == (1000.0, 3000.0)
    assert report.stream_rates == (("busy", 40.0, 4000.0), ("quiet", 1.0, 0.0))
    # Next interval: only what came since; a stream owned again counts from its start.
    owned["busy"].traffic.msgs_in += 50
    owned["quiet"] = _Owned()
    owned["quiet"].traffic.msgs_in = 5
    clock[0] += 5
    report = meter.measure(owned)
    assert report.stream_rates == (("busy", 10.0, 0.0), ("quiet", 1.0, 0.0))
    assert report.msgs_in_rate == 11.0 and report.reported > 0


def _apply(brokers: list[BrokerLoad], moves: list[Move]) -> list[BrokerLoad]:
    """The cluster after the moves: each stream's rates, and the CPU they cost (1 % per
    100 msgs/s), go with it -- as the next reports would show."""
    streams = {b.broker_id: {s.stream: s for s in b.stream_loads} for b in brokers}
    for move in moves:
        streams[move.target][move.stream] = streams[move.source].pop(move.stream)
    return [_broker(b.broker_id, tuple(streams[b.broker_id].values())) for b in brokers]


def _broker(name: str, streams: tuple[StreamLoad, ...]) -> BrokerLoad:
    msgs = sum(s.msgs_rate for s in streams)
    return BrokerLoad(name, len(streams), msgs, sum(s.bytes_rate for s in streams), msgs / 100,
                      streams)  # fmt: skip


@pytest.mark.parametrize("grace", [True, False])
@pytest.mark.parametrize("seed", range(200))
def test_repeated_passes_settle_and_never_raise_the_highest_load(seed: int, grace: bool) -> None:
    """Random clusters, passes applied one after another (with the grace period: a
    stream moves once at most; without: the gap rule alone): the highest load never
    rises, each pass moves at most its bound, and the passes stop moving streams."""
    rng = random.Random(seed)
    brokers = [
        _broker(f"b{b}", tuple(
            StreamLoad(f"s{b}-{i}", rng.choice([0.0, 10.0, 500.0, 5000.0]), rng.random() * 1e5)
            for i in range(rng.randint(0, 25))
        ))
        for b in range(rng.randint(2, 6))
    ]  # fmt: skip
    moved: set[str] = set()
    for _ in range(60):
        moves = shed(brokers, max_streams=5, recent=moved if grace else ())
        assert len(moves) <= 5, f"seed {seed}"
        if not moves:
            return
        before = max(loads(brokers).values())
        brokers = _apply(brokers, moves)
        assert max(loads(brokers).values()) <= before + 1e-9, f"seed {seed}: {moves}"
        moved |= {m.stream for m in moves}
    raise AssertionError(f"seed {seed}: still moving streams after 60 passes")
