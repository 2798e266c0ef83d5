"""Stored records: round trips, and SchemaError for anything that is not one."""

from __future__ import annotations

import pytest

from metadata import SchemaError
from metadata import schemas as s

RECORDS = [
    s.LedgerMetadata(
        ledger_id=7,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        state=s.LedgerState.CLOSED,
        last_entry_id=99,
        length=4096,
        fragments=[s.Fragment(first_entry_id=0, bookies=["b1", "b2", "b3"])],
        digest_type=s.DigestType.HMAC_SHA256,
        password_hash=b"\x01\x02",
        custom_metadata={"app": b"x"},
        creation_time_ms=1,
    ),
    s.StreamMetadata(
        name="orders",
        mode=s.StreamMode.MANAGED,
        ledgers=[s.LedgerInfo(ledger_id=1, entries=10, size_bytes=100, created_time_ms=5)],
        properties={"owner": "team"},
        ledger_config=s.LedgerConfig(ensemble_size=3, write_quorum=3, ack_quorum=2),
        rollover=s.RolloverPolicy(max_entries=1000),
        retention=s.RetentionPolicy(time_ms=60_000),
    ),
    s.CursorState(
        mark_delete=s.Position(ledger_id=1, entry_id=4, batch_index=-1),
        individually_acked=[
            s.PositionRange(
                lower=s.Position(ledger_id=1, entry_id=6), upper=s.Position(ledger_id=1, entry_id=8)
            )
        ],
        properties={"k": 1},
    ),
    s.BookieInfo(bookie_id="b1", address="127.0.0.1:3181", rack="/r1", free_bytes=10),
    s.Cookie(
        bookie_id="b1",
        instance_id="i",
        journal_dir="/j",
        data_dirs=["/d1", "/d2"],
        cluster_instance_id="c",
    ),
    s.ClusterInstance(instance_id="c", created_ms=7),
    s.UnderReplicatedLedger(ledger_id=3, missing_bookies=["b2"], marked_ms=9),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_records_round_trip_with_the_current_format_version(record):
    decoded = s.decode(type(record), s.encode(record))
    assert decoded == record
    assert decoded.format_version == s.FORMAT_VERSION


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_newer_format_version_is_refused(record):
    future = type(record)()
    future.CopyFrom(record)
    future.format_version = s.FORMAT_VERSION + 1
    with pytest.raises(SchemaError, match="newer"):
        s.decode(type(record), future.SerializeToString())
    with pytest.raises(SchemaError):
        s.encode(future)


@pytest.mark.parametrize(
    "data", [b"", b"\xff\xff\xff\xff", b"\x0a\x05abc", b"garbage that is not protobuf"], ids=repr
)
@pytest.mark.parametrize("cls", [type(r) for r in RECORDS], ids=lambda c: c.__name__)
def test_garbage_bytes_are_a_schema_error_never_a_default_record(cls, data):
    with pytest.raises(SchemaError):
        s.decode(cls, data)


def test_only_stored_records_can_be_encoded():
    with pytest.raises(SchemaError):
        s.encode(s.Position(ledger_id=1))
