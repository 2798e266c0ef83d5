"""The stream service's ownership decisions (ARCHITECTURE.md §4a), as pure functions:
when a broker may take a stream from its owner before the owner's metadata session
expires, and what an owner must know before it answers.

Takeover is safe by fencing, so it may be fast. A lease (an ephemeral node of the
owner's session) only avoids duels: the next owner still fences the last two ledgers
before it writes (stream_rules.py), so whatever a deposed owner still sends fails, and
every receipt it sent before is for an entry the fence's recovery keeps. What a lease
costs is time: a dead owner's session outlives it by the session timeout, and its leases
with it. Positive evidence that the owner's process is gone lets the next owner delete
the lease at once (``owner_gone``). A stopped or cut-off owner gives none -- its port
still accepts, or nothing answers -- and is waited out: leases are what keep two live
brokers from dueling for a stream, and waiting for a live one's session is the point.

Evidence, each kind positive (never the absence of an answer):

- REFUSED: a connection to the owner's advertised address was refused (an RST from a
  host that answers: nothing listens there). A broker binds its port before it
  registers and closes it only after giving every stream up, so a registered broker
  refuses only when its process is gone. A timeout, an unreachable host or a reset
  after connecting is SILENT: a stopped process, a partition, a full backlog.
- the process is GONE: the owner's registration names this host (boot and pid
  namespace), and its pid is not running with the start time it registered (a pid
  that died and was reused runs with another start time; a zombie counts as gone).
- SUPERSEDED: the owner's broker id is registered now by another incarnation. A
  broker registers only once its id's previous registration went, with its session or
  by evidence that its process is gone (above); a live broker keeps its incarnation
  when it registers again (after losing its session, or after a false eviction); so a
  lease whose owner is not the registered incarnation is a dead process's. No
  registration at all is no evidence: a broker evicted on false evidence (a firewall
  that rejects, rather than drops, connections to it) is alive and registers again.

The owner's side: a broker takes a stream over (fences) only while it holds the lease,
confirmed just before; it answers Ready (a producer's or a consumer's) only after
confirming it again; and a receipt goes out only for an entry its ledger acknowledged
(ack quorum), never for one merely sent (the ledger's own rule: its writes complete in
entry order once acknowledged). tests/sim/service.py drives these rules with brokers
killed, restarted, stopped, cut off and evicted on false evidence, and its mutations
show each check is needed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Probe(enum.Enum):
    """What connecting to an owner's address gave."""

    REFUSED = "refused"  # ECONNREFUSED: the host answered, nothing listens
    ANSWERED = "answered"  # the connection was accepted (a stopped process's too)
    SILENT = "silent"  # a timeout, an unreachable host, any other error: no evidence


class Process(enum.Enum):
    """What this host knows of an owner's process."""

    GONE = "gone"  # on this host, and not running (or a zombie, or another process)
    RUNNING = "running"  # on this host and running (stopped counts as running)
    ELSEWHERE = "elsewhere"  # on another host, or its registration does not say


@dataclass(frozen=True)
class Incarnation:
    """One broker process, as its registration and its leases name it."""

    broker_id: str
    incarnation: str  # random per process: a restarted broker is another incarnation
    host: str = ""  # the host's identity (boot id and pid namespace); "" unknown
    pid: int = 0
    started: int = 0  # the process's start time (clock ticks after boot)


class Evidence(enum.Enum):
    REFUSED = "refused"
    GONE = "gone"
    SUPERSEDED = "superseded"


def owner_gone(
    owner: Incarnation,
    registered: Incarnation | None,
    *,
    probe: Probe | None = None,
    process: Process = Process.ELSEWHERE,
    evict_on_silence: bool = False,
) -> Evidence | None:
    """The evidence that `owner` (a lease's holder) is gone, or None: wait for its
    session. `registered`: the live registration under owner's broker id now (None:
    none: no evidence either way). `probe`: a connection to owner's address, if one was tried. The simulator's
    mutation `evict_on_silence` takes silence for evidence (a stopped broker then loses
    its streams while it lives)."""
    if registered is not None and registered.incarnation != owner.incarnation:
        return Evidence.SUPERSEDED
    if process is Process.GONE:
        return Evidence.GONE
    if probe is Probe.REFUSED:
        return Evidence.REFUSED
    if evict_on_silence and probe is Probe.SILENT:
        return Evidence.REFUSED
    return None


def process_state(
    owner: Incarnation, this_host: str, running: bool, started: int | None
) -> Process:
    """What this host knows of owner's process: `running` is whether owner.pid runs
    here (not a zombie), `started` its start time (None: not running; -1: running, its
    start time unreadable)."""
    if not owner.host or owner.host != this_host or not owner.pid:
        return Process.ELSEWHERE
    if not running or started is None:
        return Process.GONE
    if owner.started and started >= 0 and started != owner.started:
        return Process.GONE  # (its pid, reused by another process)
    return Process.RUNNING  # (a start time this host cannot read (-1) proves nothing)


def may_take_over(holds_lease: bool) -> bool:
    """A broker fences the stream's ledgers only while it holds the lease (confirmed in
    the store just before): a deposed broker that a stale lookup still sends a producer
    to must not fence its successor."""
    return holds_lease


def may_answer_ready(holds_lease: bool, gone: bool) -> bool:
    """A producer or consumer is told Ready only by a broker that confirmed, after
    everything its open needed (the takeover included), that it still holds the lease."""
    return holds_lease and not gone
