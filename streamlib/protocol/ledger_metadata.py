"""The protocol's view of a ledger's metadata (ARCHITECTURE.md §3) and its pure updates.

The metadata package persists this (protobuf, versioned by CAS); the ledger layer
converts at the boundary. Every update returns a new value and goes through the state
table in :mod:`streamlib.protocol.states`, so an illegal change cannot be built.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from streamlib.protocol.digest import DigestType, key_material
from streamlib.protocol.errors import BadRequestError, InvalidLedgerConfigError
from streamlib.protocol.quorum import validate_quorums, write_set
from streamlib.protocol.states import LedgerEvent, LedgerState, next_state


@dataclass(frozen=True)
class Fragment:
    """Entries from first_entry_id on (up to the next fragment) live on this ensemble.

    Two annotations serve fragment retention (they are not part of a fragment's
    identity): when the fragment began (epoch ms, 0 = unknown), and the ledger's length
    before its first entry (None = unknown). Unknown values never make a fragment look
    old or big enough to drop.

    ``term``: the term the fragment was made in (unbounded ledgers; 0 otherwise). Every
    entry of the fragment is written under that term or a later one, so a copy a bookie
    stored under an OLDER term is a leftover of an earlier writer -- a bookie that a
    term's recovery replaced keeps its dirty entries, and placement may pick it again
    for a later fragment -- and is never read as the entry (``copy_is_current``)."""

    first_entry_id: int
    ensemble: tuple[str, ...]
    created_time_ms: int = field(default=0, compare=False)
    start_length: int | None = field(default=None, compare=False)
    term: int = field(default=0, compare=False)


@dataclass(frozen=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    fragments: tuple[Fragment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1  # meaningful when CLOSED; -1 = empty
    length: int = 0  # payload bytes, when CLOSED
    digest_type: DigestType = DigestType.CRC32C
    password_hash: bytes = b""
    term: int = 0
    unbounded: bool = False
    first_entry_id: int = 0  # entries below were dropped by fragment retention
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)
    creation_time_ms: int = 0
    key_version: int = 0  # see protocol/digest.py "Keys"

    def key_material(self, password: bytes | None) -> bytes:
        return key_material(self.key_version, password, self.password_hash)

    def __post_init__(self) -> None:
        if self.ledger_id < 0:
            raise BadRequestError(f"ledger id must be >= 0, got {self.ledger_id}")
        validate_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        if not self.fragments:
            raise InvalidLedgerConfigError("a ledger needs at least one fragment")
        firsts = [f.first_entry_id for f in self.fragments]
        if firsts != sorted(set(firsts)):
            raise InvalidLedgerConfigError(f"fragments must start at increasing entries: {firsts}")
        for fragment in self.fragments:
            if len(fragment.ensemble) != self.ensemble_size:
                raise InvalidLedgerConfigError(
                    f"fragment at {fragment.first_entry_id} has {len(fragment.ensemble)} bookies, "
                    f"ensemble size is {self.ensemble_size}"
                )
            if len(set(fragment.ensemble)) != len(fragment.ensemble):
                raise InvalidLedgerConfigError(f"duplicate bookie in ensemble {fragment.ensemble}")

    # -- queries ------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_fragment(self) -> Fragment:
        return self.fragments[-1]

    def fragment_index(self, entry_id: int) -> int:
        firsts = [f.first_entry_id for f in self.fragments]
        index = bisect.bisect_right(firsts, entry_id) - 1
        if index < 0:
            raise BadRequestError(
                f"entry {entry_id} precedes ledger {self.ledger_id}'s first fragment"
            )
        return index

    def fragment_for(self, entry_id: int) -> Fragment:
        return self.fragments[self.fragment_index(entry_id)]

    def copy_is_current(self, entry_id: int, copy_term: int) -> bool:
        """Whether a stored copy of entry_id (written under copy_term) can be the entry:
        not a leftover of a term older than its fragment (see Fragment)."""
        return copy_term >= self.fragment_for(entry_id).term

    def write_set_bookies(self, entry_id: int) -> tuple[str, ...]:
        """The bookies that should hold entry_id."""
        ensemble = self.fragment_for(entry_id).ensemble
        return tuple(
            ensemble[i] for i in write_set(entry_id, self.ensemble_size, self.write_quorum)
        )

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        return write_set(entry_id, self.ensemble_size, self.write_quorum)

    def bookies(self) -> set[str]:
        return {b for f in self.fragments for b in f.ensemble}

    # -- updates (each is a CAS candidate) ----------------------------------------------

    def _to(self, event: LedgerEvent, **changes: object) -> LedgerMetadata:
        state = next_state(self.state, event, unbounded=self.unbounded)
        return replace(self, state=state, **changes)  # type: ignore[arg-type]

    def with_ensemble_change(
        self,
        first_entry_id: int,
        replacements: Mapping[int, str],
        *,
        created_time_ms: int = 0,
        start_length: int | None = None,
        term: int = 0,
    ) -> LedgerMetadata:
        """A new fragment from first_entry_id, the last ensemble with the bookies at the
        given indexes replaced, made in `term`. A fragment that would start where the last
        one starts replaces it (no entry was written to it yet)."""
        last = self.last_fragment
        if first_entry_id < last.first_entry_id:
            raise InvalidLedgerConfigError(
                f"new fragment at {first_entry_id} precedes the last one at {last.first_entry_id}"
            )
        ensemble = list(last.ensemble)
        for index, bookie in replacements.items():
            ensemble[index] = bookie
        if first_entry_id == last.first_entry_id:  # it takes the replaced one's place
            created_time_ms = last.created_time_ms or created_time_ms
            start_length = last.start_length if last.start_length is not None else start_length
        term = max(term, last.term)
        fragment = Fragment(first_entry_id, tuple(ensemble), created_time_ms, start_length, term)
        kept = self.fragments[:-1] if first_entry_id == last.first_entry_id else self.fragments
        return self._to(LedgerEvent.ENSEMBLE_CHANGE, fragments=(*kept, fragment))

    def with_fragment_bookie_replaced(
        self, fragment_index: int, old: str, new: str
    ) -> LedgerMetadata:
        """Re-replication: swap one bookie of one fragment (any state but IN_RECOVERY)."""
        fragment = self.fragments[fragment_index]
        if old not in fragment.ensemble:
            raise InvalidLedgerConfigError(f"{old} is not in fragment {fragment_index}")
        ensemble = tuple(new if b == old else b for b in fragment.ensemble)
        fragments = list(self.fragments)
        fragments[fragment_index] = replace(fragment, ensemble=ensemble)
        return self._to(LedgerEvent.ENSEMBLE_CHANGE, fragments=tuple(fragments))

    def with_fragments_dropped(self, count: int) -> LedgerMetadata:
        """Fragment retention: forget the first ``count`` fragments; entries below the
        new first fragment are gone for good (bookies garbage-collect them). Never the
        last fragment, and not while a recovery holds the ledger."""
        if count < 0 or count >= len(self.fragments):
            raise BadRequestError(
                f"ledger {self.ledger_id}: cannot drop {count} of {len(self.fragments)} "
                "fragments (the last one always stays)"
            )
        if self.state is LedgerState.IN_RECOVERY:
            raise InvalidLedgerConfigError(
                f"ledger {self.ledger_id} is being recovered: fragments stay until it is done"
            )
        if count == 0:
            return self
        rest = self.fragments[count:]
        return replace(self, fragments=rest, first_entry_id=rest[0].first_entry_id)

    def in_recovery(self, term: int | None = None) -> LedgerMetadata:
        changes: dict[str, object] = {}
        if term is not None:
            changes["term"] = term
        return self._to(LedgerEvent.START_RECOVERY, **changes)

    def closed_by_writer(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return self._to(LedgerEvent.WRITER_CLOSE, last_entry_id=last_entry_id, length=length)

    def closed_by_recovery(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return self._to(LedgerEvent.RECOVERY_CLOSE, last_entry_id=last_entry_id, length=length)

    def reopened(self, fragments: Sequence[Fragment] | None = None) -> LedgerMetadata:
        """Unbounded mode: the new term's recovery is done; the ledger is writable again."""
        changes: dict[str, object] = {}
        if fragments is not None:
            changes["fragments"] = tuple(fragments)
        return self._to(LedgerEvent.REOPEN_NEW_TERM, **changes)
