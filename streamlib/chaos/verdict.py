"""The verdict of a `streamlib chaos` run, in either mode: what the histories of its
producers, consumers and readers say about safety (lost / duplicated / reordered /
misplaced messages) and liveness (failed sends, unavailability, recovery after healing).

Pure: histories in, a Verdict out (producer_run, deliveries and errors_of turn the
events of the workers' logs, streamlib.chaos.events, into histories; reading the files
is the caller's). The definitions, per stream:

- acknowledged: a send whose future gave a message id (the producer logged it).
  A failed or unanswered send may or may not be in the stream: never a violation.
- lost: acknowledged, but never read by the reader (which reads the stream once from
  EARLIEST; in a run with no reader beside the faults, as broker mode, the final scan
  is the reader) or never received by the consumers (in any of their sessions).
- misplaced: acknowledged with one message id, read under another. (A broker answers
  a duplicate too old to remember where it went with EARLIEST: that one has no place.)
- duplicated: the reader read the same message id or payload twice; or one consumer
  session received the same one twice. The same message received again by a later
  session (after a consumer crash or resubscription) is "redelivered": at-least-once.
- reordered: a message id not above the previous one read (the reader; each consumer
  session); or, among one producer's messages (its payload names it and its sequence
  number), a sequence number below one read before it.
- A shared subscription (broker mode's consumers) promises neither order nor one
  delivery a session: its receipts are checked for loss and place only, and every
  receipt of a message received before is a redelivery.
- unavailability of a producer incarnation: from its start, or from the first failed
  attempt after an acknowledgement, to its next acknowledgement (or its last event).
  (A duel's loser is unavailable by design; the stream's own figure is the longest
  stretch in which no producer had a send acknowledged.)
- recovered after heal: the producer left running at the heal had a send acknowledged
  after it (None: the run had no heal).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from streamlib.chaos.events import producer_and_seq

MessageKey = tuple[int, int, int]
SAMPLES = 5  # examples of each violation kept in the verdict


def parse_id(text: str) -> MessageKey:
    ledger_id, entry_id, batch_index = (int(part) for part in text.split(":"))
    return ledger_id, entry_id, batch_index


NOWHERE: MessageKey = (-1, -1, -1)  # EARLIEST: an acknowledgement without a position


@dataclass(frozen=True)
class Ack:
    incarnation: int
    seq: int
    payload: str
    message_id: MessageKey
    t: float


@dataclass(frozen=True)
class Failure:
    """A send (or, with send=False, a takeover) that did not succeed by time t;
    `sent` is when it was attempted."""

    sent: float
    t: float
    error: str
    send: bool = True


@dataclass(frozen=True)
class Delivery:
    """One message read (reader) or received (consumer); `session` tells consumer
    sessions apart: messages again in a later session are redeliveries."""

    session: str
    message_id: MessageKey
    payload: str


@dataclass(frozen=True)
class Finding:
    """One violation: the payload it concerns and what was wrong."""

    payload: str
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class ProducerRun:
    incarnation: int
    started: float
    ended: float
    acks: list[Ack] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)


@dataclass
class StreamHistory:
    producers: list[ProducerRun] = field(default_factory=list)
    reads: list[Delivery] | None = None  # None: no reader ran beside the faults
    receipts: list[Delivery] = field(default_factory=list)
    scan: list[Delivery] | None = None  # a fresh read from EARLIEST once all stopped
    consumer_type: str = "failover"  # of the consumers' subscription
    final_producer: int | None = None  # the incarnation left running by the heal
    errors: dict[str, list[str]] = field(default_factory=dict)  # role -> error texts
    tracebacks: dict[str, str] = field(default_factory=dict)  # role -> the first one


@dataclass
class StreamVerdict:
    acknowledged: int
    failed_sends: int
    lost_by_reader: list[str]
    lost_by_consumer: list[str]
    lost_in_scan: list[str] | None
    misplaced: list[Finding]
    duplicated: list[Finding]
    redelivered: int
    reordered: list[Finding]
    unacknowledged_read: int
    longest_unavailable_s: float  # of one producer incarnation
    longest_unavailable_incarnation: int | None
    longest_without_ack_s: float  # of the stream: no producer had an acknowledgement
    recovered_after_heal: bool | None
    errors: dict[str, int]
    error_samples: dict[str, list[str]]
    first_tracebacks: dict[str, str]

    @property
    def lost(self) -> set[str]:
        return set(self.lost_by_reader) | set(self.lost_by_consumer)

    def to_json(self) -> dict[str, Any]:
        def sample(items: list[str] | list[Finding]) -> dict[str, Any]:
            return {"count": len(items), "examples": [str(item) for item in items[:SAMPLES]]}

        return {
            "acknowledged": self.acknowledged,
            "failed_sends": self.failed_sends,
            "lost_by_reader": sample(self.lost_by_reader),
            "lost_by_consumer": sample(self.lost_by_consumer),
            "lost_in_final_scan": None if self.lost_in_scan is None else sample(self.lost_in_scan),
            "misplaced": sample(self.misplaced),
            "duplicated": sample(self.duplicated),
            "redelivered": self.redelivered,
            "reordered": sample(self.reordered),
            "unacknowledged_read": self.unacknowledged_read,
            "longest_unavailable_s": round(self.longest_unavailable_s, 3),
            "longest_unavailable_incarnation": self.longest_unavailable_incarnation,
            "longest_without_ack_s": round(self.longest_without_ack_s, 3),
            "recovered_after_heal": self.recovered_after_heal,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "first_tracebacks": self.first_tracebacks,
        }


@dataclass
class Verdict:
    streams: dict[str, StreamVerdict]

    @property
    def lost(self) -> int:
        return sum(len(v.lost) for v in self.streams.values())

    @property
    def lost_in_scan(self) -> int | None:
        """Acknowledged messages a fresh reader did not find either (None: no scan): what
        is lost but not lost here was in the stream, a reader or consumer stalled."""
        scans = [v.lost_in_scan for v in self.streams.values()]
        return None if None in scans else sum(len(s or ()) for s in scans)

    @property
    def duplicated(self) -> int:
        return sum(len(v.duplicated) for v in self.streams.values())

    @property
    def reordered(self) -> int:
        return sum(len(v.reordered) for v in self.streams.values())

    @property
    def misplaced(self) -> int:
        return sum(len(v.misplaced) for v in self.streams.values())

    @property
    def never_recovered(self) -> list[str]:
        return sorted(name for name, v in self.streams.items() if v.recovered_after_heal is False)

    @property
    def safe(self) -> bool:
        return self.lost == self.duplicated == self.reordered == self.misplaced == 0

    @property
    def ok(self) -> bool:
        return self.safe and not self.never_recovered

    def to_json(self) -> dict[str, Any]:
        streams = self.streams.values()
        return {
            "ok": self.ok,
            "safe": self.safe,
            "acknowledged": sum(v.acknowledged for v in streams),
            "lost": self.lost,
            "lost_in_final_scan": self.lost_in_scan,
            "duplicated": self.duplicated,
            "reordered": self.reordered,
            "misplaced": self.misplaced,
            "redelivered": sum(v.redelivered for v in streams),
            "failed_sends": sum(v.failed_sends for v in streams),
            "longest_unavailable_s": {
                name: round(v.longest_unavailable_s, 3) for name, v in self.streams.items()
            },
            "longest_without_ack_s": {
                name: round(v.longest_without_ack_s, 3) for name, v in self.streams.items()
            },
            "never_recovered": self.never_recovered,
            "streams": {name: v.to_json() for name, v in self.streams.items()},
        }


# -- the checks -------------------------------------------------------------------------


def lost(acks: Iterable[Ack], deliveries: Iterable[Delivery]) -> list[str]:
    """Acknowledged payloads never delivered, in acknowledgement order."""
    seen = {d.payload for d in deliveries}
    return [a.payload for a in acks if a.payload not in seen]


def misplaced(acks: Iterable[Ack], deliveries: Iterable[Delivery]) -> list[Finding]:
    """Acknowledged payloads delivered under another message id than acknowledged."""
    where = {a.payload: a.message_id for a in acks if a.message_id != NOWHERE}
    found = []
    for d in deliveries:
        acked_at = where.get(d.payload)
        if acked_at is not None and acked_at != d.message_id:
            why = f"acknowledged as {_id(acked_at)}, read as {_id(d.message_id)}"
            found.append(Finding(d.payload, f"{d.payload} {why}"))
    return found


def duplicates(deliveries: Iterable[Delivery]) -> list[Finding]:
    """Deliveries whose message id or payload came before in the same session."""
    ids: dict[str, set[MessageKey]] = {}
    payloads: dict[str, set[str]] = {}
    found = []
    for d in deliveries:
        session_ids = ids.setdefault(d.session, set())
        session_payloads = payloads.setdefault(d.session, set())
        if d.message_id in session_ids or d.payload in session_payloads:
            found.append(
                Finding(d.payload, f"{d.payload} at {_id(d.message_id)} (session {d.session})")
            )
        session_ids.add(d.message_id)
        session_payloads.add(d.payload)
    return found


def redeliveries(deliveries: Iterable[Delivery], once_a_session: bool = True) -> int:
    """Deliveries of a payload received before: by an earlier session (the first time
    in this one), or, where a session may receive one twice (once_a_session False: a
    shared subscription), at all."""
    sessions_of: dict[str, set[str]] = {}
    count = 0
    for d in deliveries:
        sessions = sessions_of.setdefault(d.payload, set())
        if sessions and not (once_a_session and d.session in sessions):
            count += 1
        sessions.add(d.session)
    return count


def reorderings(deliveries: Iterable[Delivery]) -> list[Finding]:
    """Per session: ids below the highest id delivered before; a producer's messages
    below a sequence number of its delivered before. (Equal ones are duplicates,
    counted by duplicates().)"""
    highest_id: dict[str, MessageKey] = {}
    highest_seq: dict[tuple[str, str], int] = {}
    found = []
    for d in deliveries:
        why = []
        top = highest_id.get(d.session)
        if top is not None and d.message_id < top:
            why.append(f"id {_id(d.message_id)} after {_id(top)}")
        highest_id[d.session] = max(top, d.message_id) if top is not None else d.message_id
        sent = producer_and_seq(d.payload)
        if sent is not None:
            producer, seq = sent
            key = (d.session, producer)
            before = highest_seq.get(key)
            if before is not None and seq < before:
                why.append(f"seq {seq} after {producer}-{before}")
            highest_seq[key] = max(before, seq) if before is not None else seq
        if why:
            found.append(Finding(d.payload, f"{d.payload}: {'; '.join(why)} (session {d.session})"))
    return found


def unavailable_intervals(run: ProducerRun) -> list[tuple[float, float]]:
    """(from, to) spans in which the incarnation had no send acknowledged: from its
    start or its first failure after an acknowledgement, to the next acknowledgement
    or, if none came, its last event."""
    intervals, still_down = _down(run)
    return [*intervals, (still_down, max(still_down, run.ended))] if still_down else intervals


def _down(run: ProducerRun) -> tuple[list[tuple[float, float]], float | None]:
    """The spans ended by an acknowledgement, and when the open one began (if any)."""
    timeline: list[tuple[float, int, float]] = [(a.t, 1, a.t) for a in run.acks]
    timeline += [(f.t, 0, f.sent) for f in run.failures]
    timeline.sort()
    intervals = []
    down_since: float | None = run.started
    last_ack = run.started
    for t, is_ack, began in timeline:
        if is_ack:
            if down_since is not None:
                intervals.append((down_since, t))
            down_since, last_ack = None, t
        elif down_since is None:
            down_since = max(began, last_ack)
    return intervals, down_since


def longest_without_ack(runs: list[ProducerRun]) -> float:
    """The longest stretch in which no producer of the stream had a send acknowledged:
    between acknowledgements, from the first start, and up to the end of a producer
    that was still failing when it ended (not after one that stopped cleanly)."""
    if not runs:
        return 0.0
    points = [min(r.started for r in runs), *(a.t for r in runs for a in r.acks)]
    points += [r.ended for r in runs if _down(r)[1] is not None]
    points.sort()
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)


def recovered_after(history: StreamHistory, healed_at: float | None) -> bool | None:
    if healed_at is None:
        return None
    for run in history.producers:
        if run.incarnation == history.final_producer:
            return any(a.t >= healed_at for a in run.acks)
    return False


def judge_stream(history: StreamHistory, healed_at: float | None) -> StreamVerdict:
    acks = [a for run in history.producers for a in run.acks]
    acked = {a.payload for a in acks}
    reads = history.reads if history.reads is not None else history.scan or []
    # Each session once and in order: what every subscription but a shared one promises.
    once_a_session = history.consumer_type != "shared"
    ordered = history.receipts if once_a_session else []
    spans = [
        (end - start, run.incarnation)
        for run in history.producers
        for start, end in unavailable_intervals(run)
    ]
    longest, incarnation = max(spans, default=(0.0, None))
    return StreamVerdict(
        acknowledged=len(acks),
        failed_sends=sum(1 for run in history.producers for f in run.failures if f.send),
        lost_by_reader=lost(acks, reads),
        lost_by_consumer=lost(acks, history.receipts),
        lost_in_scan=None if history.scan is None else lost(acks, history.scan),
        misplaced=misplaced(acks, [*reads, *history.receipts]),
        duplicated=duplicates(reads) + duplicates(ordered),
        redelivered=redeliveries(history.receipts, once_a_session),
        reordered=reorderings(reads) + reorderings(ordered),
        unacknowledged_read=len({d.payload for d in reads} - acked),
        longest_unavailable_s=longest,
        longest_unavailable_incarnation=incarnation,
        longest_without_ack_s=longest_without_ack(history.producers),
        recovered_after_heal=recovered_after(history, healed_at),
        errors={role: len(texts) for role, texts in history.errors.items()},
        error_samples={role: _distinct(texts) for role, texts in history.errors.items()},
        first_tracebacks=dict(history.tracebacks),
    )


def judge(histories: dict[str, StreamHistory], healed_at: float | None) -> Verdict:
    return Verdict({name: judge_stream(h, healed_at) for name, h in histories.items()})


# -- from the workers' event logs -------------------------------------------------------


def producer_run(incarnation: int, events: list[dict[str, Any]]) -> ProducerRun:
    """A producer incarnation from its log: "ack" (seq, payload, id), "fail" (sent,
    error; seq -1 for a takeover that failed); any event moves its end."""
    times = [e["t"] for e in events] or [0.0]
    run = ProducerRun(incarnation, started=times[0], ended=max(times))
    for e in events:
        if e["ev"] == "ack":
            run.acks.append(Ack(incarnation, e["seq"], e["payload"], parse_id(e["id"]), e["t"]))
        elif e["ev"] == "fail":
            run.failures.append(Failure(e["sent"], e["t"], e["error"], send=e["seq"] >= 0))
    return run


def deliveries(events: Iterable[dict[str, Any]], default_session: str) -> list[Delivery]:
    """The "msg" events of a reader or consumer log (consumers tag them by session)."""
    return [
        Delivery(e.get("session", default_session), parse_id(e["id"]), e["payload"])
        for e in events
        if e["ev"] == "msg"
    ]


def errors_of(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Errors a worker met and went on from: its "error" events (error, traceback) and
    its "close_failed" ones (a producer, consumer or reader that did not close)."""
    return [e for e in events if e["ev"] in ("error", "close_failed")]


def _id(key: MessageKey) -> str:
    return ":".join(str(part) for part in key)


def _distinct(texts: list[str], limit: int = 3) -> list[str]:
    seen: list[str] = []
    for text in texts:
        if text[:300] not in seen:
            seen.append(text[:300])
        if len(seen) >= limit:
            break
    return seen
