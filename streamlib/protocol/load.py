"""The stream service's load balancing, as decisions (Pulsar's load manager and its
ThresholdShedder): how loaded each broker is, which streams the leader sheds from the
loaded ones and where each should go, and where a lookup assigns a stream nobody owns.

Theory of operation. Every broker reports, in its registration, the streams it owns,
its messages and bytes per second (in + out), its process CPU and the rates of its
busiest streams (streamlib/broker/load.py measures them). A broker's LOAD is the mean,
over four dimensions -- streams, msgs/s, bytes/s, CPU% -- of its value divided by the
cluster's mean value of that dimension (below a floor, the floor: an idle cluster's
differences of a few messages or a percent of CPU are noise, not load). So a cluster
of equal brokers is at load 1.0 each, and the average of the loads is at most 1.0.

A broker is OVERLOADED when its load exceeds the cluster's average load by more than
the threshold (Pulsar's ThresholdShedder: 10 %, loadBalancerBrokerThresholdShedderPercentage).
The leader then moves streams from it, simulated one at a time: the overloaded broker
with the highest load gives its heaviest movable stream to the broker with the lowest,
as long as the giver is still above the average and the move does not reverse the gap
between the two (giver - w >= receiver + w: a move never swaps who is loaded, so a pass
never undoes the last one), and at most `max_streams` per pass. A stream is not movable
when it is pinned, or was moved within the grace period (Pulsar's
loadBalancerSheddingGracePeriodMinutes). A stream pinned to a live broker other than
its owner is moved there first (counted in the bound too).

Why passes end: a move of weight w from giver g to receiver r with g - r >= 2w lowers the
sum of the squared loads by 2w(g - r - w) >= 2w^2 > 0, and the highest load never rises,
so repeated passes settle even without the grace period
(tests/unit/test_load_shedding.py checks it on random clusters).

A stream's weight on its broker is its share of the broker's load: one stream of the
streams dimension, its own msgs/s and bytes/s, and the broker's CPU in proportion to
its msgs (evenly when none); the weights of all of a broker's streams add up to its
load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Below these, a dimension's cluster mean counts as this (noise is not load).
FLOORS = {"streams": 1.0, "msgs": 100.0, "bytes": 100_000.0, "cpu": 10.0}
DEFAULT_THRESHOLD = 0.10  # above the average load by this much: overloaded
DEFAULT_MAX_STREAMS = 10  # streams moved per shedding pass, at most
EPSILON = 1e-9  # (a move that leaves giver and receiver equal is still one)


@dataclass(frozen=True)
class StreamLoad:
    stream: str
    msgs_rate: float = 0.0  # messages per second, in + out
    bytes_rate: float = 0.0  # bytes per second, in + out


@dataclass(frozen=True)
class BrokerLoad:
    broker_id: str
    streams: int = 0  # streams it owns
    msgs_rate: float = 0.0  # messages per second, in + out
    bytes_rate: float = 0.0
    cpu_percent: float = 0.0  # of one core (a busy process on two cores: 200)
    # The streams it reported (its busiest; perhaps not all it owns): what may be shed.
    stream_loads: tuple[StreamLoad, ...] = ()


@dataclass(frozen=True)
class Move:
    """Unload `stream` from `source`; its next lookup assigns it to `target`."""

    stream: str
    source: str
    target: str
    reason: str  # "shed" (the source is overloaded) or "pin" (the target is its pin)


@dataclass(frozen=True)
class Means:
    streams: float
    msgs: float
    bytes: float
    cpu: float


def means(brokers: Iterable[BrokerLoad]) -> Means:
    found = list(brokers)
    count = max(1, len(found))
    return Means(
        max(FLOORS["streams"], sum(b.streams for b in found) / count),
        max(FLOORS["msgs"], sum(b.msgs_rate for b in found) / count),
        max(FLOORS["bytes"], sum(b.bytes_rate for b in found) / count),
        max(FLOORS["cpu"], sum(b.cpu_percent for b in found) / count),
    )


def load_of(broker: BrokerLoad, mean: Means) -> float:
    """The broker's load: 1.0 is an average broker of a busy cluster."""
    return (
        broker.streams / mean.streams
        + broker.msgs_rate / mean.msgs
        + broker.bytes_rate / mean.bytes
        + broker.cpu_percent / mean.cpu
    ) / 4


