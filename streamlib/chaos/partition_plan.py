"""The network partitions of `streamlib chaos --partitions`, planned from the seed alone
(pure: no clock, no processes), beside the mode's own plan (streamlib.chaos.plan).

Hosts: `zk` (ZooKeeper), b1..bN (bookie i is host b{i+1}), k1..kM (broker i is k{i+1},
broker mode only) and the client hosts c1, c2 (the workers). The kinds, one at a time,
each healed after its duration:

- partition-host: one host's cable pulled (a bookie, a broker or a client host);
- partition-majority: a majority of the bookie hosts pulled at once (writes stall until
  the heal; the only fault allowed past max_down);
- cut-client-broker (broker mode): a client host and one broker host, both ways;
- asymmetric: one direction only, "SRC>DST": a bookie's packets to a client host, or a
  broker's to ZooKeeper (broker mode);
- cut-zk-broker (broker mode): ZooKeeper and one broker, both ways, past the broker's
  session: it expires and another broker takes the streams over by fencing.

The draws come from random.Random(seed ^ SALT), a sequence of their own, so a seed's
plan without --partitions is exactly what it was. A bookie cut off (pulled, or its
packets to a client dropped) never makes more bookies unavailable at once than
max_down() allows, counting the mode's own bookie outages; a broker is cut off only
while no broker fault of the mode's plan is under way (one broker always serves).
"""

from __future__ import annotations

import random

from streamlib.chaos.plan import RESTART_SLACK_S, SERVICE_RESTART_S, SESSION_S, Fault, max_down

SALT = 0x9A27_1710  # seed ^ SALT: the partitions' own sequence of draws
KINDS = ("partition-host", "partition-majority", "cut-client-broker", "asymmetric", "cut-zk-broker")
DIRECT_KINDS = ("partition-host", "partition-majority", "asymmetric")
CLIENT_HOSTS = ("c1", "c2")
ZK_HOST = "zk"
HEAL = "heal-"  # a partition's end step: "heal-" + its kind, with the same target
SETTLE_S = (1.0, 3.0)  # between one partition's heal and the next partition
RETRY_S = 0.5  # after a draw that found nothing it may cut off


def bookie_host(index: int) -> str:
    return f"b{index + 1}"


def broker_host(index: int) -> str:
    return f"k{index + 1}"


def hosts(bookies: int, brokers: int) -> list[str]:
    """Every host of a run, ZooKeeper's first."""
    return [ZK_HOST, *map(bookie_host, range(bookies)), *map(broker_host, range(brokers)),
            *CLIENT_HOSTS]  # fmt: skip


def _outages(faults: list[Fault], kinds: tuple[str, ...], slack_s: float) -> list[tuple]:
    """(start, end, index) of the mode's outages of these kinds, with their restart."""
    return [(f.at_s, f.at_s + f.duration_s + slack_s, int(f.target)) for f in faults
            if f.kind in kinds]  # fmt: skip


def _busy(outages: list[tuple], start: float, end: float) -> set[int]:
    """The nodes out at some moment of [start, end]."""
    return {index for (a, b, index) in outages if a < end and start < b}


def plan_partitions(
    seed: int, seconds: float, bookies: int, brokers: int, faults: list[Fault]
) -> list[Fault]:
    """The partitions of a run with these bookies and brokers (0: direct mode), next to
    the mode's `faults`: one at a time, each over within `seconds`."""
    rng = random.Random(seed ^ SALT)
    bookie_out = _outages(faults, ("kill-bookie", "pause-bookie"), RESTART_SLACK_S)
    broker_out = _outages(faults, ("kill-broker", "pause-broker"), SERVICE_RESTART_S)
    kinds = KINDS if brokers else DIRECT_KINDS
    planned: list[Fault] = []
    t = rng.uniform(1.0, 3.0)
    while True:
        kind = rng.choice(kinds)
        duration = rng.uniform(2.0, 5.0)
        if kind == "cut-zk-broker":
            duration = SESSION_S + rng.uniform(1.0, 3.0)  # past the session: it expires
        draw = rng.randrange(1 << 16)
        end = t + duration + RESTART_SLACK_S  # (reconnecting after a heal takes a moment)
        if t + duration > seconds:
            break
        # Who may be cut off now: bookies within max_down, brokers when none is out.
        out = _busy(bookie_out, t, end)
        spare = max_down(bookies) - len(out)
        free_bookies = [i for i in range(bookies) if i not in out] if spare >= 1 else []
        free_brokers = [] if _busy(broker_out, t, end) else list(range(brokers))
        target = ""
        if kind == "partition-host":
            choices = [*map(bookie_host, free_bookies), *map(broker_host, free_brokers),
                       *CLIENT_HOSTS]  # fmt: skip
            target = choices[draw % len(choices)]
        elif kind == "partition-majority" and not out:
            majority = bookies // 2 + 1
            target = ",".join(map(bookie_host, sorted(rng.sample(range(bookies), majority))))
        elif kind == "cut-client-broker" and free_brokers:
            client = CLIENT_HOSTS[draw % len(CLIENT_HOSTS)]
            target = f"{client}|{broker_host(free_brokers[draw // 2 % len(free_brokers)])}"
        elif kind == "asymmetric":
            pairs = [(bookie_host(i), c) for i in free_bookies for c in CLIENT_HOSTS]
            pairs += [(broker_host(i), ZK_HOST) for i in free_brokers]
            if pairs:
                target = ">".join(pairs[draw % len(pairs)])
        elif kind == "cut-zk-broker" and free_brokers:
            target = f"{ZK_HOST}|{broker_host(free_brokers[draw % len(free_brokers)])}"
        if target:
            planned.append(Fault(round(t, 3), kind, target, round(duration, 3)))
            t += duration + rng.uniform(*SETTLE_S)
        else:  # nothing may be cut off that way now: draw again a little later
            t += RETRY_S
    return planned


def with_heals(faults: list[Fault]) -> list[Fault]:
    """The faults, each partition followed by its heal step (a Fault of kind "heal-KIND"
    at its end), in time order: what the run's timeline carries out."""
    heals = [Fault(round(f.at_s + f.duration_s, 3), HEAL + f.kind, f.target)
             for f in faults if f.kind in KINDS]  # fmt: skip
    return sorted([*faults, *heals], key=lambda f: f.at_s)


def cut_bookies(fault: Fault) -> set[str]:
    """The bookie hosts a partition makes unreachable to someone."""
    names = fault.target.replace("|", ",").replace(">", ",").split(",")
    return {n for n in names if n.startswith("b")}
