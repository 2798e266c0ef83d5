"""The bookie's ledger-state rules, in one place: every request path asks here.

Rule 1 (as h11's ``_state.py``): whatever decides whether a request may change a
ledger's state on this bookie lives in this file, as pure functions of (the state, the
request). ``storage.py`` applies the outcome and makes it durable; the simulator
(``tests/sim``) runs the same functions for its bookies, so a rule that broke the
protocol would show there as a lost or stuck entry. Nothing here does I/O.

A bookie keeps per ledger a master key, a fence flag, a term and an explicit LAC
(:class:`LedgerState`). The table, request by request (protocol.txt "Fencing" and
"Closing", fencing.txt, unbounded-ledgers.txt "Protocol changes", BookKeeper's
``Bookie.addEntry`` / ``recoveryAddEntry`` / ``fenceLedger``):

| request               | ledger unknown here          | then, in order                      |
|-----------------------|------------------------------|-------------------------------------|
| add                   | created with the add's key   | read-only? key, mode+term, no-op    |
|                       | and term (first key wins)    | flags need term mode, fenced?       |
| recovery add          | same                         | key, mode+term, no-op flags need    |
|                       |                              | term mode (passes fence, read-only) |
| rewrite of an entry   | --                           | same payload/length/no-op kind, or  |
|  the bookie holds     |                              | a higher term replacing a leftover  |
| fencing read          | created fenced, only if the  | key, FENCE never with a term nor on |
|                       | metadata store has it (*)    | a term-mode ledger, then fence      |
| term read             | created with the term, on    | key, mode+term (adopts a higher)    |
|                       | the same condition as (*)    |                                     |
| explicit-LAC write    | NO_SUCH_LEDGER               | key, mode+term; reported only up to |
|                       |                              | the highest entry accepted here     |

Mode: a ledger is in term mode on this bookie once its state holds a term > 0
(unbounded ledgers start at term 1; bounded ledgers never carry one). A request with a
term on a bounded ledger is refused (BAD_REQUEST), and on a term-mode ledger a request
without one is refused like any lower term (INVALID_TERM): one table, so
``protocol/terms.py``'s "bookie > request: reject" holds for term 0 as well.

(*) Why fences of unknown ledgers consult the metadata store: BookKeeper creates the
ledger fenced under the fencer's key, so anyone who can derive a key can pre-fence a
FUTURE ledger id and make its creation fail. A ledger absent from the metadata has no
writer to stop (its metadata is written before its first add and deleted only after
its last), so refusing that fence with NO_SUCH_LEDGER costs nothing and blocks the
attack. A bookie run without a metadata store keeps BookKeeper's behaviour.

Why an add never replaces a stored entry with a different one: in a bounded ledger an
entry id has one content for ever (one writer; recovery and re-replication only copy
it), so a different payload is a forgery -- and on a CLOSED ledger nothing else stops
it, because a writer's close does not fence its bookies. In term mode a later term's
writer legitimately replaces a leftover of an earlier term (the TRUNCATE no-op at the
first unrecoverable entry, or a new entry on a bookie that kept a dead writer's dirty
copy), so there the request's term must be higher than the stored copy's. A rewrite of
the same entry is idempotent (recovery's write-back carries its own LAC and term).

Who may ask at all comes first (:func:`check_access`, when the bookie authenticates):

| access                | roles allowed                | requests                            |
|-----------------------|------------------------------|-------------------------------------|
| ADD                   | write, admin                 | normal adds                         |
| RECOVERY_ADD          | write, bookie, admin         | recovery / replication write-back,  |
|                       |                              | a takeover's TRUNCATE no-op         |
| FENCE                 | write, bookie, admin         | fencing reads, term reads (recovery |
|                       |                              | of a takeover or of auto-recovery)  |
| WRITE_LAC, FORCE      | write, admin                 | a writer's explicit LAC, barrier    |
| READ, READ_LAC        | read, write, bookie, admin   | plain reads, LAC reads, long polls  |
| INFO                  | any principal with a role    | GetBookieInfo, /metrics             |
| ADMIN                 | admin                        | the admin HTTP port's calls         |

``admin`` is the superuser (Pulsar's superUserRoles); ``bookie`` is what bookies and their
auto-recovery nodes hold: read, fence, recover and copy with recovery adds, never a normal
add; ``write`` implies reading, because a writer taking over reads what it recovers.
"""

from __future__ import annotations

import enum
import hmac
import struct
from dataclasses import dataclass, field

from bookie.errors import (
    BadRequestError,
    InvalidTermError,
    LedgerFencedError,
    NoSuchLedgerError,
    ReadOnlyError,
    UnauthorizedError,
)
from bookie.wire import bookie_pb2 as pb

_STATE = struct.Struct(">BQqqH")
_FENCED = 1
NO_OP_FLAGS = pb.TRUNCATE | pb.NOOP
UNKNOWN_HIGHEST = -2  # LedgerState.highest_entry not looked up yet