def loads(brokers: Iterable[BrokerLoad]) -> dict[str, float]:
    found = list(brokers)
    mean = means(found)
    return {b.broker_id: load_of(b, mean) for b in found}


def stream_weight(stream: StreamLoad, broker: BrokerLoad, mean: Means) -> float:
    """The stream's share of its broker's load (what moving it moves)."""
    if broker.msgs_rate > 0:
        cpu = broker.cpu_percent * min(1.0, stream.msgs_rate / broker.msgs_rate)
    else:
        cpu = broker.cpu_percent / max(1, broker.streams)
    return (
        1 / mean.streams
        + stream.msgs_rate / mean.msgs
        + stream.bytes_rate / mean.bytes
        + cpu / mean.cpu
    ) / 4


def shed(
    brokers: Iterable[BrokerLoad],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    max_streams: int = DEFAULT_MAX_STREAMS,
    pins: Mapping[str, str] | None = None,
    owners: Mapping[str, str] | None = None,
    recent: Iterable[str] = (),
) -> list[Move]:
    """The streams to move this pass. `pins`: stream -> the broker it is pinned to;
    `owners`: stream -> its owner, for pinned streams (the leader reads their leases);
    `recent`: streams moved within the grace period."""
    found = {b.broker_id: b for b in brokers}
    pins = pins or {}
    moves: list[Move] = []
    for stream, target in sorted(pins.items()):
        owner = (owners or {}).get(stream)
        if len(moves) < max_streams and owner in found and target in found and owner != target:
            moves.append(Move(stream, owner, target, "pin"))
    if len(found) < 2:
        return moves
    mean = means(found.values())
    load = {b: load_of(info, mean) for b, info in found.items()}
    average = sum(load.values()) / len(load)
    overloaded = {b for b, value in load.items() if value > average + threshold}
    moving = {m.stream for m in moves} | set(pins) | set(recent)
    candidates = {
        b: sorted(
            (
                (stream_weight(s, found[b], mean), s.stream)
                for s in found[b].stream_loads
                if s.stream not in moving
            ),
            key=lambda ws: (-ws[0], ws[1]),
        )
        for b in overloaded
    }
    while len(moves) < max_streams:
        givers = [b for b in overloaded if load[b] > average and candidates[b]]
        if not givers:
            break
        giver = max(givers, key=lambda b: (load[b], b))
        receiver = min((b for b in load if b != giver), key=lambda b: (load[b], b))
        gap = load[giver] - load[receiver]
        chosen = next(((w, s) for w, s in candidates[giver] if 2 * w <= gap + EPSILON), None)
        if chosen is None:
            overloaded.discard(giver)  # (nothing of it would narrow the gap)
            continue
        candidates[giver].remove(chosen)
        weight, stream = chosen
        load[giver] -= weight
        load[receiver] += weight
        moves.append(Move(stream, giver, receiver, "shed"))
    return moves


@dataclass(frozen=True)
class Placement:
    """What a lookup weighs for a stream nobody owns, besides the live brokers' loads."""

    pinned_to: str | None = None  # its pin
    moved_to: str | None = None  # where a recent move sends it
    moved_from: frozenset[str] = field(default_factory=frozenset)  # not back there


def assign(
    brokers: Iterable[BrokerLoad], placement: Placement = Placement(), prefer: str | None = None
) -> str | None:
    """The live broker to own a stream nobody owns: its pin when that is live, else
    where the leader's move sends it when that is live, else the least loaded one that
    it was not just moved from (when there is no other, that one) -- `prefer` (the
    broker looking it up: no hop) when it is as little loaded. None: no broker."""
    found = {b.broker_id: b for b in brokers}
    if not found:
        return None
    for wanted in (placement.pinned_to, placement.moved_to):
        if wanted is not None and wanted in found:
            return wanted
    load = loads(found.values())
    allowed = [b for b in found if b not in placement.moved_from] or list(found)
    least = min(allowed, key=lambda b: (load[b], found[b].streams, b))
    rank = {b: (load[b], found[b].streams) for b in allowed}
    if prefer is not None and prefer in rank and rank[prefer] <= rank[least]:
        return prefer
    return least
