"""The rules of streamlib.protocol.read_rules, as a table."""

import pytest

from streamlib.protocol.read_rules import refresh_before_using_lac, retry_read_after_refresh
from streamlib.protocol.states import LedgerState

OPEN, RECOVERING, CLOSED = LedgerState.OPEN, LedgerState.IN_RECOVERY, LedgerState.CLOSED


@pytest.mark.parametrize(
    ("term", "state", "answer_term", "advanced", "refresh"),
    [
        (3, OPEN, 3, True, False),  # the common case: use the LAC at once
        (0, OPEN, 0, True, False),  # bounded ledgers have no terms
        (3, OPEN, 4, True, True),  # a newer term took over: its fragments may be new
        (3, RECOVERING, 3, True, True),  # a term's recovery may replace bookies
        (3, OPEN, 3, False, True),  # no progress: maybe the writer moved on
        (3, CLOSED, 9, False, False),  # a closed ledger's metadata is final
    ],
)
def test_when_a_reader_refreshes_before_using_a_lac(term, state, answer_term, advanced, refresh):
    assert refresh_before_using_lac(term, state, answer_term, advanced) is refresh


def test_a_failed_read_is_retried_only_on_changed_metadata_of_an_open_ledger():
    assert retry_read_after_refresh(closed_before=False, version_before=3, version_now=4)
    assert not retry_read_after_refresh(closed_before=False, version_before=3, version_now=3)
    assert not retry_read_after_refresh(closed_before=True, version_before=3, version_now=4)


def test_a_tailing_reader_polls_a_bookie_that_will_hold_the_next_entry():
    from streamlib.protocol import Fragment, LedgerMetadata
    from streamlib.protocol.read_rules import long_poll_bookie

    # E=3, Qw=2; a fragment rolled at entry 20 onto the same bookies in another order.
    md = LedgerMetadata(
        ledger_id=1,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        fragments=(Fragment(16, ("a", "b", "c")), Fragment(20, ("c", "a", "b"))),
    )
    # Entry 19 lives on b and c (index 1, 2 of the fragment at 16), not on a -- the
    # bookie at index 19 % 3 of the LAST fragment, which the old rule asked.
    assert [long_poll_bookie(md, 19, f) for f in range(3)] == ["b", "c", "a"]
    assert [long_poll_bookie(md, 21, f) for f in range(3)] == ["c", "a", "b"]


def test_a_writer_publishes_its_lac_where_the_lac_entry_lives_and_to_its_ensemble():
    from streamlib.protocol import Fragment, LedgerMetadata
    from streamlib.protocol.read_rules import explicit_lac_bookies

    # The fragment rolled right after entry 19 onto other bookies: they hold nothing of 19.
    md = LedgerMetadata(
        ledger_id=1,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        fragments=(Fragment(16, ("a", "b", "c")), Fragment(20, ("d", "e", "a"))),
    )
    assert explicit_lac_bookies(md, 19) == ("b", "c", "d", "e", "a")
    assert explicit_lac_bookies(md, -1) == ("d", "e", "a")
