"""The stream service in the simulator: brokers that own a stream by a lease of their
metadata session, take it over by fencing, and answer producers -- under kills,
restarts, SIGSTOPs past the session, partitions, and a firewall that rejects
connections to a live broker (the one way evidence can lie). The decisions are the
REAL ones of streamlib.protocol.ownership (owner_gone, may_take_over,
may_answer_ready), which the broker calls too; the rest is a model of its I/O.

The model: one stream, a list of ledgers; a ledger takes an append or a fence as one
step (its quorum rules are the other simulations' subject), delivered after a seeded
delay, and a fenced ledger refuses appends. The metadata store is linearizable: a
session expires when its heartbeats stop for SESSION ticks, and its leases and
registration go with it. Three producers publish numbered messages, resend what is not
acknowledged after each reconnection, and a broker deduplicates by (name, sequence) as
the real one: a sequence id not above the highest taken is a duplicate, answered at
once unless it is in flight. An owner rolls to a new ledger now and then (a list CAS),
and a ledger can fail without being fenced (its bookies ran out): an append to it fails.
The broker's writer keeps the REAL rules of streamlib.protocol.stream_rules for that:
appends go to one ledger at a time (may_append: a roll's new ledger waits for the old
one's entries in flight), and a broker's writer gives the stream up at a failure
(gives_up_on_failure, fail-stop) instead of replacing the ledger and going on. A
takeover fences and closes the list's last two ledgers.

Invariants:
- every acknowledged message is in the stream, none twice, each producer's in order
  (the final read fences and recovers, as a next owner would);
- a broker evicts an owner by evidence only if the owner's process is dead, or a
  firewall rejects connections to it (a broker cannot tell those apart);
- a broker fences the stream only while it holds the lease (checked the moment it
  fences);
- liveness: once every fault healed, every message is acknowledged.

Mutations (each must be caught): ``evict_on_silence`` (a probe that times out is taken
for evidence), ``trust_evidence`` (a takeover after an eviction skips the fence: the
owner is "dead"), ``skip_lease_check`` (a broker fences without confirming its lease),
``receipt_on_send`` (a receipt when an entry is sent, not when it is acknowledged),
``replace_failed_ledger`` (a broker's writer replaces a failed ledger and goes on, as a
direct-mode writer does), ``roll_without_waiting`` (a roll's new ledger takes appends
while the old one's are in flight).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from streamlib.protocol.ownership import (
    Incarnation,
    Probe,
    Process,
    may_answer_ready,
    may_take_over,
    owner_gone,
)
from streamlib.protocol.stream_rules import gives_up_on_failure, may_append
from tests.sim.scenario import InvariantViolation

MUTATIONS = (
    "none",
    "evict_on_silence",
    "trust_evidence",
    "skip_lease_check",
    "receipt_on_send",
    "replace_failed_ledger",
    "roll_without_waiting",
)
SESSION = 30  # ticks without a heartbeat until a session expires
HEARTBEAT = 5
MESSAGES = 30  # per producer
FAULT_UNTIL = 400  # ticks with faults; then everything heals
DEADLINE = 2000  # every message acknowledged by then (liveness)
PRODUCERS = ("P", "Q", "R")


@dataclass
class Ledger:
    entries: dict[int, tuple[str, int]] = field(default_factory=dict)  # by entry id
    fenced: bool = False
    failed: bool = False  # out of bookies: appends fail (not fenced)
    length: int | None = None  # closed at this many entries
    next_entry: int = 0  # (its writer's next entry id)

    def prefix(self) -> int:
        """Entries stored without a gap from the first (what a recovery keeps: the
        writer acknowledges in entry order, so nothing past a gap was acknowledged)."""
        n = 0
        while n in self.entries:
            n += 1
        return n


@dataclass
class Owned:
    """A broker's state of the stream."""

    writer: int | None = None  # the ledger it appends to, once taken over
    taking_over: bool = False
    evicted: bool = False  # its lease came from evicting a gone owner
    gone: bool = False
    durable: dict[str, int] = field(default_factory=dict)  # name -> highest stored seq
    sent: dict[str, int] = field(default_factory=dict)  # name -> highest appended seq
    next_op: int = 0  # appends, numbered in the order taken (over its ledgers)
    pending: dict[int, tuple[Producer, int, int]] = field(default_factory=dict)  # op: +ledger
    confirmed: set[int] = field(default_factory=set)  # stored, not yet acknowledged
    failed: set[int] = field(default_factory=set)  # failed: never acknowledged
    acked_upto: int = 0  # appends acknowledged (or failed) in order below this
    held: list[tuple[Producer, int]] = field(default_factory=list)  # waiting for a ledger
    waiting: list[str] = field(default_factory=list)  # producers to answer Ready


