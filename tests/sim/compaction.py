"""Compaction in the simulator: a stream written as a changelog, compacted by compactors
that race, die and are stopped at any step, trimmed by retention (``compacted``, or none),
swept of leaked view ledgers, and read compacted by readers and durable cursors that start
anywhere -- with every decision taken by the REAL rules of streamlib.protocol.compaction
(LatestByKey, kept_indexes, kept_runs, horizon_of, may_install, reads_view,
first_index_after, retention_marks, backlog_bytes, should_compact) and
stream_rules.retention_plan. The rest is a model of the I/O of
streamlib/stream/compaction.py (the Compactor), streamlib/stream/compacted.py (the
CompactedScanner) and StreamManager.sweep, step for step: a compaction reads "installed
view + stream after its horizon" twice, through the same compacted reading as a reader.

The model: one stream, a list of ledgers of entries; an entry is a batch of messages (a
key or none; an empty value is a tombstone) or one piece of a chunked message (its pieces
are consecutive entries; the producer may give one up and start it again). Ledgers roll;
the last one is open; a new writer taking the stream over closes its ledger as it is,
maybe empty. Storage and metadata are linearizable: an append, a CAS, a delete each take
one step, and every actor (the writer, compactors, retention, the sweeper, cursors,
readers) takes one step at a time in a seeded order.

Compactors (Compactor.compact): one per stream -- the first creates the ephemeral node
``<stream>/compactor`` (another finding it refuses: CompactionInProgressError), writes
its ledger's id into it right after creating the ledger, and deletes the node however it
ends. A compactor dies at a named step (on_step's) or is stopped for a while (mostly at a
named step); a dead one's session, and a stopped one's when stopped for longer than
SESSION steps, expires SESSION steps on: its ephemeral node goes. A stopped compactor
resumes where it was, on a new session (the store replaces a lost one), outliving its
node. The install is one transaction: the view ledger's metadata still there + the CAS
(CompactionSupersededError otherwise). The sweeper (StreamManager.sweep) reads the
streams' views, then, a ledger at a time, reads the ledger's metadata and the compactor
node, and deletes a view ledger that is not the view it read, older than the grace, and
not the one the compactor node names. Compacted reading (CompactedScanner): a reader in
the stream reads a newer view only when ledgers it would have read were deleted under it
(see stream_batches), or a read fails for want of a ledger.

The model found bugs in streamlib that these invariants catch (FIXES: each, the failure,
the fix the model assumes). It models streamlib with those fixes unless told to take a
bug as streamlib has it (``as_is``; ``--compaction-as-is BUG`` on the command line):
tests/sim/test_compaction.py pins a seed that breaks an invariant for each. Once
streamlib is fixed, its bug leaves FIXES and the model takes the fixed code as it is.

Invariants, checked after every step:
- the installed view names a ledger that exists and is closed;
- the view holds exactly the latest message of each key up to its horizon, tombstones and
  keyless messages left out, chunked messages whole, in stream order; a view installed
  has a horizon past the one it replaces (each is built on the one installed);
- no stream ledger a durable cursor still needs is deleted: an uncompacted cursor needs
  what follows its mark-delete, one that reads compacted what follows max(mark, horizon),
  and the horizon itself holds what follows it;
- one compactor at a time: never two compactors whose sessions are alive past the lock;
- the sweeper never deletes the ledger a compactor whose session is alive has named
  (however slow the compaction: the grace is no bound on it);
- a compacted reader delivers messages of the stream, in increasing positions (never a
  value older than one it saw), never needs a ledger that is gone (unless a newer view
  passed it), and whenever it reads the stream after the view it has, for every key whose
  latest message up to there is after its start and is a value, exactly that value
  (so a reader from EARLIEST, caught up at the end, has every key's latest value);
- a compacted reader sees every tombstone after the position where it began reading the
  stream: with retention that deletes nothing, ever since it first did (its ledgers are
  all there: it never goes back to the view); with retention ``compacted``, since it last
  did (it goes back to a newer view only when ledgers it would have read were deleted).

So a reader that lags behind a compaction can still miss a deletion when retention
``compacted`` deleted its ledgers (the tombstone compacted out of the stretch between
its position and the new horizon), or while it reads a view a newer one replaces: that
is counted (``missed_deletions``), not a violation -- as Pulsar's compacted readers.

Mutations (each must be caught): ``install_without_check`` (may_install skipped),
``keep_tombstones`` (phase one keeps a tombstone as a value), ``retention_ignores_cursors``
(retention marks without the durable cursors), ``reader_ignores_new_view`` (compacted
reading never looks at the view again once in the stream: a ledger retention deleted is
skipped as a plain scanner skips it, and a read that fails is an error),
``horizon_splits_chunk`` (horizon_of ignores an unfinished chunked message),
``delete_before_install`` (the previous view's ledger goes before the CAS),
``sweeper_ignores_compactor`` (the sweeper deletes a live compactor's ledger),
``install_without_ledger_check`` (the install's transaction without the ledger's check),
``reader_switches_eagerly`` (a reader in the stream reads a newer view at every ledger
it moves to once the horizon passed it, as before e0ac7ae) and ``no_compactor_lock`` (a
compactor goes on when another holds the node).

(Over 600 lines: the model of the compactor and of compacted reading is held to the
invariants in the same file, as tests/sim/service.py does for brokers.)
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

from streamlib.protocol import compaction as rules
from streamlib.protocol.compaction import (
    KeptMessages,
    LatestByKey,
    Position,
    Run,
    backlog_bytes,
    first_index_after,
    kept_indexes,
    kept_runs,
    reads_view,
    retention_marks,
    should_compact,
)
from streamlib.protocol.stream_rules import LedgerSpan, RetentionPolicy, retention_plan
from tests.sim.scenario import InvariantViolation

MUTATIONS = (
    "none",
    "install_without_check",
    "keep_tombstones",
    "retention_ignores_cursors",
    "reader_ignores_new_view",
    "horizon_splits_chunk",
    "delete_before_install",
    "sweeper_ignores_compactor",
    "install_without_ledger_check",
    "reader_switches_eagerly",
    "no_compactor_lock",
)
EARLIEST: Position = (-1, -1, -1)
STEPS = 500  # steps with the writer writing; then the others finish
CRASH = 0.1  # a compactor dies at a named step (on_step's) with this probability
STOP_NAMED, STOP = 0.1, 0.005  # it is stopped (a pause) at a named step, at another step
STOPPED = 150  # ... for 1..STOPPED steps
SESSION = 20  # steps: the session of a client dead, or stopped, this long expires
COMPACTOR_WEIGHT = 8.0  # (its share of the steps: the writer 5.0, a reader 2.0)
GRACES = (30, 100, 300)  # steps: the sweeper's grace (a seed picks one unless given)
COMPACTED = RetentionPolicy(compacted=True)
UNLIMITED = RetentionPolicy()  # (retention that deletes nothing)
# Bugs this model found in streamlib's first compaction code, each fixed since (the fix
# is what the model does; run_compaction_seed's as_is models the code as it was, and the
# tests pin a seed where each breaks an invariant):
FIXES = {
    # Compactor.compact sets and deletes <stream>/compactor with no version: one that
    # outlived its session overwrites, then deletes, the node of the compactor that took
    # it since -- two compactors at once, and a live one's ledger left to the sweeper.
    # Fixed: a compactor writes and deletes the node only while it is the one it made.
    "own_node": "a compactor touches only its own node",
    # StreamManager.sweep reads the streams' views once, before it goes through the
    # ledgers, and deletes a view ledger with no check: a view installed meanwhile (by a
    # compactor that outlived its node, or one that installed and deleted its node
    # between that read and the sweeper's read of the node) loses its ledger.
    # Fixed: the sweeper deletes a view ledger in one transaction with a CheckVersion of
    # the stream's metadata as it read it after the node (changed: not deleted now).
    "sweep_checks_stream": "the sweeper's delete checks the stream did not change",
    # CompactedScanner._stream_batches takes a known ledger between the last one read and
    # the next for deleted without looking whether it is still listed: an empty ledger
    # (one a new writer's takeover closed before anything was written to it) sends a
    # reader whose ledgers are all there to a newer view -- and past the tombstones
    # compacted out of it, retention deleting nothing.
    # Fixed: a known ledger it passed counts only when it is no longer listed.
    "skipped_unlisted": "a ledger passed counts as deleted only when it is not listed",
    # CompactedScanner._stream_batches looks at the last ledger it read only when it is
    # "known" (listed >= its position when it began): one rolled in after that (a
    # tailing reader's), or its own ledger deleted before that list was read (retention
    # under a newer view, as the reader finished the view), is never missed -- it reads
    # on from the first ledger left, and the latest values in between are lost to it.
    # Fixed: the last ledger read (at first, its own) counts when no longer listed, known
    # or not (retention deletes a prefix of the list: a ledger gone after it means it
    # is gone too).
    "last_ledger_listed": "the last ledger read counts when not listed, known or not",
}


@dataclass(frozen=True)
class Message:
    key: str | None
    value: str  # "" is a tombstone


@dataclass(frozen=True)
class Piece:
    uuid: int
    index: int
    count: int


@dataclass(frozen=True)
class Entry:
    """A stream entry: a batch, or one piece of a chunked message (one message: its part
    of the value, with the message's key)."""

    messages: tuple[Message, ...]
    piece: Piece | None = None


@dataclass(frozen=True)
class Compacted:
    """An entry of a view's ledger (envelope.CompactedEntry): messages first_index.. of
    the stream's entry (ledger_id, entry_id)."""

    ledger_id: int
    entry_id: int
    first_index: int
    entry: Entry  # the messages of the run first_index..


@dataclass
class Batch:
    """EntryMessages: an entry's messages by batch index (None: a placeholder before a
    compacted run), those from `start` on delivered."""

    ledger_id: int
    entry_id: int
    start: int
    messages: tuple[Message | None, ...]
    piece: Piece | None
    previous: Position
    compacted: bool = False

    @property
    def last_id(self) -> Position:
        return (self.ledger_id, self.entry_id, len(self.messages) - 1)

    def message(self, index: int) -> Message:
        found = self.messages[index]
        assert found is not None, "a placeholder read"
        return found


@dataclass(frozen=True)
class View:
    ledger_id: int
    horizon: Position
    entries: int


class ViewGone(Exception):
    """The view's ledger went (a newer view replaced it): look at the view again."""


class LedgerGone(Exception):
    """A stream ledger went while it was read (NoSuchLedgerError)."""


@dataclass
class ReadState:
    """Where a compacted read is: after `after` (the last message read)."""

    who: str
    after: Position
    in_stream: bool = False  # reading the stream after the view it read
    since: Position | None = None  # where it began reading the stream (see the module)


@dataclass
class Reader:
    """A compacted reader (durable: a read_compacted subscription, its mark-delete at the
    last message delivered) with the table of key -> (position, value) it keeps."""

    name: str
    start: Position
    durable: bool
    state: ReadState
    feed: Iterator[Batch | None]
    table: dict[str, tuple[Position, str]] = field(default_factory=dict)
    pieces: list[Batch] = field(default_factory=list)
    last: Position = EARLIEST  # the last message delivered


@dataclass
class Cursor:
    """A durable uncompacted cursor: its mark-delete."""

    name: str
    mark: Position


@dataclass
class Compaction:
    """A compactor at work: its metadata session, whether it took the node, the ledger it
    named there; stopped until a step, its session expiring at a step."""

    name: str
    session: int
    steps: Iterator[str | None] = field(default_factory=lambda: iter(()))
    locked: bool = False  # past the node's create (it compacts)
    owns: int | None = None  # the session that created the node it holds
    named: int | None = None  # the ledger it wrote into the node
    stopped_until: int = -1
    expires_at: int | None = None
    expired: bool = False  # its session expired (it may go on: on a new session)


class CompactionScenario:
    def __init__(
        self,
        seed: int,
        mutation: str = "none",
        sweep_grace: int | None = None,
        as_is: Iterable[str] = (),
    ):
        if mutation not in MUTATIONS:
            raise ValueError(f"unknown mutation {mutation!r}")
        unknown = set(as_is) - set(FIXES)
        if unknown:
            raise ValueError(f"no such assumed fix: {sorted(unknown)}")
        self.seed, self.mutation, self.as_is = seed, mutation, frozenset(as_is)
        self.rnd = random.Random(seed)
        self.sweep_grace = self.rnd.choice(GRACES) if sweep_grace is None else sweep_grace
        # Retention ``compacted`` (deletes below the horizon) or none (deletes nothing).
        self.compacted_retention = self.rnd.random() < 0.5
        self.now = 0
        self.trace: list[str] = []
        self.keys = [chr(ord("a") + i) for i in range(self.rnd.randint(2, 6))]
        self.next_id = 1
        self.entries: dict[int, list[Entry]] = {}  # stream ledgers
        self.sizes: dict[int, int] = {}  # their bytes
        self.view_entries: dict[int, list[Compacted]] = {}  # view ledgers
        self.created: dict[int, int] = {}  # ledger -> the step it was created at
        self.closed: set[int] = set()
        self.deleted: set[int] = set()
        self.trimmed: tuple[int, Position] = (-1, EARLIEST)  # retention's last ledger, message
        self.list: list[int] = []
        self.md_version = 0  # the stream's metadata's version (a write bumps it)
        self.roll()
        self.view: View | None = None
        self.checked_view: int | None = None
        self.horizon: Position | None = None  # the horizon of the view checked last
        # The messages of the stream (a chunked one once whole, at its last piece), and
        # every key's latest message (position, value) after each of them.
        self.positions: list[Position] = []
        self.first_piece: dict[Position, Position] = {}
        self.message_at: dict[Position, Message] = {}
        self.latest: list[dict[str, tuple[Position, str]]] = []
        self.written = 0
        self.chunk: tuple[Piece, str | None, list[str], Position] | None = None
        self.next_uuid = 0
        # The compactor node: (the session that created it, the ledger it names; -1: none).
        self.node: tuple[int, int] | None = None
        self.next_session = 1
        self.compactions: list[Compaction] = []  # at work (or stopped)
        self.dead: list[Compaction] = []  # died; their sessions not expired yet
        self.compaction_no = 0
        self.sweeper: Iterator[None] | None = None
        self.threshold = self.rnd.choice((0, 30, 80))
        self.cursors = [Cursor(f"u{i}", EARLIEST) for i in range(self.rnd.randint(0, 2))]
        self.readers: list[Reader] = []
        self.durable: list[Reader] = []  # (those of them that are durable)
        self.reader_no = 0
        self.missed: set[tuple[str, str, Position]] = set()  # reader, key, tombstone
        self.passed = 0  # readers in the stream a view installed passed (they lag behind)
        self.installs = self.crashes = self.superseded = self.refused = self.swept = 0
        # The rules, mutated here (never in streamlib) for the mutations.
        self.may_install: Callable[[int | None, int | None], bool] = rules.may_install
        self.horizon_of: Callable[[Position, Position | None], Position] = rules.horizon_of
        self.latest_by_key: Callable[[], LatestByKey] = LatestByKey
        if mutation == "install_without_check":
            self.may_install = lambda installed, started_from: True
        elif mutation == "keep_tombstones":
            self.latest_by_key = KeepsTombstones
        elif mutation == "horizon_splits_chunk":
            self.horizon_of = lambda end, unfinished: end
        self.log(
            f"sweep grace {self.sweep_grace}, retention "
            f"{'compacted' if self.compacted_retention else 'none'}"
        )
        for _ in range(self.rnd.randint(0, 2)):
            self.new_reader(durable=True, start=EARLIEST)
        always: list[tuple[float, Callable[[], None]]] = [
            (1.0, partial(self.start_compaction, "by hand")),
            (1.0, self.retention),
            (0.3, partial(self.new_reader, durable=False)),
            (0.1, partial(self.new_reader, durable=True)),
        ]
        writing = [(5.0, self.write), (0.5, self.auditor), (0.2, self.takeover)]
        self.actions = {False: always, True: always + writing}  # (by whether it writes)

    def fixed(self, fix: str) -> bool:
        """Whether the model takes streamlib as fixed for this bug (FIXES)."""
        return fix not in self.as_is

    def log(self, text: str) -> None:
        self.trace.append(f"{self.now:4d} {text}")

    # -- the stream and its writer ------------------------------------------------------

    def new_ledger(self) -> int:
        ledger_id, self.next_id = self.next_id, self.next_id + 1
        self.created[ledger_id] = self.now
        return ledger_id

    def roll(self) -> None:
        if self.list:
            self.closed.add(self.list[-1])
        ledger_id = self.new_ledger()
        self.entries[ledger_id] = []
        self.sizes[ledger_id] = 0
        self.list.append(ledger_id)
        self.md_version += 1
        self.log(f"writer rolls to ledger {ledger_id}")

    def takeover(self) -> None:
        """A new writer takes the stream over: it recovers (closes) the last ledger as it
        is -- empty, when nothing was written to it -- and lists a new one."""
        self.log(
            f"a new writer takes the stream over: ledger {self.list[-1]} closed with "
            f"{len(self.entries[self.list[-1]])} entries"
        )
        self.roll()

    def append(self, entry: Entry) -> Position:
        ledger_id = self.list[-1]
        ledger = self.entries[ledger_id]
        ledger.append(entry)
        self.sizes[ledger_id] += sum(len(m.value) + 1 for m in entry.messages)
        return (ledger_id, len(ledger) - 1, len(entry.messages) - 1)

    def message_written(self, position: Position, message: Message, first: Position) -> None:
        self.positions.append(position)
        self.first_piece[position] = first
        self.message_at[position] = message
        latest = dict(self.latest[-1]) if self.latest else {}
        if message.key is not None:
            latest[message.key] = (position, message.value)
        self.latest.append(latest)

    def value(self) -> str:
        self.written += 1
        return "" if self.rnd.random() < 0.15 else f"v{self.written}"

    def key(self) -> str | None:
        return None if self.rnd.random() < 0.1 else self.rnd.choice(self.keys)

    def write(self) -> None:
        if self.chunk is not None:
            self.write_piece()
        elif self.rnd.random() < 0.15:
            count = self.rnd.randint(2, 3)
            self.written += 1
            empty = self.rnd.random() < 0.1
            parts = ["" if empty else f"c{self.written}.{i}" for i in range(count)]
            self.chunk = (Piece(self.next_uuid, 0, count), self.key(), parts, EARLIEST)
            self.next_uuid += 1
            self.write_piece()
        else:
            messages = tuple(
                Message(self.key(), self.value()) for _ in range(self.rnd.randint(1, 3))
            )
            ledger_id, entry_id, _ = self.append(Entry(messages))
            for i, message in enumerate(messages):
                position = (ledger_id, entry_id, i)
                self.message_written(position, message, position)
            self.log(f"write {ledger_id}:{entry_id} {_show(messages)}")
        if len(self.entries[self.list[-1]]) >= self.rnd.randint(3, 8):
            self.roll()

    def write_piece(self) -> None:
        assert self.chunk is not None
        piece, key, parts, first = self.chunk
        if piece.index > 0 and self.rnd.random() < 0.15:  # the producer goes away...
            self.log(f"writer gives chunked message {piece.uuid} up at piece {piece.index}")
            again = self.rnd.random() < 0.5  # ...and sends it again, or not at all
            self.chunk = (
                (Piece(piece.uuid, 0, piece.count), key, parts, EARLIEST) if again else None
            )
            return
        position = self.append(Entry((Message(key, parts[piece.index]),), piece))
        self.log(f"write {position[0]}:{position[1]} piece {piece.index} of {piece.uuid} {key}")
        if piece.index == 0:
            first = position
        if piece.index + 1 < piece.count:
            self.chunk = (Piece(piece.uuid, piece.index + 1, piece.count), key, parts, first)
            return
        self.chunk = None
        self.message_written(position, Message(key, "".join(parts)), first)

    def end_position(self) -> Position:
        """The stream's last message (EARLIEST: none)."""
        for ledger_id in reversed(self.list):
            if self.entries[ledger_id]:
                return self.last_of(ledger_id)
        return EARLIEST

    def last_of(self, ledger_id: int) -> Position:
        entries = self.entries[ledger_id]
        return (ledger_id, len(entries) - 1, len(entries[-1].messages) - 1)

    def latest_up_to(self, position: Position) -> dict[str, tuple[Position, str]]:
        i = bisect.bisect_right(self.positions, position) - 1
        return self.latest[i] if i >= 0 else {}

    # -- compacted reading (CompactedScanner.batches) ------------------------------------

    def compacted_batches(
        self, state: ReadState, until: Position | None = None, tail: bool = True
    ) -> Iterator[Batch | None]:
        """The view after state.after (when before its horizon), then the stream after
        the horizon; None: a tailing read waits at the end."""
        previous = state.after
        while True:
            view = self.view
            if view is not None and reads_view(state.after, view.horizon):
                state.in_stream = False
                try:
                    for batch in self.view_batches(view, state.after, previous, until):
                        previous = state.after = batch.last_id
                        yield batch
                except ViewGone:
                    self.log(f"{state.who}: view {view.ledger_id} went while read")
                    if self.view == view:  # (_replaced: CompactedViewMissingError)
                        raise InvariantViolation(
                            f"{state.who}: CompactedViewMissingError, the installed view's "
                            f"ledger {view.ledger_id} is gone"
                        ) from None
                    continue
                state.after = max(state.after, view.horizon)
                if until is not None and state.after >= until:
                    return
            state.in_stream = True
            if state.since is None or self.compacted_retention:
                state.since = state.after
            restart = False
            try:
                for found in self.stream_batches(state.after, previous, until, tail):
                    if found is RESTART:
                        self.log(
                            f"{state.who}: ledgers it knew went; a new view passed "
                            f"{_pos(state.after)}"
                        )
                        restart = True
                        break
                    if found is not None:
                        previous = state.after = found.last_id
                    yield found
            except LedgerGone as error:
                newer = self.view
                if (
                    self.mutation == "reader_ignores_new_view"
                    or newer is None
                    or not reads_view(state.after, newer.horizon)
                ):
                    raise InvariantViolation(
                        f"{state.who} after {_pos(state.after)} needs ledger {error}, "
                        f"deleted (view: {newer})"
                    ) from None
                self.log(f"{state.who}: ledger {error} went; a new view passed {_pos(state.after)}")
                restart = True
            if not restart:
                return

    def view_batches(
        self, view: View, after: Position, previous: Position, until: Position | None
    ) -> Iterator[Batch]:
        if view.ledger_id in self.deleted:
            raise ViewGone()
        for stored in list(self.view_entries[view.ledger_id]):
            if view.ledger_id in self.deleted:
                raise ViewGone()
            start = first_index_after(stored.ledger_id, stored.entry_id, stored.first_index, after)
            if start is None:
                continue
            messages = (None,) * stored.first_index + stored.entry.messages
            if start >= len(messages):
                continue
            batch = Batch(
                stored.ledger_id, stored.entry_id, start, messages, stored.entry.piece,
                previous, compacted=True,
            )  # fmt: skip
            if until is not None and batch.last_id > until:
                return
            previous = after = batch.last_id
            yield batch

    def stream_batches(
        self, after: Position, previous: Position, until: Position | None, tail: bool
    ) -> Iterator[Batch | None]:
        """StreamScanner.batches after `after` (the list read at each ledger; a ledger
        gone before it is opened skipped; LedgerGone when an entry read finds it gone),
        as _stream_batches wraps it: the ledgers >= after's listed when it begins are
        "known"; RESTART at a move to a new ledger when ledgers it would have read went
        (passed_at_move) and the view's horizon passed `after`."""
        known = [i for i in self.list if i >= after[0]]
        current = after[0]  # the last ledger read
        finished: int | None = None
        while True:
            ids = list(self.list)
            candidates = [i for i in ids if (i >= after[0] if finished is None else i > finished)]
            if not candidates:
                return  # (the last ledger is never deleted: not reached when tailing)
            ledger_id = candidates[0]
            if ledger_id in self.deleted:  # (open_for_reading: None)
                finished = ledger_id
                continue
            next_entry = max(after[1], 0) if after[0] == ledger_id else 0
            while True:
                entries = self.entries[ledger_id]
                if next_entry >= len(entries):
                    if ledger_id in self.closed:
                        break  # (its last entry known: on, with no read)
                    if not tail:
                        return
                    yield None  # waiting for more (or for the roll's close)
                    continue
                if ledger_id in self.deleted:
                    raise LedgerGone(ledger_id)
                entry = entries[next_entry]
                start = after[2] + 1 if (ledger_id, next_entry) == after[:2] else 0
                next_entry += 1
                if start >= len(entry.messages):
                    continue
                if until is not None and (ledger_id, next_entry - 1) > until[:2]:
                    return
                batch = Batch(
                    ledger_id, next_entry - 1, start, entry.messages, entry.piece, previous
                )
                if ledger_id != current:
                    if self.passed_at_move(after, current, ledger_id, known):
                        yield RESTART
                        return
                    current = ledger_id
                previous = after = batch.last_id
                yield batch
            finished = ledger_id

    def passed_at_move(
        self, after: Position, current: int, ledger_id: int, known: list[int]
    ) -> bool:
        """At a move from ledger `current` (the last one read; at first, the reader's own)
        to `ledger_id`: whether to read a newer view -- the list and the view read again,
        as one metadata read. streamlib: when a known ledger between the two, or the
        last one read if known, is no longer listed; the model assumes FIXES'
        skipped_unlisted and last_ledger_listed."""
        if self.mutation == "reader_ignores_new_view":
            return False
        if self.mutation != "reader_switches_eagerly":
            listed = set(self.list)
            skipped = any(
                current < known_id < ledger_id
                and (known_id not in listed or not self.fixed("skipped_unlisted"))
                for known_id in known
            )
            last = current in known or (current >= 0 and self.fixed("last_ledger_listed"))
            if not skipped and not (last and current not in listed):
                return False
        view = self.view
        return view is not None and reads_view(after, view.horizon)

    # -- the compactor (Compactor.compact) -------------------------------------------------

    def compactor(self, c: Compaction) -> Iterator[str | None]:
        """A compaction; yields at each read or write (None) and at each named step."""
        previous = self.view
        end = self.end_position()
        if end == EARLIEST or (previous is not None and end <= previous.horizon):
            self.log(f"{c.name}: nothing new to compact")
            return
        yield None
        if self.node is not None and self.mutation != "no_compactor_lock":
            self.refused += 1
            self.log(f"{c.name}: refused, the stream is being compacted (node {self.node})")
            return  # CompactionInProgressError: nothing done
        if self.node is None:
            self.node = (c.session, -1)
            c.owns = c.session
        c.locked = True
        self.log(f"{c.name}: holds the compactor node (session {c.session})")
        yield from self.compact(c, previous, end)
        yield None
        c.locked = False  # (finally: the node deleted)
        if self.node is not None and (self.node[0] == c.owns or not self.fixed("own_node")):
            owner = "its" if self.node[0] == c.owns else f"session {self.node[0]}'s"
            self.log(f"{c.name}: deletes the compactor node ({owner})")
            self.node = None

    def compact(self, c: Compaction, previous: View | None, end: Position) -> Iterator[str | None]:
        """Compactor._compact, the node held."""
        name = c.name
        latest = self.latest_by_key()
        pieces: list[Batch] = []
        state = ReadState(f"{name} phase one", EARLIEST)
        for batch in self.compacted_batches(state, until=end, tail=False):
            assert batch is not None
            piece, first = batch.piece, pieces[0].piece if pieces else None
            if first is not None and (
                piece is None or piece.uuid != first.uuid or piece.index != len(pieces)
            ):
                pieces = []  # unfinished: its producer went away mid-message
            if piece is not None:
                if piece.index != len(pieces):
                    continue  # a piece without its start
                pieces.append(batch)
                if len(pieces) == piece.count:
                    whole = "".join(p.message(0).value for p in pieces)
                    entries = [(p.ledger_id, p.entry_id) for p in pieces]
                    latest.observe_chunked(pieces[0].message(0).key, entries, whole == "")
                    pieces = []
            else:
                for index in range(batch.start, len(batch.messages)):
                    message = batch.message(index)
                    position = (batch.ledger_id, batch.entry_id, index)
                    latest.observe(message.key, position, message.value == "")
            yield None
        horizon = self.horizon_of(end, pieces[0].previous if pieces else None)
        self.log(f"{name}: scanned up to {_pos(end)}, horizon {_pos(horizon)}")
        yield "scanned"
        if horizon == EARLIEST or (previous is not None and horizon <= previous.horizon):
            self.log(f"{name}: nothing new before the horizon")
            return
        kept = latest.kept()
        ledger_id = self.new_ledger()
        self.view_entries[ledger_id] = []
        self.log(f"{name}: created view ledger {ledger_id} ({kept.keys} keys)")
        yield None
        node = self.node  # (None: NoNodeError, its session expired and no one holds it)
        if node is None or (node[0] != c.owns and self.fixed("own_node")):
            self.delete(ledger_id, f"{name}: its node is gone; discards its ledger")
            return
        self.node = (node[0], ledger_id)  # (as is: another's node, if another's is there)
        c.named = ledger_id
        self.log(f"{name}: names ledger {ledger_id} in the node of session {node[0]}")
        yield "created"
        yield from self.phase_two(name, ledger_id, horizon, kept)
        yield "written"
        if ledger_id in self.deleted:  # (the close's CAS finds no ledger)
            self.log(f"{name}: its ledger {ledger_id} was swept: the compaction fails")
            return
        self.closed.add(ledger_id)
        yield "closed"
        started_from = None if previous is None else previous.ledger_id
        if self.mutation == "delete_before_install" and previous is not None:
            self.delete(previous.ledger_id, f"{name}: deletes the previous view")
            yield "deleted"
        installed = None if self.view is None else self.view.ledger_id
        if not self.may_install(installed, started_from):
            self.superseded += 1
            self.delete(ledger_id, f"{name}: superseded by view {installed}; discards")
            return
        if ledger_id in self.deleted and self.mutation != "install_without_ledger_check":
            self.swept += 1  # (the transaction's CheckVersion: CompactionSupersededError)
            self.log(f"{name}: its ledger {ledger_id} was swept before the install")
            return
        self.view = View(ledger_id, horizon, len(self.view_entries[ledger_id]))
        self.md_version += 1
        self.installs += 1
        self.passed += sum(r.state.in_stream and r.state.after < horizon for r in self.readers)
        self.log(f"{name}: installed view {ledger_id} up to {_pos(horizon)}")
        yield "installed"
        if previous is not None and self.mutation != "delete_before_install":
            self.delete(previous.ledger_id, f"{name}: deletes the previous view")
        yield "done"

    def phase_two(
        self, name: str, ledger_id: int, horizon: Position, kept: KeptMessages
    ) -> Iterator[None]:
        state = ReadState(f"{name} phase two", EARLIEST)
        for batch in self.compacted_batches(state, until=horizon, tail=False):
            assert batch is not None
            indexes = kept_indexes(
                kept, batch.ledger_id, batch.entry_id, len(batch.messages), batch.piece is not None
            )
            runs = kept_runs(i for i in indexes if i >= batch.start)
            written = [
                Compacted(batch.ledger_id, batch.entry_id, run.first, self.run_of(batch, run))
                for run in runs
            ]
            if written:
                if ledger_id in self.deleted:
                    return  # (an append to a deleted ledger fails)
                self.view_entries[ledger_id] += written
            yield None

    @staticmethod
    def run_of(batch: Batch, run: Run) -> Entry:
        return Entry(tuple(map(batch.message, range(run.first, run.last + 1))), batch.piece)

    def delete(self, ledger_id: int, why: str) -> None:
        self.log(f"{why}: ledger {ledger_id} deleted")
        self.deleted.add(ledger_id)

    # -- retention, the sweeper, cursors, readers ------------------------------------------

    def retention(self) -> None:
        horizon = None if self.view is None else self.view.horizon
        durable = [(c.mark, False) for c in self.cursors]
        durable += [(r.last, True) for r in self.durable]
        if self.mutation == "retention_ignores_cursors":
            durable = []
        marks = retention_marks(durable, horizon)
        spans = [
            LedgerSpan(i, len(self.entries[i]), self.size(i), self.created[i]) for i in self.list
        ]
        policy = COMPACTED if self.compacted_retention else UNLIMITED
        doomed = retention_plan(
            spans, marks, policy, self.now, None if horizon is None else horizon[0]
        )
        self.log(f"retention: marks {marks}, horizon {_pos(horizon)}: deletes {doomed}")
        if doomed:
            self.list = [i for i in self.list if i not in doomed]
            self.md_version += 1
        self.deleted.update(doomed)
        for ledger_id in doomed:  # (the last message retention deleted)
            if self.entries[ledger_id]:
                self.trimmed = (ledger_id, self.last_of(ledger_id))

    def size(self, ledger_id: int) -> int:
        return self.sizes[ledger_id]

    def sweep(self) -> Iterator[None]:
        """StreamManager.sweep of view ledgers: the views read first; then a ledger at a
        time, its metadata and the compactor node read, and a delete (the model assumes
        FIXES' sweep_checks_stream: the stream's metadata read again, and the delete a
        transaction with its CheckVersion)."""
        installed = None if self.view is None else self.view.ledger_id
        cutoff = self.now - self.sweep_grace
        for ledger_id in [i for i in self.view_entries if i not in self.deleted]:
            if ledger_id == installed:
                continue
            yield None
            if ledger_id in self.deleted or self.created[ledger_id] > cutoff:
                continue
            named = self.node is not None and self.node[1] == ledger_id
            if named and self.mutation != "sweeper_ignores_compactor":
                self.log(f"the sweeper leaves ledger {ledger_id} alone: a compactor's")
                continue
            version = self.md_version
            if self.fixed("sweep_checks_stream"):
                yield None  # (the stream's metadata read again)
                version = self.md_version
                if self.view is not None and self.view.ledger_id == ledger_id:
                    continue
            yield None
            if ledger_id in self.deleted:
                continue  # (NoSuchLedgerError: its owner deleted it meanwhile)
            if self.fixed("sweep_checks_stream") and self.md_version != version:
                self.log(f"the sweeper leaves ledger {ledger_id}: the stream changed")
                continue
            for c in self.compactions + self.dead:
                if c.named == ledger_id and not c.expired:
                    raise InvariantViolation(
                        f"the sweeper deletes ledger {ledger_id}, named by {c.name}, "
                        f"whose session {c.session} is alive"
                    )
            self.delete(ledger_id, "the sweeper collects a leak")

    def start_sweep(self) -> None:
        self.log(f"the sweeper starts (grace {self.sweep_grace})")
        self.sweeper = self.sweep()

    def step_sweeper(self) -> None:
        assert self.sweeper is not None
        if next(self.sweeper, "end") == "end":
            self.sweeper = None

    def start_compaction(self, why: str) -> None:
        self.compaction_no += 1
        c = Compaction(f"compactor{self.compaction_no}", self.new_session())
        c.steps = self.compactor(c)
        self.log(f"{c.name} starts ({why})")
        self.compactions.append(c)

    def new_session(self) -> int:
        self.next_session += 1
        return self.next_session - 1

    def step_compaction(self, c: Compaction) -> None:
        try:
            step = next(c.steps)
        except StopIteration:
            self.compactions.remove(c)
            return
        if step is not None and self.rnd.random() < CRASH:
            self.log(f"{c.name} dies after {step}")
            self.crashes += 1
            self.compactions.remove(c)
            c.expires_at = self.now + SESSION
            self.dead.append(c)
        elif self.rnd.random() < (STOP if step is None else STOP_NAMED):
            stopped = self.rnd.randint(1, STOPPED)
            c.stopped_until = self.now + stopped
            if stopped > SESSION:
                c.expires_at = self.now + SESSION
            self.log(f"{c.name} is stopped for {stopped} steps")

    def expire_sessions(self) -> None:
        """The sessions of compactors dead or stopped SESSION steps end: their nodes go."""
        for c in self.compactions + self.dead:
            if c.expires_at is None or c.expires_at > self.now:
                continue
            c.expires_at, c.expired = None, True
            gone = self.node is not None and self.node[0] == c.session
            if gone:
                self.node = None
            self.log(f"{c.name}: session {c.session} expires" + (", its node goes" if gone else ""))
            if c in self.dead:
                self.dead.remove(c)
            else:
                c.session = self.new_session()  # (the store's client goes on with a new one)

    def new_reader(
        self, durable: bool, start: Position | None = None, name: str | None = None
    ) -> None:
        if start is None:
            start = self.random_start()
        if name is None:
            self.reader_no += 1
            name = f"{'c' if durable else 'r'}{self.reader_no}"
        state = ReadState(name, start)
        feed = self.compacted_batches(state)
        reader = Reader(name, start, durable, state, feed, last=start)
        self.readers.append(reader)
        if durable:
            self.durable.append(reader)
        self.log(f"{name} reads compacted after {_pos(start)}")

    def random_start(self) -> Position:
        roll = self.rnd.random()
        view = self.view
        if roll < 0.35 or not self.positions:
            return EARLIEST
        if roll < 0.65 and view is not None and view.ledger_id not in self.deleted:
            stored = self.view_entries[view.ledger_id]
            if stored:
                entry = self.rnd.choice(stored)
                index = entry.first_index + self.rnd.randrange(len(entry.entry.messages))
                return (entry.ledger_id, entry.entry_id, self.rnd.choice((index, -1)))
        if roll < 0.9:
            return self.rnd.choice(self.positions)
        return self.end_position()

    def step_reader(self, reader: Reader) -> None:
        batch = next(reader.feed, None)
        if batch is not None:
            self.take(reader, batch)
        if reader.state.in_stream:
            self.check_table(reader, reader.state.after)

    def take(self, reader: Reader, batch: Batch) -> None:
        """Deliver as the Reader does: a chunked message whole, once its last piece came
        right after the others (pieces without their start dropped)."""
        if reader.pieces:
            first = reader.pieces[0].piece
            assert first is not None
            piece = batch.piece
            if piece is None or piece.uuid != first.uuid or piece.index != len(reader.pieces):
                reader.pieces = []
        if batch.piece is not None:
            if not reader.pieces and batch.piece.index != 0:
                return
            reader.pieces.append(batch)
            if len(reader.pieces) < batch.piece.count:
                return
            whole = "".join(p.message(0).value for p in reader.pieces)
            reader.pieces = []
            self.deliver(reader, batch.last_id, Message(batch.message(0).key, whole))
            return
        for index in range(batch.start, len(batch.messages)):
            self.deliver(reader, (batch.ledger_id, batch.entry_id, index), batch.message(index))

    def deliver(self, reader: Reader, position: Position, message: Message) -> None:
        if position <= reader.last:
            raise InvariantViolation(
                f"{reader.name} delivers {_pos(position)} after {_pos(reader.last)}"
            )
        if self.message_at.get(position) != message:
            raise InvariantViolation(
                f"{reader.name} delivers {message} at {_pos(position)}: the stream has "
                f"{self.message_at.get(position)}"
            )
        reader.last = position
        if message.key is None:
            return
        if message.value:
            reader.table[message.key] = (position, message.value)
        else:
            reader.table.pop(message.key, None)

    def check_table(self, reader: Reader, upto: Position) -> None:
        """Reading the stream after the view, up to `upto`: every key's latest value, and
        every key's deletion since it began reading the stream (see the module)."""
        since = reader.state.since
        for key, (position, value) in self.latest_up_to(upto).items():
            first = self.first_piece[position]
            if position <= reader.start or first <= reader.start:
                continue  # (before its start, or a chunked message it started inside)
            if not value:
                if since is not None and first > since and key in reader.table:
                    raise InvariantViolation(
                        f"{reader.name} reads the stream since {_pos(since)} (retention "
                        f"{'compacted' if self.compacted_retention else 'none'}), read up "
                        f"to {_pos(upto)}: it missed the deletion of {key} at {_pos(position)}"
                    )
                if key in reader.table and (reader.name, key, position) not in self.missed:
                    self.missed.add((reader.name, key, position))  # (counted, see the module)
                    self.log(f"{reader.name} missed the deletion of {key} at {_pos(position)}")
                continue
            if reader.table.get(key) != (position, value):
                raise InvariantViolation(
                    f"{reader.name} (after {_pos(reader.start)}) read up to {_pos(upto)}: "
                    f"key {key} is {reader.table.get(key)}, its latest is "
                    f"{value} at {_pos(position)}"
                )

    def step_cursor(self, cursor: Cursor) -> None:
        """An uncompacted cursor reads on and acknowledges one entry."""
        nxt = self.next_entry_after(cursor.mark)
        if nxt is not None:
            cursor.mark = nxt
            self.log(f"{cursor.name} acknowledges up to {_pos(nxt)}")

    def next_entry_after(self, mark: Position) -> Position | None:
        for ledger_id in self.list:
            if ledger_id < mark[0]:
                continue
            for entry_id, entry in enumerate(self.entries[ledger_id]):
                last = (ledger_id, entry_id, len(entry.messages) - 1)
                if last > mark:
                    return last
        return None

    # -- the invariants -----------------------------------------------------------------

    def check(self) -> None:
        view = self.view
        horizon = None if view is None else view.horizon
        if view is not None:
            if view.ledger_id in self.deleted or view.ledger_id not in self.closed:
                raise InvariantViolation(f"the installed view names ledger {view.ledger_id}, "
                                         "which is deleted or not closed")  # fmt: skip
            if self.checked_view != view.ledger_id:
                self.check_view(view)
                if self.horizon is not None and view.horizon <= self.horizon:
                    raise InvariantViolation(
                        f"view {view.ledger_id} up to {_pos(view.horizon)} replaces one up to "
                        f"{_pos(self.horizon)}: the horizon moves back"
                    )
                self.checked_view, self.horizon = view.ledger_id, view.horizon
        needs = [(c.name, c.mark) for c in self.cursors]
        needs += [(r.name, max(r.last, horizon or EARLIEST)) for r in self.durable]
        if horizon is not None:
            needs.append(("the horizon", horizon))
        ledger_id, last = self.trimmed
        for who, mark in needs:
            if last > mark:
                raise InvariantViolation(
                    f"ledger {ledger_id} is deleted, {who} still needs it ({_pos(mark)})"
                )
        compacting = [c.name for c in self.compactions + self.dead if c.locked and not c.expired]
        if len(compacting) > 1:
            raise InvariantViolation(f"{' and '.join(compacting)} compact at once")

    def check_view(self, view: View) -> None:
        found: dict[str, tuple[Position, str]] = {}
        pieces: list[Compacted] = []
        previous: tuple[int, int, int] = EARLIEST
        for stored in self.view_entries[view.ledger_id]:
            at = (stored.ledger_id, stored.entry_id, stored.first_index)
            if at <= previous:
                raise InvariantViolation(f"view {view.ledger_id} is out of order at {_pos(at)}")
            previous = (stored.ledger_id, stored.entry_id, stored.first_index + len(stored.entry.messages) - 1)  # fmt: skip
            piece = stored.entry.piece
            if piece is not None:
                if piece.index != len(pieces):
                    raise InvariantViolation(f"view {view.ledger_id}: a chunk not whole at {_pos(at)}")  # fmt: skip
                pieces.append(stored)
                if len(pieces) < piece.count:
                    continue
                whole = "".join(p.entry.messages[0].value for p in pieces)
                self.found_in_view(
                    view, found, previous, Message(stored.entry.messages[0].key, whole)
                )
                pieces = []
                continue
            if pieces:
                raise InvariantViolation(f"view {view.ledger_id}: a chunk not whole at {_pos(at)}")
            for i, message in enumerate(stored.entry.messages):
                position = (stored.ledger_id, stored.entry_id, stored.first_index + i)
                self.found_in_view(view, found, position, message)
        if pieces:
            raise InvariantViolation(f"view {view.ledger_id} ends with a chunk not whole")
        expected = {k: v for k, v in self.latest_up_to(view.horizon).items() if v[1]}
        if found != expected:
            raise InvariantViolation(
                f"view {view.ledger_id} up to {_pos(view.horizon)} holds {_table(found)}, "
                f"the latest values are {_table(expected)}"
            )

    def found_in_view(
        self, view: View, found: dict[str, tuple[Position, str]], at: Position, message: Message
    ) -> None:
        if message.key is None or message.key in found:
            raise InvariantViolation(f"view {view.ledger_id} holds {message} at {_pos(at)}")
        found[message.key] = (at, message.value)

    # -- the run ------------------------------------------------------------------------

    def step(self, writing: bool) -> None:
        self.expire_sessions()
        actions = list(self.actions[writing])
        if self.sweeper is None:
            actions.append((0.3, self.start_sweep))
        else:
            actions.append((2.0, self.step_sweeper))
        for compaction in self.compactions:
            if compaction.stopped_until <= self.now:
                actions.append((COMPACTOR_WEIGHT, partial(self.step_compaction, compaction)))
        for cursor in self.cursors:
            actions.append((0.7, partial(self.step_cursor, cursor)))
        if len(self.compactions) >= 3:
            actions = actions[1:]
        # Every reader reads (2.0), a durable one's consumer reconnects (0.1): picked by
        # arithmetic, not listed (there are hundreds).
        reading, durable = 2.0 * len(self.readers), self.durable
        total = sum(weight for weight, _ in actions)
        pick = self.rnd.random() * (total + reading + 0.1 * len(durable))
        if pick >= total + reading:
            self.reconnect(durable[min(int((pick - total - reading) / 0.1), len(durable) - 1)])
        elif pick >= total:
            self.step_reader(self.readers[min(int((pick - total) / 2.0), len(self.readers) - 1)])
        else:
            action = actions[-1][1]
            for weight, action in actions:  # noqa: B007 (the one picked)
                pick -= weight
                if pick <= 0:
                    break
            action()
        self.check()

    def auditor(self) -> None:
        """Compaction by policy: the rolled ledgers' bytes after the horizon's ledger."""
        horizon = None if self.view is None else self.view.horizon
        backlog = backlog_bytes([(i, self.size(i)) for i in self.list], horizon)
        if not self.compactions and should_compact(self.threshold, backlog):
            self.start_compaction(f"backlog {backlog} bytes")

    def reconnect(self, reader: Reader) -> None:
        """A read_compacted subscription's consumer comes back: reads after its mark."""
        self.log(f"{reader.name} reconnects after {_pos(reader.last)}")
        self.readers.remove(reader)
        self.durable.remove(reader)
        self.new_reader(durable=True, start=reader.last, name=reader.name)

    def run(self) -> CompactionScenario:
        for self.now in range(STEPS):
            self.step(writing=True)
        self.log("the writer stops")
        for self.now in range(STEPS, 2 * STEPS):
            self.step(writing=False)
        while self.compactions:  # the last ones finish (or die)
            self.now += 1
            self.expire_sessions()
            going = [c for c in self.compactions if c.stopped_until <= self.now]
            if going:
                self.step_compaction(going[0])
            self.check()
        self.now += 1
        self.new_reader(durable=False, start=EARLIEST)
        for reader in self.readers:
            self.catch_up(reader)
        return self

    def catch_up(self, reader: Reader) -> None:
        """Read to the end, then hold the table against every key's latest message."""
        while (batch := next(reader.feed, None)) is not None:
            self.take(reader, batch)
        end = self.end_position()
        if reader.state.after < end:
            raise InvariantViolation(f"{reader.name} stops at {_pos(reader.state.after)}")
        self.check_table(reader, end)

    @property
    def missed_deletions(self) -> int:
        """Deletions compacted readers missed (a reader, a key, a tombstone: once)."""
        return len(self.missed)


class KeepsTombstones(LatestByKey):
    """The keep_tombstones mutation: phase one takes a tombstone for a value."""

    def observe(self, key: str | None, position: Position, tombstone: bool) -> None:
        super().observe(key, position, False)


RESTART = Batch(-1, -1, 0, (), None, EARLIEST)  # (a new view passed the read: read it first)


def _pos(position: Sequence[int] | None) -> str:
    return "-" if position is None else ":".join(map(str, position))


def _show(messages: Iterable[Message]) -> str:
    return " ".join(f"{m.key or '_'}={m.value or 'DEL'}" for m in messages)


def _table(table: dict[str, tuple[Position, str]]) -> str:
    return "{" + ", ".join(f"{k}={v}@{_pos(p)}" for k, (p, v) in sorted(table.items())) + "}"


def run_compaction_seed(
    seed: int, mutation: str = "none", sweep_grace: int | None = None, as_is: Iterable[str] = ()
) -> CompactionScenario:
    """One seed; sweep_grace None: the seed picks one of GRACES; as_is: the bugs of FIXES
    to model as streamlib has them (not fixed)."""
    as_is = sorted(set(as_is))
    scenario = CompactionScenario(seed, mutation, sweep_grace, as_is)
    try:
        return scenario.run()
    except InvariantViolation as violation:
        flags = "--compaction"
        if mutation != "none":
            flags += f" --compaction-mutation {mutation}"
        if sweep_grace is not None:
            flags += f" --compaction-grace {sweep_grace}"
        for bug in as_is:
            flags += f" --compaction-as-is {bug}"
        raise InvariantViolation(
            f"seed {seed} (compaction): {violation}\n"
            f"replay: python -m tests.sim {flags} --seed {seed}\n"
            + "\n".join(scenario.trace[-150:])
        ) from None
