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