@dataclass
class Broker:
    no: int
    host: str
    incarnation: int = 0
    state: str = "up"  # up, paused, dead, cut
    rejecting: bool = False  # a firewall rejects connections to its port
    session: int = 0
    beat: int = 0  # the tick of its last heartbeat
    owned: Owned | None = None
    held: list[Callable[[], None]] = field(default_factory=list)  # (paused: delivered later)

    @property
    def id(self) -> str:
        return f"b{self.no}"

    def me(self) -> Incarnation:
        return Incarnation(self.id, f"{self.id}.{self.incarnation}", self.host, 100 + self.no,
                           self.incarnation)  # fmt: skip


@dataclass
class Producer:
    name: str
    next_seq: int = 0
    unacked: list[int] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)
    broker: Broker | None = None  # connected to (Ready answered)
    connecting: bool = False
    last_progress: int = 0


class ServiceScenario:
    def __init__(self, seed: int, mutation: str = "none") -> None:
        if mutation not in MUTATIONS:
            raise ValueError(f"unknown mutation {mutation!r}")
        self.seed = seed
        self.mutation = mutation
        self.rnd = random.Random(seed)
        self.now = 0
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._order = 0
        self.trace: list[str] = []
        hosts = ["h1", "h1", "h2"] if self.rnd.random() < 0.5 else ["h1", "h2", "h3"]
        self.brokers = [Broker(i, hosts[i]) for i in range(3)]
        self.ledgers: list[Ledger] = [Ledger()]
        self.list: list[int] = [0]  # the stream's ledgers
        self.list_version = 0
        self.sessions: dict[int, int] = {}  # live session -> the tick of its last heartbeat
        self.next_session = 1
        self.lease: tuple[Incarnation, int] | None = None  # owner, its session
        self.registered: dict[str, tuple[Incarnation, int]] = {}
        self.epoch = 0  # leases taken so far (brokers/epochs/STREAM's version)
        self.producers = [Producer(name) for name in PRODUCERS]
        for broker in self.brokers:
            self.start_broker(broker)

    # -- the event queue ------------------------------------------------------------------

    def log(self, text: str) -> None:
        self.trace.append(f"{self.now:5d} {text}")

    def at(self, delay: int, event: Callable[[], None]) -> None:
        self._order += 1
        heapq.heappush(self._queue, (self.now + delay, self._order, event))

    def delay(self) -> int:
        return self.rnd.choice((1, 1, 2, 3, 5, 8))

    def to_broker(self, broker: Broker, event: Callable[[], None], incarnation: int) -> None:
        """A message to a broker process: lost if that process died; held while it is
        stopped or cut off (TCP delivers it after the heal)."""

        def deliver() -> None:
            if broker.incarnation != incarnation or broker.state == "dead":
                return
            if broker.state in ("paused", "cut"):
                broker.held.append(event)
            else:
                event()

        self.at(self.delay(), deliver)

    # -- the metadata store -----------------------------------------------------------------

    def reap(self) -> None:
        """Sessions whose heartbeats stopped SESSION ticks ago end, with their lease and
        registration (a dead process's too: the store cannot tell it from a stopped one)."""
        for session, beat in list(self.sessions.items()):
            if self.now - beat > SESSION:
                del self.sessions[session]
                if self.lease is not None and self.lease[1] == session:
                    self.log(f"lease of {self.lease[0].incarnation} expired")
                    self.lease = None
                for bid, (_, s) in list(self.registered.items()):
                    if s == session:
                        del self.registered[bid]

    def holds(self, broker: Broker) -> bool:
        self.reap()
        return self.lease is not None and self.lease[0] == broker.me()

    # -- brokers ----------------------------------------------------------------------------

    def start_broker(self, broker: Broker) -> None:
        broker.incarnation += 1
        broker.state, broker.owned, broker.held = "up", None, []
        self.new_session(broker)
        self.reap()
        old = self.registered.get(broker.id)
        if old is not None:  # (its predecessor: gone on this host, or its port refuses)
            evidence = owner_gone(old[0], old[0], process=self.process_of(old[0], broker))
            if evidence is None:
                broker.state = "dead"  # (it waits for the old session: modelled as not started)
                self.at(SESSION + 5, lambda: self.start_broker(broker))
                broker.incarnation -= 1
                return
            self.check_eviction(broker, old[0])
        self.registered[broker.id] = (broker.me(), broker.session)
        self.log(f"{broker.id}.{broker.incarnation} up on {broker.host}")

    def new_session(self, broker: Broker) -> None:
        broker.session, broker.beat = self.next_session, self.now
        self.sessions[self.next_session] = self.now
        self.next_session += 1

    def heartbeat(self, broker: Broker) -> None:
        if broker.state != "up":
            return
        self.reap()
        if broker.session in self.sessions:
            broker.beat = self.sessions[broker.session] = self.now
            if broker.id not in self.registered:  # (evicted on false evidence: back,
                self.registered[broker.id] = (broker.me(), broker.session)
                if broker.owned is not None and not self.holds(broker):  # and what it lost)
                    self.log(f"{broker.id}: evicted while alive, gives the stream up")
                    self.give_up(broker)
            return
        self.log(f"{broker.id} lost its session")  # its leases are gone: serve nothing
        self.give_up(broker)
        self.new_session(broker)
        if broker.id not in self.registered:
            self.registered[broker.id] = (broker.me(), broker.session)

    def process_of(self, owner: Incarnation, asking: Broker) -> Process:
        broker = next(b for b in self.brokers if b.id == owner.broker_id)
        if owner.host != asking.host:
            return Process.ELSEWHERE
        alive = broker.state != "dead" and f"{broker.id}.{broker.incarnation}" == owner.incarnation
        return Process.RUNNING if alive else Process.GONE

    def probe(self, owner: Incarnation) -> Probe:
        broker = next(b for b in self.brokers if b.id == owner.broker_id)
        if broker.rejecting or broker.state == "dead":
            return Probe.REFUSED  # (a restarted one answers: that is another incarnation)
        return Probe.SILENT if broker.state == "cut" else Probe.ANSWERED

    def check_eviction(self, by: Broker, owner: Incarnation) -> None:
        broker = next(b for b in self.brokers if b.id == owner.broker_id)
        current = f"{broker.id}.{broker.incarnation}" == owner.incarnation
        if current and broker.state != "dead" and not broker.rejecting:
            raise InvariantViolation(
                f"{by.id} evicted {owner.incarnation}, which is alive ({broker.state})"
            )

    def lookup(self, broker: Broker, reply: Callable[[Broker | None], None]) -> None:
        """Broker's answer to a lookup of the stream (it may take the stream itself):
        reply(the owner), or reply(None): ask again. The lease and its epoch are read
        now; an eviction is decided after the probe, a moment later, and deletes the
        lease only if no lease was taken since (the epoch check of evict_lease)."""
        self.reap()
        if broker.session not in self.sessions:
            reply(None)  # (its session expired: the store refuses it; it notices soon)
            return
        if self.lease is None:
            self.take_lease(broker, evicted=False)
            reply(broker)
            return
        owner, epoch = self.lease[0], self.epoch
        if owner == broker.me():
            reply(broker)
            return
        registered = self.registered.get(owner.broker_id)
        evidence = owner_gone(
            owner,
            registered[0] if registered else None,
            probe=self.probe(owner),
            process=self.process_of(owner, broker),
            evict_on_silence=self.mutation == "evict_on_silence",
        )
        if evidence is None:
            reply(next(b for b in self.brokers if b.id == owner.broker_id))
            return
        self.check_eviction(broker, owner)
        incarnation = broker.incarnation

        def evict() -> None:
            self.reap()
            if broker.incarnation != incarnation or broker.state != "up":
                return  # (the evictor itself died or stopped meanwhile)
            if self.registered.get(owner.broker_id, (None,))[0] == owner:
                del self.registered[owner.broker_id]
            if self.epoch != epoch or self.lease is None or broker.session not in self.sessions:
                reply(None)  # (another came first: a lease was taken since, or it went)
                return
            self.log(f"{broker.id} evicts {owner.incarnation}: {evidence.value}")
            self.lease = None
            self.take_lease(broker, evicted=True)
            reply(broker)

        self.at(self.delay(), evict)

    def take_lease(self, broker: Broker, evicted: bool) -> None:
        self.epoch += 1
        self.lease = (broker.me(), broker.session)
        broker.owned = Owned(evicted=evicted)
        self.log(f"{broker.id} takes the lease{' (after an eviction)' if evicted else ''}")

    def give_up(self, broker: Broker) -> None:
        owned, broker.owned = broker.owned, None
        if owned is not None:
            owned.gone = True
        for producer in self.producers:
            if producer.broker is broker:
                producer.broker = None  # (its connection closes: it looks up again)
        if self.lease is not None and self.lease[0] == broker.me():
            self.lease = None

    def open_producer(self, broker: Broker, producer: Producer) -> None:
        owned = broker.owned
        if owned is None or owned.gone:
            self.answer(producer, broker, None)  # not the owner here: look up again
            return
        if owned.writer is None:
            owned.waiting.append(producer.name)
            if not owned.taking_over:
                owned.taking_over = True
                self.take_over(broker, owned)
            return
        self.ready(broker, owned, [producer.name])

    def take_over(self, broker: Broker, owned: Owned) -> None:
        holds = self.holds(broker)
        if not may_take_over(holds or self.mutation == "skip_lease_check"):
            self.log(f"{broker.id}: no longer holds the lease, gives the stream up")
            self.give_up_waiting(broker, owned)
            return
        if not holds:
            raise InvariantViolation(f"{broker.id} fences the stream without its lease")
        version, last = self.list_version, self.list[-2:]
        if self.mutation == "trust_evidence" and owned.evicted:
            stored = [self.ledgers[no].prefix() for no in last]
            self.closed_at(broker, owned, version, last, stored)
            return
        incarnation = broker.incarnation

        def fence() -> None:  # (the last two ledgers: a roll leaves two open)
            for no in last:
                self.ledgers[no].fenced = True
            stored = [self.ledgers[no].prefix() for no in last]
            self.to_broker(broker, lambda: self.closed_at(broker, owned, version, last, stored),
                           incarnation)  # fmt: skip

        self.at(self.delay(), fence)

    def closed_at(
        self, broker: Broker, owned: Owned, version: int, last: list[int], stored: list[int]
    ) -> None:
        if owned.gone:
            return
        for no, n in zip(last, stored, strict=True):
            if self.ledgers[no].length is None:
                self.ledgers[no].length = n
        if self.list_version != version:  # the list moved on: someone else took over
            self.give_up_waiting(broker, owned)
            return
        owned.writer = self.new_ledger()
        owned.durable = self.stored_seqs()
        owned.sent = dict(owned.durable)
        owned.taking_over = False
        self.log(f"{broker.id} took the stream over: ledger {owned.writer}")
        waiting, owned.waiting = owned.waiting, []
        self.ready(broker, owned, waiting)

    def give_up_waiting(self, broker: Broker, owned: Owned) -> None:
        waiting, owned.waiting = owned.waiting, []
        self.give_up(broker)
        for name in waiting:
            self.answer(self.producer(name), broker, None)

    def ready(self, broker: Broker, owned: Owned, names: list[str]) -> None:
        holds = self.holds(broker)
        for name in names:
            ok = may_answer_ready(holds, owned.gone)
            self.answer(self.producer(name), broker, owned if ok else None)
        if not holds:
            self.give_up(broker)

    def answer(self, producer: Producer, broker: Broker, owned: Owned | None) -> None:
        """Ready (owned) or a refusal (None), to the producer."""

        def arrive() -> None:
            producer.connecting = False
            if owned is None or owned.gone:
                return
            producer.broker = broker
            last = owned.durable.get(producer.name, -1)
            producer.unacked = [s for s in producer.unacked if s > last]
            producer.acked.update(s for s in range(last + 1))
            for seq in producer.unacked:
                self.to_broker(broker, lambda s=seq: self.send(broker, producer, s),
                               broker.incarnation)  # fmt: skip

        self.at(self.delay(), arrive)

    def send(self, broker: Broker, producer: Producer, seq: int) -> None:
        owned = broker.owned
        if owned is None or owned.gone or owned.writer is None:
            return
        name = producer.name
        if seq <= owned.durable.get(name, -1):
            self.receipt(producer, seq)
            return
        if seq <= owned.sent.get(name, -1):
            if any(p is producer and s == seq for p, s, _ in owned.pending.values()):
                return  # in flight: its acknowledgement answers it
            if any(p is producer and s == seq for p, s in owned.held):
                return
            self.receipt(producer, seq)  # taken before: a duplicate (the real dedup's answer)
            return
        if seq != owned.sent.get(name, -1) + 1:
            return  # (a gap: the producer resends in order after it reconnects)
        owned.sent[name] = seq
        self.append(broker, owned, producer, seq)

    def append(self, broker: Broker, owned: Owned, producer: Producer, seq: int) -> None:
        ledger_no, incarnation = owned.writer, broker.incarnation
        assert ledger_no is not None
        in_flight_on = owned.pending[next(reversed(owned.pending))][2] if owned.pending else None
        waits = owned.held or not may_append(ledger_no, in_flight_on)
        if waits and self.mutation != "roll_without_waiting":
            owned.held.append((producer, seq))
            return
        op = owned.next_op
        owned.next_op += 1
        ledger = self.ledgers[ledger_no]
        entry = ledger.next_entry
        ledger.next_entry += 1
        owned.pending[op] = (producer, seq, ledger_no)
        if self.mutation == "receipt_on_send":  # (a broker bug: the receipt before the add)
            self.receipt(producer, seq)

        def append() -> None:
            if ledger.fenced:
                self.to_broker(broker, lambda: self.fenced(broker, owned), incarnation)
                return
            if ledger.failed:
                self.to_broker(broker, lambda: self.append_failed(broker, owned, op), incarnation)
                return
            ledger.entries[entry] = (producer.name, seq)
            self.to_broker(broker, lambda: self.stored(owned, op), incarnation)

        self.at(self.delay(), append)
        if self.rnd.random() < 0.08:
            self.roll(broker, owned)

    def roll(self, broker: Broker, owned: Owned) -> None:
        """A new ledger by CAS of the list, served from now on (the old one is closed
        once its entries are in: readers read an unclosed one to what is stored)."""
        if self.list[-1] != owned.writer:  # the list moved on without it: fenced
            self.fenced(broker, owned)
            return
        owned.writer = self.new_ledger()
        self.log(f"{broker.id} rolls to ledger {owned.writer}")

    def new_ledger(self) -> int:
        """A new ledger, appended to the list (a CAS: the list's version moves)."""
        self.ledgers.append(Ledger())
        self.list.append(len(self.ledgers) - 1)
        self.list_version += 1
        return self.list[-1]

    def stored(self, owned: Owned, op: int) -> None:
        """The ledger stored append `op`: acknowledged once every one before it is."""
        if owned.gone:
            return
        owned.confirmed.add(op)
        self.settle(owned)

    def settle(self, owned: Owned) -> None:
        while owned.acked_upto in owned.confirmed or owned.acked_upto in owned.failed:
            op = owned.acked_upto
            owned.acked_upto += 1
            producer, seq, _ = owned.pending.pop(op)
            if op in owned.failed:
                owned.failed.discard(op)
                continue
            owned.confirmed.discard(op)
            owned.durable[producer.name] = max(owned.durable.get(producer.name, -1), seq)
            self.receipt(producer, seq)
        broker = next((b for b in self.brokers if b.owned is owned), None)
        if owned.held and not owned.pending and broker is not None:
            held, owned.held = owned.held, []  # (the old ledger's entries are in)
            for producer, seq in held:
                self.append(broker, owned, producer, seq)

    def append_failed(self, broker: Broker, owned: Owned, op: int) -> None:
        """An append failed, not fenced: the ledger ran out of bookies."""
        if owned.gone or broker.owned is not owned or op not in owned.pending:
            return  # (or failed already, with its ledger)
        ledger_no = owned.pending[op][2]
        fail_stop = self.mutation != "replace_failed_ledger"
        if gives_up_on_failure(fenced=False, fail_stop=fail_stop):
            self.log(f"{broker.id}: ledger {ledger_no} failed, gives the stream up")
            self.give_up(broker)
            return
        # (A writer that is not fail-stop: the failed appends fail, the ledger is closed
        # where it stands and replaced, and appends go on to the replacement.)
        owned.failed.update(o for o, (_, _, no) in owned.pending.items() if no == ledger_no)
        if self.ledgers[ledger_no].length is None:
            self.ledgers[ledger_no].length = self.ledgers[ledger_no].prefix()
        if owned.writer == ledger_no:
            self.roll(broker, owned)
        self.settle(owned)

    def fenced(self, broker: Broker, owned: Owned) -> None:
        if not owned.gone and broker.owned is owned:
            self.log(f"{broker.id}: fenced, gives the stream up")
            self.give_up(broker)

    def receipt(self, producer: Producer, seq: int) -> None:
        def arrive() -> None:
            if seq not in producer.acked:
                producer.acked.add(seq)
                producer.last_progress = self.now
            if seq in producer.unacked:
                producer.unacked.remove(seq)

        self.at(self.delay(), arrive)

    # -- producers ----------------------------------------------------------------------------

    def producer(self, name: str) -> Producer:
        return next(p for p in self.producers if p.name == name)

    def publish(self, producer: Producer) -> None:
        if producer.next_seq < MESSAGES:
            seq = producer.next_seq
            producer.next_seq += 1
            producer.unacked.append(seq)
            broker = producer.broker
            if broker is not None:
                self.to_broker(broker, lambda: self.send(broker, producer, seq),
                               broker.incarnation)  # fmt: skip
            self.at(self.rnd.randint(1, 6), lambda: self.publish(producer))

    def connect(self, producer: Producer) -> None:
        """Look the stream up through a broker, then open there."""
        stalled = producer.unacked and self.now - producer.last_progress > 25
        if producer.broker is not None and stalled:
            producer.broker = None  # (keepalive: a broker that stopped answering)
        if producer.broker is None and not producer.connecting:
            up = [b for b in self.brokers if b.state in ("up", "paused")]
            if up:
                asked = self.rnd.choice(up)
                producer.connecting = True
                producer.last_progress = self.now

                def answered(owner: Broker | None) -> None:
                    if owner is None:
                        producer.connecting = False
                        return
                    self.to_broker(owner, lambda: self.open_producer(owner, producer),
                                   owner.incarnation)  # fmt: skip

                def looked_up() -> None:
                    self.lookup(asked, answered)

                def lost() -> None:
                    producer.connecting = False

                self.to_broker(asked, looked_up, asked.incarnation)
                self.at(40, lost)  # (an answer that never came: try again)
        if self.now < DEADLINE:
            self.at(3, lambda: self.connect(producer))

    # -- faults ---------------------------------------------------------------------------

    def fault(self) -> None:
        broker = self.rnd.choice(self.brokers)
        kinds = ("kill", "pause", "cut", "reject", "reject", "kill", "pause", "ledger", "ledger")
        kind = self.rnd.choice(kinds)
        if kind == "ledger":  # one of the last two ledgers runs out of bookies for good
            no = self.rnd.choice(self.list[-2:])
            self.log(f"ledger {no} fails")
            self.ledgers[no].failed = True
        elif broker.state != "up":
            pass
        elif kind == "kill":
            self.log(f"kill {broker.id}.{broker.incarnation}")
            broker.state = "dead"
            self.at(self.rnd.randint(2, 40), lambda: self.start_broker(broker))
        elif kind in ("pause", "cut"):
            self.log(f"{kind} {broker.id}")
            broker.state = "paused" if kind == "pause" else "cut"
            self.at(self.rnd.randint(5, 3 * SESSION), lambda: self.resume(broker))
        else:
            self.log(f"a firewall rejects connections to {broker.id}")
            broker.rejecting = True
            self.at(self.rnd.randint(5, 60), lambda: setattr(broker, "rejecting", False))
        if self.now < FAULT_UNTIL:
            self.at(self.rnd.randint(10, 60), self.fault)

    def resume(self, broker: Broker) -> None:
        if broker.state in ("paused", "cut"):
            self.log(f"resume {broker.id}")
            broker.state = "up"
            held, broker.held = broker.held, []
            for event in held:  # (what came while it was stopped, before its heartbeat)
                event()

    def beats(self) -> None:
        for broker in self.brokers:
            self.heartbeat(broker)
        if self.now < DEADLINE:
            self.at(HEARTBEAT, self.beats)

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> ServiceScenario:
        self.at(1, self.beats)
        self.at(self.rnd.randint(5, 30), self.fault)
        for producer in self.producers:
            self.at(1, lambda p=producer: self.connect(p))
            self.at(2, lambda p=producer: self.publish(p))
        while self._queue:
            self.now, _, event = heapq.heappop(self._queue)
            if self.now > DEADLINE:
                break
            event()
            if self.now > FAULT_UNTIL and all(len(p.acked) == MESSAGES for p in self.producers):
                break
        self.check()
        return self

    def stored_seqs(self) -> dict[str, int]:
        highest: dict[str, int] = {}
        for name, seq in self.read():
            highest[name] = max(highest.get(name, -1), seq)
        return highest

    def read(self) -> list[tuple[str, int]]:
        """The stream as a reader sees it: each ledger to its close (the last one to
        what is stored)."""
        found = []
        for no in self.list:
            ledger = self.ledgers[no]
            length = ledger.prefix() if ledger.length is None else ledger.length
            found += [ledger.entries[i] for i in range(length)]
        return found

    def check(self) -> None:
        for ledger in self.ledgers:  # (the final reader recovers, as a next owner would)
            ledger.fenced = True
        stream = self.read()
        for producer in self.producers:
            mine = [seq for name, seq in stream if name == producer.name]
            if len(mine) != len(set(mine)):
                raise InvariantViolation(f"{producer.name}: stored twice: {mine}")
            if mine != sorted(mine):
                raise InvariantViolation(f"{producer.name}: out of order: {mine}")
            lost = sorted(producer.acked - set(mine))
            if lost:
                raise InvariantViolation(
                    f"{producer.name}: acknowledged, not in the stream: {lost}"
                )
            if len(producer.acked) != MESSAGES:
                raise InvariantViolation(
                    f"{producer.name}: not live: {len(producer.acked)} of {MESSAGES} "
                    f"acknowledged by tick {self.now}"
                )


def run_service_seed(seed: int, mutation: str = "none") -> ServiceScenario:
    scenario = ServiceScenario(seed, mutation)
    try:
        return scenario.run()
    except InvariantViolation as violation:
        flags = "--service" + (f" --service-mutation {mutation}" if mutation != "none" else "")
        raise InvariantViolation(
            f"seed {seed} (service): {violation}\n"
            f"replay: python -m tests.sim {flags} --seed {seed}\n"
            + "\n".join(scenario.trace[-150:])
        ) from None
