"""What a writer in this client has had acknowledged lately, for readers in the same client.

Pulsar's broker serves a topic's tailing cursors from the managed ledger's cache of the
entries it just added: they learn of an entry when its add completes, with no bookie
round trip. A :class:`LocalTail` does that for a ledger whose writer (a WriteHandle) and
readers (ReadHandles) share one client -- a stream's producer and its consumers in one
process, or the stream service's broker, which writes and dispatches a stream.

Safety (streamlib/protocol/read_rules.py, ``local_lac_usable``): the writer's LAC is the
ledger's LAC -- every entry up to it is acknowledged by an ack quorum -- so a reader that
takes it never reads past the LAC, and the bytes it takes are the very bytes the writer
had acknowledged. Once the writer stops (closed, failed, released or replaced), its tail
ends and readers go back to the bookies' long poll.

Cost: the writer keeps acknowledged payloads only while some reader of this client
follows the ledger, and then at most ``MAX_ENTRIES`` / ``MAX_BYTES`` of them (older ones
are read from the bookies, as without a local writer). Across the client's ledgers the
kept entries share one budget (``LocalTails``: ``BUDGET_ENTRIES`` / ``BUDGET_BYTES``), the
oldest going first, as Pulsar's broker-wide entry cache evicts: a broker tailing 10,000
ledgers keeps each one's last few entries, not 256 of each. Each ledger's kept entries
stay the newest ones, consecutive, so a reader either takes them or reads the older
ones from the bookies.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from streamlib.protocol.actions import EntryData

MAX_ENTRIES = 256
MAX_BYTES = 8 << 20
# What every ledger of one client keeps together, at most.
BUDGET_ENTRIES = 65_536
BUDGET_BYTES = 64 << 20


class TailBudget:
    """The entries every tail of one client keeps, in the order they were kept: past the
    budget the oldest go (from whichever tail holds them)."""

    def __init__(self, max_entries: int = BUDGET_ENTRIES, max_bytes: int = BUDGET_BYTES) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("a local tail budget holds at least one entry and one byte")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: OrderedDict[tuple[LocalTail, int], int] = OrderedDict()  # -> size

    @property
    def entries(self) -> int:
        return len(self._kept)

    def kept(self, tail: LocalTail, entry_id: int, size: int) -> None:
        self._kept[(tail, entry_id)] = size
        self.bytes += size
        while self._kept and (len(self._kept) > self.max_entries or self.bytes > self.max_bytes):
            (owner, oldest), size = self._kept.popitem(last=False)
            self.bytes -= size
            owner.evicted(oldest)

    def dropped(self, tail: LocalTail, entry_id: int) -> None:
        size = self._kept.pop((tail, entry_id), None)
        if size is not None:
            self.bytes -= size


class LocalTail:
    def __init__(
        self, ledger_id: int, lac: int, term: int = 0, budget: TailBudget | None = None
    ) -> None:
        self.ledger_id = ledger_id
        self._budget = budget if budget is not None else TailBudget()
        self.lac = lac
        self.term = term  # the writer's (an unbounded ledger's newer term deposes it)
        self.open = True
        self.followers = 0  # readers of this client tailing the ledger
        self._entries: OrderedDict[int, EntryData] = OrderedDict()
        self._bytes = 0
        self._waiters: set[asyncio.Future[None]] = set()

    def wake_on_change(self, waiter: asyncio.Future[None]) -> None:
        """Complete waiter (if not done) when the LAC moves or the tail ends."""
        self._waiters.add(waiter)

    def forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    @property
    def keeping(self) -> bool:
        """Whether acknowledged payloads are worth keeping (a reader follows)."""
        return self.open and self.followers > 0

    def acknowledged(self, lac: int, entries: list[EntryData]) -> None:
        """The writer's LAC moved to lac; entries: those it confirmed, if kept."""
        if not self.open or lac <= self.lac:
            return
        self.lac = lac
        for entry in entries:
            self._entries[entry.entry_id] = entry
            self._bytes += len(entry.payload)
        while self._entries and (len(self._entries) > MAX_ENTRIES or self._bytes > MAX_BYTES):
            old_id, old = self._entries.popitem(last=False)
            self._bytes -= len(old.payload)
            self._budget.dropped(self, old_id)
        for entry in entries:  # (the budget may take the oldest of any tail, this one's too)
            if entry.entry_id in self._entries:
                self._budget.kept(self, entry.entry_id, len(entry.payload))
        self._wake()

    def evicted(self, entry_id: int) -> None:
        """The budget took this entry back (it was the client's oldest kept)."""
        entry = self._entries.pop(entry_id, None)
        if entry is not None:
            self._bytes -= len(entry.payload)

    def end(self) -> None:
        """The writer stopped: readers go back to the bookies."""
        if self.open:
            self.open = False
            for entry_id in self._entries:
                self._budget.dropped(self, entry_id)
            self._entries.clear()
            self._bytes = 0
            self._wake()

    def entries_from(self, first: int) -> list[EntryData]:
        """The kept entries first, first + 1, ... (up to the LAC), as far as they are
        consecutive; [] when first is not kept."""
        out = []
        entry = self._entries.get(first)
        while entry is not None and entry.entry_id <= self.lac:
            out.append(entry)
            entry = self._entries.get(entry.entry_id + 1)
        return out

    async def wait(self, after_lac: int, timeout_s: float) -> None:
        """Until the LAC passes after_lac, the tail ends, or timeout_s passes."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                while self.lac <= after_lac and self.open:
                    woken: asyncio.Future[None] = loop.create_future()
                    self.wake_on_change(woken)
                    try:
                        await woken
                    finally:
                        self.forget_waiter(woken)
        except TimeoutError:
            pass


class LocalTails:
    """The client's tails, by ledger id: at most one writer per ledger per client."""

    def __init__(self, budget: TailBudget | None = None) -> None:
        self._tails: dict[int, LocalTail] = {}
        self.budget = budget if budget is not None else TailBudget()

    def start(self, ledger_id: int, lac: int, term: int = 0) -> LocalTail:
        """A writer begins (a newer one replaces an older one of the same ledger)."""
        old = self._tails.get(ledger_id)
        if old is not None:
            old.end()
        tail = self._tails[ledger_id] = LocalTail(ledger_id, lac, term, self.budget)
        return tail

    def stop(self, tail: LocalTail) -> None:
        tail.end()
        if self._tails.get(tail.ledger_id) is tail:
            del self._tails[tail.ledger_id]

    def get(self, ledger_id: int) -> LocalTail | None:
        tail = self._tails.get(ledger_id)
        return tail if tail is not None and tail.open else None
