"""Conversions at the boundary between the protocol's values and what is stored / sent:
ledger metadata (protocol dataclass <-> metadata.schemas protobuf) and entries
(protocol EntryData <-> bookie wire)."""

from __future__ import annotations

from bookie.wire import bookie_pb2 as pb
from metadata import schemas
from metadata.errors import SchemaError
from streamlib.protocol import DigestType, Fragment, LedgerMetadata, LedgerState
from streamlib.protocol.actions import EntryData, SendAdd

_STATE_TO_PB = {
    LedgerState.OPEN: schemas.LedgerState.OPEN,
    LedgerState.IN_RECOVERY: schemas.LedgerState.IN_RECOVERY,
    LedgerState.CLOSED: schemas.LedgerState.CLOSED,
}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}
_DIGEST_TO_PB = {
    DigestType.CRC32C: schemas.DigestType.CRC32C,
    DigestType.HMAC_SHA256: schemas.DigestType.HMAC_SHA256,
}
_DIGEST_FROM_PB = {v: k for k, v in _DIGEST_TO_PB.items()}


def _fragment_to_pb(f: Fragment) -> schemas.Fragment:
    fragment = schemas.Fragment(
        first_entry_id=f.first_entry_id,
        bookies=list(f.ensemble),
        created_time_ms=f.created_time_ms,
        term=f.term,
    )
    if f.start_length is not None:
        fragment.start_length = f.start_length
    return fragment


def metadata_to_pb(md: LedgerMetadata) -> schemas.LedgerMetadata:
    return schemas.LedgerMetadata(
        ledger_id=md.ledger_id,
        ensemble_size=md.ensemble_size,
        write_quorum=md.write_quorum,
        ack_quorum=md.ack_quorum,
        state=_STATE_TO_PB[md.state],
        last_entry_id=md.last_entry_id,
        length=md.length,
        fragments=[_fragment_to_pb(f) for f in md.fragments],
        digest_type=_DIGEST_TO_PB[md.digest_type],
        password_hash=md.password_hash,
        term=md.term,
        unbounded=md.unbounded,
        first_entry_id=md.first_entry_id,
        custom_metadata=dict(md.custom_metadata),
        creation_time_ms=md.creation_time_ms,
        key_version=md.key_version,
    )


def metadata_from_pb(stored: schemas.LedgerMetadata) -> LedgerMetadata:
    try:
        state = _STATE_FROM_PB[stored.state]
        digest = _DIGEST_FROM_PB[stored.digest_type]
    except KeyError as missing:
        raise SchemaError(
            f"ledger {stored.ledger_id}: unknown state or digest type {missing}"
        ) from None
    return LedgerMetadata(
        ledger_id=stored.ledger_id,
        ensemble_size=stored.ensemble_size,
        write_quorum=stored.write_quorum,
        ack_quorum=stored.ack_quorum,
        fragments=tuple(
            Fragment(
                f.first_entry_id,
                tuple(f.bookies),
                f.created_time_ms,
                f.start_length if f.HasField("start_length") else None,
                f.term,
            )
            for f in stored.fragments
        ),
        state=state,
        last_entry_id=stored.last_entry_id,
        length=stored.length,
        digest_type=digest,
        password_hash=stored.password_hash,
        term=stored.term,
        unbounded=stored.unbounded,
        first_entry_id=stored.first_entry_id,
        custom_metadata=dict(stored.custom_metadata),
        creation_time_ms=stored.creation_time_ms,
        key_version=stored.key_version,
    )


def add_prefix(action: SendAdd) -> bytes:
    """The fields every entry of a SendAdd shares, serialized (an AddEntry's encoding
    may be split anywhere between fields: concatenated encodings merge)."""
    return pb.AddEntry(
        ledger_id=action.ledger_id,
        master_key=action.master_key,
        flags=action.flags,
        term=action.term,
    ).SerializeToString()


def add_body(entry: EntryData) -> bytes:
    """The entry's own fields, serialized; add_prefix(action) + this = its AddEntry."""
    return pb.AddEntry(
        entry_id=entry.entry_id,
        last_add_confirmed=entry.last_add_confirmed,
        length=entry.length,
        payload=entry.payload,
        digest=entry.digest,
    ).SerializeToString()


def entry_from_pb(entry: pb.Entry) -> EntryData:
    return EntryData(
        entry.entry_id,
        entry.last_add_confirmed,
        entry.length,
        entry.payload,
        entry.digest,
        entry.flags,
        entry.term,
    )