@dataclass(slots=True)
class LedgerState:
    """What a bookie must remember about a ledger beyond its entries."""

    master_key: bytes
    fenced: bool = False
    term: int = 0
    explicit_lac: int = -1
    piggyback_lac: int = -1  # the highest LAC carried by an entry the bookie stored
    # Not persisted: the highest entry id accepted for this ledger (stored, or on its
    # way through the journal), looked up from the index when the state is loaded. Adds
    # above it are new entries (the hot path); at or below it an add may be a rewrite.
    highest_entry: int = field(default=UNKNOWN_HIGHEST, compare=False)

    @property
    def lac(self) -> int:
        """The LAC this bookie reports: an explicit LAC counts only up to the highest
        entry accepted here (see check_write_lac)."""
        return max(min(self.explicit_lac, self.highest_entry), self.piggyback_lac)

    @property
    def term_mode(self) -> bool:
        return self.term > 0

    def pack(self) -> bytes:
        flags = _FENCED if self.fenced else 0
        head = _STATE.pack(
            flags, self.term, self.explicit_lac, self.piggyback_lac, len(self.master_key)
        )
        return head + self.master_key

    @classmethod
    def unpack(cls, raw: bytes) -> LedgerState:
        flags, term, explicit, piggy, mk_len = _STATE.unpack_from(raw, 0)
        mk = bytes(raw[_STATE.size : _STATE.size + mk_len])
        return cls(mk, bool(flags & _FENCED), term, explicit, piggy)


@dataclass(frozen=True, slots=True)
class Copy:
    """What identifies an entry's content (not its LAC field, digest or term stamp: a
    write-back carries its own)."""

    payload: bytes
    length: int
    flags: int
    term: int

    @property
    def no_op(self) -> bool:
        return bool(self.flags & NO_OP_FLAGS)


# -- the pieces every request shares ------------------------------------------------------


class Access(enum.Enum):
    ADD = "add"
    RECOVERY_ADD = "recovery add"
    FENCE = "fence or recover"
    WRITE_LAC = "write the LAC"
    FORCE = "force"
    READ = "read"
    READ_LAC = "read the LAC"
    INFO = "ask for the bookie's info"
    ADMIN = "call the admin API"


_ANY = frozenset({"read", "write", "admin", "bookie"})
ROLES_ALLOWED: dict[Access, frozenset[str]] = {
    Access.ADD: frozenset({"write", "admin"}),
    Access.RECOVERY_ADD: frozenset({"write", "bookie", "admin"}),
    Access.FENCE: frozenset({"write", "bookie", "admin"}),
    Access.WRITE_LAC: frozenset({"write", "admin"}),
    Access.FORCE: frozenset({"write", "admin"}),
    Access.READ: _ANY,
    Access.READ_LAC: _ANY,
    Access.INFO: _ANY,
    Access.ADMIN: frozenset({"admin"}),
}


def check_access(principal: str, roles: frozenset[str], access: Access) -> None:
    """UnauthorizedError unless one of principal's roles allows access."""
    allowed = ROLES_ALLOWED[access]
    if roles & allowed:
        return
    raise UnauthorizedError(
        f"principal {principal!r} may not {access.value}: it needs one of the roles "
        f"{sorted(allowed)}, and has "
        f"{sorted(roles) or 'none (grant roles with `streamlib admin principals grant`)'}"
    )


def check_key(ledger_id: int, state: LedgerState, master_key: bytes) -> None:
    # Constant time: the time of a refusal says nothing of how much of a key was right.
    if not hmac.compare_digest(state.master_key, master_key):
        raise UnauthorizedError(f"ledger {ledger_id}: master key does not match the ledger's")


def apply_term(ledger_id: int, state: LedgerState, term: int) -> bool:
    """The mode and term rules; adopts a higher term. Whether the state changed."""
    if term < 0:
        raise BadRequestError(f"ledger {ledger_id}: term {term} is negative")
    if term > 0 and not state.term_mode:
        raise BadRequestError(
            f"ledger {ledger_id} is a bounded ledger on this bookie (it carries no term); "
            f"a request with term {term} is refused"
        )
    if term < state.term:
        raise InvalidTermError(
            f"ledger {ledger_id}: term {term} is lower than this bookie's term {state.term}",
            term=state.term,
        )
    if term > state.term:
        state.term = term
        return True
    return False


def _new_state(master_key: bytes, term: int) -> LedgerState:
    return LedgerState(master_key, term=term, highest_entry=-1)


# -- adds ------------------------------------------------------------------------------


def check_add(
    ledger_id: int,
    state: LedgerState | None,
    master_key: bytes,
    flags: int,
    term: int,
    *,
    read_only: bool,
) -> tuple[LedgerState, bool]:
    """An add or recovery add (``flags`` as sent): (the state, whether it is new or
    changed). Raises the RequestError to answer."""
    recovery = flags & pb.RECOVERY_ADD
    if read_only and not recovery:
        raise ReadOnlyError("this bookie is read-only; normal adds are refused")
    if flags & NO_OP_FLAGS and term <= 0:
        raise BadRequestError(
            f"ledger {ledger_id}: TRUNCATE and NOOP entries belong to term-mode ledgers; "
            f"this add carries no term"
        )
    if state is None:
        if term < 0:
            raise BadRequestError(f"ledger {ledger_id}: term {term} is negative")
        return _new_state(master_key, term), True
    check_key(ledger_id, state, master_key)
    changed = apply_term(ledger_id, state, term)
    if state.fenced and not recovery:
        raise LedgerFencedError(f"ledger {ledger_id} is fenced on this bookie")
    return state, changed


