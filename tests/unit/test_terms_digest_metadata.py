"""The next term, entry digests and the protocol's ledger metadata."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamlib.protocol import (
    DigestManager,
    DigestType,
    Fragment,
    LedgerMetadata,
    LedgerState,
    master_key,
    next_term,
    password_hash,
)
from streamlib.protocol.errors import (
    BadRequestError,
    IllegalTransitionError,
    InvalidLedgerConfigError,
)


def test_next_term_increments():
    assert next_term(7) == 8


@pytest.mark.parametrize("kind", ["crc32c", "hmac"])
def test_digest_round_trip_and_tamper_detection(kind):
    dm = DigestManager(42, kind, password_hash(b"secret"))
    digest = dm.compute(5, 4, 70, b"payload")
    assert dm.is_valid(5, 4, 70, b"payload", digest)
    for entry, lac, length, payload in [
        (6, 4, 70, b"payload"),
        (5, 3, 70, b"payload"),
        (5, 4, 71, b"payload"),
        (5, 4, 70, b"payloaX"),
    ]:
        assert not dm.is_valid(entry, lac, length, payload, digest)
    other_ledger = DigestManager(43, kind, password_hash(b"secret"))
    assert not other_ledger.is_valid(5, 4, 70, b"payload", digest)


def test_crc32c_digest_is_four_bytes_hmac_is_keyed():
    crc = DigestManager(1, DigestType.CRC32C, password_hash(b"a"))
    assert len(crc.compute(0, -1, 1, b"x")) == 4
    h1 = DigestManager(1, DigestType.HMAC_SHA256, password_hash(b"a"))
    h2 = DigestManager(1, DigestType.HMAC_SHA256, password_hash(b"b"))
    assert len(h1.compute(0, -1, 1, b"x")) == 32
    assert h1.compute(0, -1, 1, b"x") != h2.compute(0, -1, 1, b"x")


def test_unknown_digest_type_and_non_bytes_password_are_typed_errors():
    with pytest.raises(BadRequestError):
        DigestType.parse("md5")
    with pytest.raises(BadRequestError):
        password_hash("text")  # type: ignore[arg-type]


def test_master_key_is_derived_not_the_password():
    pw = b"secret"
    assert master_key(password_hash(pw)) != pw
    assert master_key(password_hash(pw)) != master_key(password_hash(b"other"))


@given(st.binary(max_size=512), st.integers(0, 2**62), st.integers(-1, 2**62))
def test_crc_digest_detects_any_single_byte_flip(payload, entry_id, lac):
    dm = DigestManager(9, "crc32c", b"")
    digest = dm.compute(entry_id, lac, len(payload), payload)
    for i in range(len(payload)):
        flipped = bytearray(payload)
        flipped[i] ^= 0x01
        assert not dm.is_valid(entry_id, lac, len(payload), bytes(flipped), digest)


def ledger(**kw):
    base = dict(
        ledger_id=1,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        fragments=(Fragment(0, ("b1", "b2", "b3")),),
    )
    base.update(kw)
    return LedgerMetadata(**base)


def test_metadata_rejects_bad_quorums_and_fragments():
    with pytest.raises(InvalidLedgerConfigError):
        ledger(write_quorum=4)
    with pytest.raises(InvalidLedgerConfigError):
        ledger(fragments=(Fragment(0, ("b1", "b2")),))
    with pytest.raises(InvalidLedgerConfigError):
        ledger(fragments=(Fragment(0, ("b1", "b1", "b3")),))
    with pytest.raises(InvalidLedgerConfigError):
        ledger(fragments=(Fragment(5, ("b1", "b2", "b3")), Fragment(2, ("b1", "b2", "b3"))))


def test_ensemble_change_adds_fragment_and_write_sets_follow_it():
    # protocol.txt "Ensembles": B1 replaced by B4 from entry 12.
    md = ledger().with_ensemble_change(12, {0: "b4"})
    assert md.fragments == (Fragment(0, ("b1", "b2", "b3")), Fragment(12, ("b4", "b2", "b3")))
    assert md.write_set_bookies(11) == ("b3", "b1")
    assert md.write_set_bookies(12) == ("b4", "b2")
    # A second change at the same entry replaces the still-empty fragment.
    md2 = md.with_ensemble_change(12, {1: "b5"})
    assert md2.fragments[-1] == Fragment(12, ("b4", "b5", "b3"))
    assert len(md2.fragments) == 2


def test_recovery_then_close_and_no_writer_close_after_recovery_started():
    md = ledger().in_recovery()
    assert md.state is LedgerState.IN_RECOVERY
    with pytest.raises(IllegalTransitionError):
        md.closed_by_writer(5, 100)
    closed = md.closed_by_recovery(12, 1300)
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 12, 1300)
    with pytest.raises(IllegalTransitionError):
        closed.in_recovery()


def test_fragment_retention_drops_a_prefix_and_keeps_the_last_fragment():
    md = LedgerMetadata(
        7, 3, 2, 2, (Fragment(0, ("a", "b", "c"), 1000, 0),), unbounded=True, term=1
    )
    md = md.with_ensemble_change(10, {0: "d"}, created_time_ms=2000, start_length=500)
    md = md.with_ensemble_change(20, {1: "e"}, created_time_ms=3000, start_length=900)
    assert [(f.created_time_ms, f.start_length) for f in md.fragments] == [
        (1000, 0),
        (2000, 500),
        (3000, 900),
    ]
    trimmed = md.with_fragments_dropped(2)
    assert trimmed.first_entry_id == 20 and trimmed.fragments == md.fragments[2:]
    assert trimmed.state is md.state and trimmed.term == md.term
    assert md.with_fragments_dropped(0) is md
    with pytest.raises(BadRequestError):
        md.with_fragments_dropped(3)  # the last fragment always stays
    with pytest.raises(InvalidLedgerConfigError):
        md.in_recovery(term=2).with_fragments_dropped(1)
    # A fragment replacing the last one (no entry written to it) keeps its annotations.
    again = trimmed.with_ensemble_change(20, {2: "f"}, created_time_ms=9999, start_length=1)
    assert (again.last_fragment.created_time_ms, again.last_fragment.start_length) == (3000, 900)


def test_fragment_annotations_survive_the_metadata_codec():
    from streamlib.ledger.codec import metadata_from_pb, metadata_to_pb

    md = LedgerMetadata(
        7,
        3,
        2,
        2,
        (Fragment(0, ("a", "b", "c"), 1000, 0), Fragment(5, ("a", "b", "d"), 2000, None)),
    )
    back = metadata_from_pb(metadata_to_pb(md))
    assert [
        (f.first_entry_id, f.ensemble, f.created_time_ms, f.start_length) for f in back.fragments
    ] == [
        (0, ("a", "b", "c"), 1000, 0),
        (5, ("a", "b", "d"), 2000, None),
    ]


def test_large_payload_digest_equals_the_one_call_form():
    """Big payloads are checksummed in two calls (no copy); the digest is the same."""
    import struct

    import crc32c

    dm = DigestManager(9, DigestType.CRC32C, password_hash(b"pw"))
    for size in (0, 100, 16384, 16385, 200_000):
        payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        header = struct.pack(">qqqq", 9, 3, 2, size)
        assert dm.compute(3, 2, size, payload) == crc32c.crc32c(header + payload).to_bytes(4, "big")


def test_copies_older_than_their_fragment_are_leftovers():
    md = LedgerMetadata(1, 3, 2, 2, (Fragment(0, ("a", "b", "c"), term=1),), term=1, unbounded=True)
    changed = md.with_ensemble_change(4, {0: "d"}, term=3)
    assert changed.last_fragment.term == 3
    assert changed.copy_is_current(2, 1) and changed.copy_is_current(5, 3)
    assert not changed.copy_is_current(5, 2)  # written under term 2 into a term-3 fragment
    assert changed.copy_is_current(6, 4)
    bounded = LedgerMetadata(2, 3, 2, 2, (Fragment(0, ("a", "b", "c")),))
    assert bounded.copy_is_current(0, 0)
