"""The bookie's ledger-state rules (bookie/ledger_rules.py) as tables, one row per case
of the seeds: protocol.txt "Fencing", fencing.txt, unbounded-ledgers.txt "Protocol
changes" (bookie term vs request term), and the rewrite / LAC / unknown-ledger rules."""

from __future__ import annotations

import pytest

from bookie import ledger_rules as rules
from bookie.errors import RequestError
from bookie.ledger_rules import Copy, LedgerState
from bookie.wire import bookie_pb2 as pb

K = b"key"
OK = pb.OK
REC = pb.RECOVERY_ADD
TRUNC = pb.TRUNCATE | pb.RECOVERY_ADD


def outcome(fn, *args, **kw) -> int:  # type: ignore[no-untyped-def]
    try:
        fn(*args, **kw)
    except RequestError as err:
        return int(err.status)
    return OK


def state(term: int = 0, fenced: bool = False, highest: int = 9) -> LedgerState:
    return LedgerState(K, fenced=fenced, term=term, highest_entry=highest)


# unbounded-ledgers.txt: "bookie <= request: accept, adopt; bookie > request: INVALID_TERM"
# -- for term 0 too; and a term on a bounded ledger is a different mode, refused.
@pytest.mark.parametrize(
    ("bookie_term", "request_term", "status", "term_after"),
    [
        (0, 0, OK, 0),
        (3, 3, OK, 3),
        (3, 5, OK, 5),
        (5, 3, pb.INVALID_TERM, 5),
        (1, 0, pb.INVALID_TERM, 1),  # term 0 on a term-mode ledger (was accepted)
        (0, 2, pb.BAD_REQUEST, 0),  # a term on a bounded ledger
    ],
)
def test_term_rule(bookie_term: int, request_term: int, status: int, term_after: int) -> None:
    st = state(bookie_term)
    assert outcome(rules.apply_term, 1, st, request_term) == status
    assert st.term == term_after


@pytest.mark.parametrize(
    ("st", "key", "flags", "term", "read_only", "status"),
    [
        (None, K, 0, 0, False, OK),  # first contact creates the ledger (first key wins)
        (None, K, 0, 0, True, pb.READ_ONLY),
        (None, K, REC, 0, True, OK),  # recovery adds pass read-only mode
        (state(), b"other", 0, 0, False, pb.UNAUTHORIZED),
        (state(), b"other", REC, 0, False, pb.UNAUTHORIZED),
        (state(fenced=True), K, 0, 0, False, pb.FENCED),
        (state(fenced=True), K, REC, 0, False, OK),  # write-back passes the fence
        (state(), K, TRUNC, 0, False, pb.BAD_REQUEST),  # TRUNCATE without a term
        (state(), K, TRUNC, 4, False, pb.BAD_REQUEST),  # ... or on a bounded ledger
        (None, K, TRUNC, 2, False, OK),  # a term-mode ledger's no-op on a new bookie
        (state(term=2), K, TRUNC, 2, False, OK),
        (state(term=3), K, TRUNC, 2, False, pb.INVALID_TERM),
        (state(), K, pb.NOOP | REC, 0, False, pb.BAD_REQUEST),
        (state(term=2), K, 0, 0, False, pb.INVALID_TERM),
    ],
)
def test_add_rules(
    st: LedgerState | None, key: bytes, flags: int, term: int, read_only: bool, status: int
) -> None:
    assert outcome(rules.check_add, 1, st, key, flags, term, read_only=read_only) == status


P, Q = b"payload", b"other payload"


@pytest.mark.parametrize(
    ("stored", "new", "status"),
    [
        (Copy(P, 10, 0, 0), Copy(P, 10, 0, 0), OK),  # a retry or write-back
        (Copy(P, 10, 0, 1), Copy(P, 10, 0, 2), OK),  # write-back in a later term
        (Copy(P, 10, 0, 0), Copy(Q, 10, 0, 0), pb.BAD_REQUEST),  # a forgery
        (Copy(P, 10, 0, 0), Copy(P, 11, 0, 0), pb.BAD_REQUEST),
        (Copy(P, 10, 0, 2), Copy(Q, 10, 0, 2), pb.BAD_REQUEST),  # same term, other entry
        (Copy(P, 10, 0, 2), Copy(Q, 10, 0, 1), pb.BAD_REQUEST),
        (Copy(P, 10, 0, 1), Copy(Q, 10, 0, 2), OK),  # a later term replaces a leftover
        (Copy(P, 10, 0, 1), Copy(b"", 10, pb.TRUNCATE, 2), OK),  # the new term's no-op
        (Copy(b"", 10, pb.TRUNCATE, 2), Copy(b"", 10, pb.NOOP, 3), OK),  # no-op written back
        (Copy(b"", 10, pb.NOOP, 2), Copy(b"", 10, pb.TRUNCATE, 2), pb.BAD_REQUEST),
        (Copy(b"", 10, pb.NOOP, 2), Copy(b"", 10, 0, 2), pb.BAD_REQUEST),
    ],
)
def test_rewrite_rules(stored: Copy, new: Copy, status: int) -> None:
    assert outcome(rules.check_rewrite, 1, 5, stored, new) == status


