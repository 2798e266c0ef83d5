"""Request validation: every field a client sends is checked before it touches storage.

Each check raises a typed :class:`RequestError` whose status is the wire answer
(BAD_REQUEST or TOO_LARGE) and whose message names the field and the limit.
"""

from __future__ import annotations

from bookie.errors import BadRequestError, TooLargeError
from bookie.records import EntryHeader
from bookie.wire import bookie_pb2 as pb

KNOWN_ADD_FLAGS = pb.RECOVERY_ADD | pb.TRUNCATE | pb.NOOP
KNOWN_READ_FLAGS = pb.FENCE
MAX_KEY_BYTES = 1024
MAX_DIGEST_BYTES = 1024
MAX_RANGE_ENTRIES = 10_000
MAX_LONG_POLL_S = 60.0


def check_ledger_id(ledger_id: int) -> None:
    if ledger_id < 0:
        raise BadRequestError(f"ledger_id {ledger_id} is negative; ids are >= 0")


def check_add(h: EntryHeader, ae: pb.AddEntry, body_bytes: int, max_entry_bytes: int) -> None:
    """Cheap on the hot path: the payload is only measured when the record is big."""
    if h.ledger_id < 0 or h.entry_id < 0:
        raise BadRequestError(f"bad ids {h.ledger_id}:{h.entry_id}; ids are >= 0")
    if h.flags & ~KNOWN_ADD_FLAGS:
        raise BadRequestError(f"unknown add flag bits {h.flags & ~KNOWN_ADD_FLAGS:#x}")
    if not -1 <= h.last_add_confirmed < h.entry_id:
        raise BadRequestError(
            f"last_add_confirmed {h.last_add_confirmed} of entry {h.entry_id} must be in "
            f"[-1, entry_id)"
        )
    if ae.length < 0:
        raise BadRequestError(f"entry {h.ledger_id}:{h.entry_id} has a negative length {ae.length}")
    if body_bytes > max_entry_bytes and len(ae.payload) > max_entry_bytes:
        raise TooLargeError(
            f"entry {h.ledger_id}:{h.entry_id} payload is {len(ae.payload)} bytes; "
            f"the limit is {max_entry_bytes}"
        )
    if len(h.master_key) > MAX_KEY_BYTES or (
        body_bytes > MAX_DIGEST_BYTES and len(ae.digest) > MAX_DIGEST_BYTES
    ):
        raise BadRequestError(
            f"master_key/digest longer than {MAX_KEY_BYTES}/{MAX_DIGEST_BYTES} bytes"
        )


def check_read_flags(flags: int, master_key: bytes) -> bool:
    """Whether the request fences; raises for unknown bits or a fence without a key."""
    if flags & ~KNOWN_READ_FLAGS:
        raise BadRequestError(f"unknown read flag bits {flags & ~KNOWN_READ_FLAGS:#x}")
    fence = bool(flags & pb.FENCE)
    if fence and not master_key:
        raise BadRequestError("a FENCE request needs the ledger's master_key")
    if len(master_key) > MAX_KEY_BYTES:
        raise BadRequestError(f"master_key longer than {MAX_KEY_BYTES} bytes")
    return fence


def check_read(r: pb.ReadRequest) -> bool:
    check_ledger_id(r.ledger_id)
    if r.first_entry_id < 0 or r.last_entry_id < r.first_entry_id:
        raise BadRequestError(
            f"bad entry range {r.first_entry_id}..{r.last_entry_id}; need 0 <= first <= last"
        )
    if r.last_entry_id - r.first_entry_id >= MAX_RANGE_ENTRIES:
        raise BadRequestError(f"a range read covers at most {MAX_RANGE_ENTRIES} entries")
    return check_read_flags(r.flags, r.master_key)


def check_read_lac(r: pb.ReadLacRequest) -> bool:
    check_ledger_id(r.ledger_id)
    if r.previous_lac < -1:
        raise BadRequestError(f"previous_lac {r.previous_lac} is below -1")
    return check_read_flags(r.flags, r.master_key)


def check_write_lac(r: pb.WriteLacRequest) -> None:
    check_ledger_id(r.ledger_id)
    if r.last_add_confirmed < -1:
        raise BadRequestError(f"last_add_confirmed {r.last_add_confirmed} is below -1")
    if len(r.master_key) > MAX_KEY_BYTES:
        raise BadRequestError(f"master_key longer than {MAX_KEY_BYTES} bytes")
