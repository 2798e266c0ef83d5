"""The writer state machine alone (its inputs fed by hand): fragment rolls against
metadata that someone else changed meanwhile."""

from streamlib.protocol import DigestManager, Fragment, LedgerMetadata
from streamlib.protocol.actions import ChooseBookies, CompleteAdds, ReadMetadata, WriteMetadata
from streamlib.protocol.digest import master_key, password_hash
from streamlib.protocol.writer import LedgerWriter

OK = 1


def writer() -> tuple[LedgerWriter, LedgerMetadata]:
    pw = password_hash(b"")
    md = LedgerMetadata(
        5,
        3,
        3,
        2,
        (Fragment(0, ("a", "b", "c"), 1000, 0),),
        term=1,
        unbounded=True,
        password_hash=pw,
    )
    w = LedgerWriter(
        md, 1, master_key=master_key(pw), digest=DigestManager(5, "crc32c", pw), term=1
    )
    return w, md


def test_a_fragment_roll_survives_a_concurrent_metadata_change():
    w, md = writer()
    first, _ = w.append([b"x", b"y"])
    assert first == 0
    for bookie in ("a", "b", "c"):
        w.on_add_ok(bookie, [0, 1])
    assert w.last_add_confirmed == 1
    (choose,) = w.roll_fragment()
    assert isinstance(choose, ChooseBookies)
    (cas,) = w.on_bookies_chosen(["d", "e", "f"], now_ms=2000)
    assert isinstance(cas, WriteMetadata) and cas.metadata.last_fragment.ensemble == ("d", "e", "f")
    # Meanwhile another client changed the metadata (e.g. retention dropped fragments,
    # or re-replication swapped a bookie of an old fragment): the CAS fails.
    (reread,) = w.on_metadata_conflict()
    assert isinstance(reread, ReadMetadata)
    fresh = md.with_ensemble_change(0, {})  # same content, newer version
    actions = w.on_metadata_read(fresh, 7)
    # The planned roll is retried on the fresh metadata, not dropped.
    (retry,) = [a for a in actions if isinstance(a, WriteMetadata)]
    assert retry.expected_version == 7
    assert retry.metadata.last_fragment == Fragment(2, ("d", "e", "f"))
    assert retry.metadata.last_fragment.created_time_ms == 2000
    assert retry.metadata.last_fragment.start_length == 2
    done = w.on_metadata_written(retry.metadata, 8)
    assert w.fragment_rolls == 1 and not [a for a in done if isinstance(a, CompleteAdds)]
    assert w.metadata.last_fragment.ensemble == ("d", "e", "f")


def _replace_failed(w: LedgerWriter, failed: str, replacement: str, version: int) -> ChooseBookies:
    """One ensemble change: `failed` times out on the pending entry, `replacement` takes
    its slot. Returns the placement request the writer made."""
    entry, _ = w.append([b"e"])
    actions = w.on_add_result(failed, entry, None)
    (choose,) = [a for a in actions if isinstance(a, ChooseBookies)]
    (cas,) = w.on_bookies_chosen([replacement])
    assert isinstance(cas, WriteMetadata)
    w.on_metadata_written(cas.metadata, version)
    for bookie in w.ensemble:
        w.on_add_ok(bookie, [entry])
    assert w.last_add_confirmed == entry
    return choose


def test_a_writer_does_not_ban_bookies_that_failed_in_earlier_changes():
    # E=3 on five bookies: three failures one after the other must leave the writer able
    # to use a bookie that failed before (and came back), not "0 available" forever.
    w, _ = writer()
    _replace_failed(w, "a", "d", 2)
    _replace_failed(w, "d", "e", 3)
    third = _replace_failed(w, "b", "a", 4)
    assert third.exclude == {"e", "b", "c"}  # only the ensemble being changed
    fourth = _replace_failed(w, "c", "d", 5)
    assert fourth.exclude == {"a", "e", "c"}  # d failed two changes ago: usable again
    assert w.state.value == "writing" and w.ensemble == ("e", "a", "d")