@pytest.mark.parametrize(
    ("st", "key", "term", "in_metadata", "status", "fenced"),
    [
        (None, K, 0, True, OK, True),  # created fenced: its writer may still come
        (None, K, 0, None, OK, True),  # no metadata store: BookKeeper's behaviour
        (None, K, 0, False, pb.NO_SUCH_LEDGER, None),  # no writer to stop: no state made
        (state(), K, 0, None, OK, True),
        (state(fenced=True), K, 0, None, OK, True),
        (state(), b"other", 0, None, pb.UNAUTHORIZED, False),
        (state(), K, 2, None, pb.BAD_REQUEST, False),  # FENCE never carries a term
        (state(term=2), K, 0, None, pb.BAD_REQUEST, False),  # term-mode: fenced by terms
    ],
)
def test_fence_rules(
    st: LedgerState | None,
    key: bytes,
    term: int,
    in_metadata: bool | None,
    status: int,
    fenced: bool | None,
) -> None:
    got: list[LedgerState] = []
    assert (
        outcome(lambda: got.append(rules.check_fence(1, st, key, term, in_metadata=in_metadata)[0]))
        == status
    )
    after = got[0] if got else st
    assert (after.fenced if after else None) == fenced


@pytest.mark.parametrize(
    ("st", "term", "in_metadata", "status", "term_after"),
    [
        (None, 3, True, OK, 3),  # the term is the fence: a bookie with nothing adopts it
        (None, 3, False, pb.NO_SUCH_LEDGER, None),
        (state(term=2), 3, None, OK, 3),
        (state(term=4), 3, None, pb.INVALID_TERM, 4),
        (state(), 3, None, pb.BAD_REQUEST, 0),
    ],
)
def test_term_read_rules(
    st: LedgerState | None, term: int, in_metadata: bool | None, status: int, term_after: int
) -> None:
    got: list[LedgerState] = []
    assert (
        outcome(
            lambda: got.append(rules.check_term_read(1, st, K, term, in_metadata=in_metadata)[0])
        )
        == status
    )
    after = got[0] if got else st
    assert (after.term if after else None) == term_after


@pytest.mark.parametrize(
    ("highest", "explicit", "lac", "kept", "reported"),
    [
        (9, -1, 7, 7, 7),
        (9, -1, 10**12, 10**12, 9),  # reported only up to what was written here
        (9, 8, 3, 8, 8),  # never lowered
        (-1, -1, 0, 0, -1),  # a fresh fragment's bookie: reported once entry 0 arrives
    ],
)
def test_explicit_lac_rules(
    highest: int, explicit: int, lac: int, kept: int, reported: int
) -> None:
    st = state(highest=highest)
    st.explicit_lac = explicit
    assert outcome(rules.check_write_lac, 1, st, K, 0, lac) == OK
    assert (st.explicit_lac, st.lac) == (kept, reported)


def test_an_explicit_lac_is_reported_as_its_entries_arrive() -> None:
    st = state(highest=4)
    st.piggyback_lac = 3
    rules.check_write_lac(1, st, K, 0, 6)
    assert st.lac == 4
    st.highest_entry = 6  # entries 5 and 6 came after the LAC write
    assert st.lac == 6


def test_explicit_lac_of_an_unknown_ledger_makes_no_state() -> None:
    assert outcome(rules.check_write_lac, 1, None, K, 0, 5) == pb.NO_SUCH_LEDGER


def test_truncate_lowers_the_lacs() -> None:
    st = state(term=2, highest=20)
    st.piggyback_lac, st.explicit_lac = 19, 18
    rules.truncated(st, 6)
    assert (st.piggyback_lac, st.explicit_lac, st.lac) == (6, 6, 6)
