"""Entry digests and the keys derived from a ledger password (protocol.txt "Writing to
ledgers": each entry carries ledger id, entry id, LAC and payload; readers verify).

The digest covers the header (ledger id, entry id, LAC, length), packed as four
big-endian int64, followed by the payload. As in BookKeeper's entry header, length is the
ledger's length in bytes up to and including this entry, so the last entry of a ledger
tells its total length (recovery uses this to close a ledger with the right length).

- ``crc32c`` (default): CRC32C, 4 bytes big-endian. Catches corruption, not forgery.
- ``hmac``: HMAC-SHA256 keyed by a MAC key derived from the password, 32 bytes.

Keys. The ledger metadata stores ``password_hash = sha256("streamlib-password:" +
password)``; the master key the bookies check on adds and fencing, and the MAC key, are
derived from that hash. So a client opening with a wrong password is refused before it
talks to a bookie, and auto-recovery (which reads the metadata) can re-replicate with
recovery adds, as BookKeeper does when it stores ledger passwords in metadata. The
password itself is never stored or sent.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct

import crc32c

from streamlib.protocol.errors import BadRequestError, DigestMismatchError

_HEADER = struct.Struct(">qqqq")


class DigestType(enum.Enum):
    CRC32C = "crc32c"
    HMAC_SHA256 = "hmac"

    @classmethod
    def parse(cls, value: DigestType | str) -> DigestType:
        if isinstance(value, DigestType):
            return value
        for member in cls:
            if value in (member.value, member.name, member.name.lower()):
                return member
        raise BadRequestError(f"unknown digest type {value!r}; use 'crc32c' or 'hmac'")


def password_hash(password: bytes) -> bytes:
    if not isinstance(password, bytes | bytearray):
        raise BadRequestError(f"password must be bytes, got {type(password).__name__}")
    return hashlib.sha256(b"streamlib-password:" + bytes(password)).digest()


def master_key(pw_hash: bytes) -> bytes:
    """The key bookies remember from a ledger's first writer and check on adds / fencing."""
    return hashlib.sha256(b"streamlib-master-key:" + pw_hash).digest()


def mac_key(pw_hash: bytes) -> bytes:
    return hashlib.sha256(b"streamlib-mac-key:" + pw_hash).digest()


class DigestManager:
    """Computes and verifies the digests of one ledger's entries."""

    def __init__(self, ledger_id: int, digest_type: DigestType | str, pw_hash: bytes) -> None:
        self.ledger_id = ledger_id
        self.digest_type = DigestType.parse(digest_type)
        self._mac_key = mac_key(pw_hash)

    def compute(self, entry_id: int, last_add_confirmed: int, length: int, payload: bytes) -> bytes:
        header = _HEADER.pack(self.ledger_id, entry_id, last_add_confirmed, length)
        if self.digest_type is DigestType.CRC32C:
            if len(payload) <= 16384:  # one call over a copy beats two calls when small
                return crc32c.crc32c(header + payload).to_bytes(4, "big")
            return crc32c.crc32c(payload, crc32c.crc32c(header)).to_bytes(4, "big")
        mac = hmac.new(self._mac_key, header, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def verify(
        self, entry_id: int, last_add_confirmed: int, length: int, payload: bytes, digest: bytes
    ) -> None:
        """Raise DigestMismatchError unless digest matches: the caller tries another replica."""
        expected = self.compute(entry_id, last_add_confirmed, length, payload)
        if not hmac.compare_digest(expected, digest):
            raise DigestMismatchError(
                f"ledger {self.ledger_id} entry {entry_id}: {self.digest_type.value} digest mismatch"
            )

    def is_valid(
        self, entry_id: int, last_add_confirmed: int, length: int, payload: bytes, digest: bytes
    ) -> bool:
        expected = self.compute(entry_id, last_add_confirmed, length, payload)
        return hmac.compare_digest(expected, digest)
