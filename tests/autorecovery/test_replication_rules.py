"""The pure decisions of auto-recovery (streamlib.protocol.replication), table by table."""

from __future__ import annotations

import pytest

from streamlib.protocol import Fragment, LedgerMetadata
from streamlib.protocol.errors import NotEnoughBookiesError
from streamlib.protocol.replication import (
    FragmentCopy,
    FragmentRange,
    ReplicationPlan,
    choose_replacement,
    entries_on_bookie,
    fragment_ranges,
    plan_replication,
    still_referenced,
)
from streamlib.protocol.states import LedgerState


def ledger(
    fragments: list[tuple[int, tuple[str, ...]]],
    *,
    state: LedgerState = LedgerState.OPEN,
    last: int = -1,
    e: int = 3,
    qw: int = 2,
    first_entry_id: int = 0,
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=7,
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=2,
        fragments=tuple(Fragment(f, ens) for f, ens in fragments),
        state=state,
        last_entry_id=last,
        first_entry_id=first_entry_id,
    )


ABC = ("a", "b", "c")
ABD = ("a", "b", "d")


def test_ranges_of_a_closed_ledger_end_at_its_last_entry() -> None:
    md = ledger([(0, ABC), (10, ABD)], state=LedgerState.CLOSED, last=14)
    assert fragment_ranges(md) == [
        FragmentRange(0, 0, 9, ABC),
        FragmentRange(1, 10, 14, ABD),
    ]


def test_the_last_fragment_of_an_open_ledger_is_not_sealed() -> None:
    ranges = fragment_ranges(ledger([(0, ABC), (10, ABD)]))
    assert ranges[0].is_sealed and ranges[0].last == 9
    assert not ranges[1].is_sealed


def test_ranges_skip_entries_dropped_by_retention() -> None:
    md = ledger([(0, ABC), (10, ABD)], state=LedgerState.CLOSED, last=14, first_entry_id=12)
    assert [(r.first, r.last) for r in fragment_ranges(md)] == [(12, 9), (12, 14)]
    assert fragment_ranges(md)[0].is_empty


def test_a_bookie_holds_the_entries_whose_write_set_includes_it() -> None:
    md = ledger([(0, ABC)], state=LedgerState.CLOSED, last=5)  # E=3, Qw=2
    fragment = fragment_ranges(md)[0]
    for bookie in ABC:
        held = list(entries_on_bookie(md, fragment, bookie))
        assert held == [e for e in range(6) if bookie in md.write_set_bookies(e)]
    assert list(entries_on_bookie(md, fragment, "a")) == [0, 2, 3, 5]


def test_with_qw_equal_to_e_every_bookie_holds_every_entry() -> None:
    md = ledger([(0, ABC)], state=LedgerState.CLOSED, last=4, qw=3)
    assert list(entries_on_bookie(md, fragment_ranges(md)[0], "b")) == [0, 1, 2, 3, 4]


def test_entries_of_an_unsealed_fragment_are_not_decided() -> None:
    md = ledger([(0, ABC)])
    with pytest.raises(ValueError):
        entries_on_bookie(md, fragment_ranges(md)[0], "a")


def test_still_referenced() -> None:
    md = ledger([(0, ABC), (10, ABD)])
    assert still_referenced(md, {"c", "z"}) == {"c"}


def test_a_closed_ledger_is_copied_fragment_by_fragment() -> None:
    md = ledger([(0, ABC), (4, ABD)], state=LedgerState.CLOSED, last=5, qw=3)
    plan = plan_replication(md, {"a"}, now_ms=0, marked_ms=0, grace_period_ms=1000)
    assert plan.copies == (
        FragmentCopy(0, "a", range(0, 4)),
        FragmentCopy(1, "a", range(4, 6)),
    )
    assert not plan.recover and plan.wait_until_ms is None and not plan.is_done


def test_an_empty_fragment_is_swapped_without_copying() -> None:
    md = ledger([(0, ABC)], state=LedgerState.CLOSED, last=-1)
    plan = plan_replication(md, {"b"}, now_ms=0, marked_ms=0, grace_period_ms=0)
    assert plan.copies == (FragmentCopy(0, "b", []),)


def test_nothing_missing_is_done() -> None:
    md = ledger([(0, ABC)], state=LedgerState.CLOSED, last=3)
    assert plan_replication(md, {"z"}, now_ms=0, marked_ms=0, grace_period_ms=0).is_done


@pytest.mark.parametrize(
    ("now_ms", "recover", "wait_until_ms"),
    [(0, False, 5000), (4999, False, 5000), (5000, True, None), (9000, True, None)],
)
def test_an_open_ledgers_last_fragment_waits_out_the_writers_grace(
    now_ms: int, recover: bool, wait_until_ms: int | None
) -> None:
    md = ledger([(0, ABC), (10, ABD)])
    plan = plan_replication(md, {"b"}, now_ms=now_ms, marked_ms=0, grace_period_ms=5000)
    # The sealed first fragment is copied at once, whatever the grace period.
    assert plan.copies == (
        FragmentCopy(0, "b", entries_on_bookie(md, fragment_ranges(md)[0], "b")),
    )
    assert plan.recover is recover
    assert plan.wait_until_ms == wait_until_ms


def test_an_open_ledger_whose_sealed_fragments_lost_the_bookie_needs_no_wait() -> None:
    md = ledger([(0, ABC), (10, ABD)])
    plan = plan_replication(md, {"c"}, now_ms=0, marked_ms=0, grace_period_ms=5000)
    assert len(plan.copies) == 1 and not plan.recover and plan.wait_until_ms is None


@pytest.mark.parametrize("lost", ["a", "d"])
def test_an_abandoned_recovery_is_finished_before_anything_is_copied(lost: str) -> None:
    md = ledger([(0, ABC), (5, ABD)], state=LedgerState.IN_RECOVERY)
    plan = plan_replication(md, {lost}, now_ms=0, marked_ms=0, grace_period_ms=60_000)
    assert plan == ReplicationPlan(recover=True)


def test_a_ledger_in_recovery_without_missing_bookies_is_left_alone() -> None:
    md = ledger([(0, ABC)], state=LedgerState.IN_RECOVERY)
    assert plan_replication(md, {"z"}, now_ms=0, marked_ms=0, grace_period_ms=0).is_done


def test_replacement_is_outside_the_ensemble_and_stable_per_ledger() -> None:
    assert choose_replacement(["a", "b", "c", "d", "e"], ABC, 7) in {"d", "e"}
    assert choose_replacement(["e", "d", "a"], ABC, 7) == choose_replacement(["d", "e"], ABC, 7)
    assert choose_replacement(["a", "d"], ABC, 1) == "d"
    with pytest.raises(NotEnoughBookiesError):
        choose_replacement(["a", "b", "c"], ABC, 7)
