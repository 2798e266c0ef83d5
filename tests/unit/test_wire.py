"""The committed generated code is fresh and the client's status codes match the wire."""

import subprocess
import sys
from pathlib import Path

from bookie.wire import bookie_pb2
from streamlib.protocol.errors import StatusCode, error_for_status

ROOT = Path(__file__).resolve().parents[2]


def test_committed_generated_code_is_not_stale():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"generated code is stale; run scripts/gen_protos.py\n{result.stdout}{result.stderr}"
    )


def test_status_codes_mirror_the_wire():
    wire = dict(bookie_pb2.StatusCode.items())
    assert wire == {code.name: code.value for code in StatusCode}


def test_every_error_status_maps_to_its_exception():
    for code in StatusCode:
        if code in (StatusCode.OK, StatusCode.STATUS_UNSPECIFIED):
            continue
        err = error_for_status(code, "detail")
        assert err.code is code
        assert "detail" in str(err)
    assert error_for_status(12345).code is StatusCode.BAD_REQUEST


def test_add_stream_carries_batches_with_flags_and_term():
    request = bookie_pb2.AddRequest(
        entries=[
            bookie_pb2.AddEntry(
                ledger_id=1,
                entry_id=i,
                payload=b"x",
                flags=bookie_pb2.RECOVERY_ADD | bookie_pb2.TRUNCATE,
                term=3,
            )
            for i in range(3)
        ]
    )
    decoded = bookie_pb2.AddRequest.FromString(request.SerializeToString())
    assert [e.entry_id for e in decoded.entries] == [0, 1, 2]
    assert decoded.entries[0].flags == 3 and decoded.entries[0].term == 3


def test_entries_serialized_once_make_the_same_add_request():
    """The client serializes an entry once (shared prefix + body) and sends batches as
    AddRequestFramed; a bookie must parse exactly the AddRequest it would get from
    building the messages field by field."""
    from streamlib.ledger.bookie_client import frame_add
    from streamlib.ledger.codec import add_body, add_prefix
    from streamlib.protocol.actions import EntryData, SendAdd

    entries = tuple(EntryData(i, i - 1, 100 * (i + 1), b"p%d" % i, b"dg%d" % i) for i in range(3))
    for flags, term in ((0, 0), (3, 7)):
        action = SendAdd("b1", 42, entries, b"mk", flags, term)
        expected = bookie_pb2.AddRequest(
            entries=[
                bookie_pb2.AddEntry(
                    ledger_id=42,
                    entry_id=e.entry_id,
                    last_add_confirmed=e.last_add_confirmed,
                    length=e.length,
                    payload=e.payload,
                    digest=e.digest,
                    master_key=b"mk",
                    flags=flags,
                    term=term,
                )
                for e in entries
            ]
        )
        framed = [add_prefix(action) + add_body(e) for e in entries]
        wire = bookie_pb2.AddRequestFramed(entries=framed).SerializeToString()
        assert bookie_pb2.AddRequest.FromString(wire) == expected
        assert [frame_add(e) for e in expected.entries] == [
            e.SerializeToString() for e in expected.entries
        ]