def check_rewrite(ledger_id: int, entry_id: int, stored: Copy, new: Copy) -> None:
    """An add of an entry this bookie already holds (or has on its way to the journal)."""
    same = (
        stored.payload == new.payload
        and stored.length == new.length
        and stored.no_op == new.no_op
        # A TRUNCATE is never a plain rewrite: written again it would delete what was
        # written after it (recovery writes a stored no-op back as NOOP).
        and not (new.flags & pb.TRUNCATE and not stored.flags & pb.TRUNCATE)
    )
    if same:
        return
    if new.term > 0 and new.term > stored.term:
        return  # a later term's writer replaces a leftover of an earlier one
    raise BadRequestError(
        f"entry {ledger_id}:{entry_id} is stored here with a different "
        f"{'payload' if stored.payload != new.payload else 'length or kind'}; "
        f"an add never replaces a stored entry (only a later term's writer replaces an "
        f"earlier term's leftover)"
    )


def truncated(state: LedgerState, entry_id: int) -> None:
    """A TRUNCATE no-op at ``entry_id`` was applied: nothing above it is stored. (The
    highest entry accepted is the add path's: it was set to ``entry_id`` when the no-op
    was accepted, and adds accepted after it count.)"""
    state.piggyback_lac = min(state.piggyback_lac, entry_id)
    state.explicit_lac = min(state.explicit_lac, entry_id)


# -- fences, term reads, explicit LAC ---------------------------------------------------


def check_fence(
    ledger_id: int,
    state: LedgerState | None,
    master_key: bytes,
    term: int,
    *,
    in_metadata: bool | None,
) -> tuple[LedgerState, bool]:
    """A read with the FENCE flag. ``in_metadata``: whether the metadata store holds the
    ledger (asked only when the ledger is unknown here; None without a store)."""
    if term:
        raise BadRequestError(
            f"ledger {ledger_id}: a FENCE read carries no term (term-mode ledgers are "
            f"fenced by their terms)"
        )
    if state is None:
        _may_create(ledger_id, in_metadata)
        return LedgerState(master_key, fenced=True, highest_entry=-1), True
    check_key(ledger_id, state, master_key)
    if state.term_mode:
        raise BadRequestError(
            f"ledger {ledger_id} is a term-mode ledger: it is fenced by a higher term, "
            f"never by the FENCE flag"
        )
    if state.fenced:
        return state, False
    state.fenced = True
    return state, True


def check_term_read(
    ledger_id: int,
    state: LedgerState | None,
    master_key: bytes,
    term: int,
    *,
    in_metadata: bool | None,
) -> tuple[LedgerState, bool]:
    """A recovery read or recovery LAC read carrying a term (no FENCE flag): in term
    mode the term is the fence, so a ledger unknown here is created with it, as a fence
    creates it fenced -- otherwise a bookie of a fragment that got no entry yet could
    not count towards the new term's recovery, and the old writer could still write
    there. Same metadata condition as a fence."""
    if term <= 0:
        raise BadRequestError(f"ledger {ledger_id}: a term read needs a term > 0, got {term}")
    if state is None:
        _may_create(ledger_id, in_metadata)
        return LedgerState(master_key, term=term, highest_entry=-1), True
    check_key(ledger_id, state, master_key)
    return state, apply_term(ledger_id, state, term)


def _may_create(ledger_id: int, in_metadata: bool | None) -> None:
    if in_metadata is False:
        raise NoSuchLedgerError(
            f"ledger {ledger_id} is neither on this bookie nor in the metadata store: "
            f"there is no writer to fence"
        )


def check_write_lac(
    ledger_id: int, state: LedgerState | None, master_key: bytes, term: int, lac: int
) -> tuple[LedgerState, bool]:
    """An explicit-LAC write. It is kept as sent, but :attr:`LedgerState.lac` reports it
    only up to the highest entry accepted here: a LAC is a claim that every entry up to
    it is acknowledged, so a value past anything written is a forgery that would send
    readers after entries that never existed and make every later recovery start past
    the ledger's end. (Bounded when reported, not refused or cut when written: a writer
    sends its LAC to the whole ensemble, and a bookie may not hold the LAC's entry yet
    -- it is on its way -- or at all, with E > Qw or a fresh fragment; the LAC it reports
    rises as those entries arrive, so a tailing reader polling it sees them.)"""
    if state is None:
        raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
    check_key(ledger_id, state, master_key)
    changed = apply_term(ledger_id, state, term)
    if lac > state.explicit_lac:
        state.explicit_lac = lac
        changed = True
    return state, changed
