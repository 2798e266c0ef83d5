"""Entry digests and the keys derived from a ledger password (protocol.txt "Writing to
ledgers": each entry carries ledger id, entry id, LAC and payload; readers verify).

The digest covers the header (ledger id, entry id, LAC, length), packed as four
big-endian int64, followed by the payload. As in BookKeeper's entry header, length is the
ledger's length in bytes up to and including this entry, so the last entry of a ledger
tells its total length (recovery uses this to close a ledger with the right length).

- ``crc32c`` (default): CRC32C, 4 bytes big-endian. Catches corruption, not forgery.
- ``hmac``: HMAC-SHA256 keyed by a MAC key derived from the password, 32 bytes.

Keys. The ledger metadata stores ``password_hash = sha256("streamlib-password:" +
password)``, so a client opening with a wrong password is refused before it talks to a
bookie. The master key the bookies check on adds and fencing, and the MAC key, derive
from the ledger's *key material* (:func:`key_material`), by key version:

- 0 (ledgers made before key version 1): the material is password_hash itself, so
  anyone who reads the ledger's metadata could derive the master key.
- 1 (every new ledger): the material is ``sha256("streamlib-key-v1:" + password)``; the
  metadata's hash no longer leads to it. The password is kept in a private metadata node
  (LedgerMetadataManager.read_secret: only the writers' metadata identity reads it), as
  BookKeeper keeps ledger passwords in ZooKeeper, so auto-recovery can re-replicate and a
  stream's next writer can recover its ledgers. Readers of a crc32c ledger need no key.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct

import crc32c

from streamlib.protocol.errors import BadRequestError

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


KEY_VERSION = 1  # what new ledgers use


def key_material(key_version: int, password: bytes | None, pw_hash: bytes) -> bytes:
    """The secret master_key and mac_key derive from (see the module's "Keys"). With
    key version 1 and no password there is none (b""): enough to read a crc32c ledger,
    never to write, fence or verify an hmac digest."""
    if key_version == 0:
        return pw_hash
    if key_version == 1:
        if password is None:
            return b""
        return hashlib.sha256(b"streamlib-key-v1:" + bytes(password)).digest()
    raise BadRequestError(f"unknown ledger key version {key_version}: upgrade this client")


def master_key(material: bytes) -> bytes:
    """The key bookies remember from a ledger's first writer and check on adds / fencing
    (material: key_material's; for key version 0 the password hash)."""
    return hashlib.sha256(b"streamlib-master-key:" + material).digest()


def mac_key(material: bytes) -> bytes:
    return hashlib.sha256(b"streamlib-mac-key:" + material).digest()


class DigestManager:
    """Computes and verifies the digests of one ledger's entries."""

    def __init__(self, ledger_id: int, digest_type: DigestType | str, material: bytes) -> None:
        self.ledger_id = ledger_id
        self.digest_type = DigestType.parse(digest_type)
        self._mac_key = mac_key(material)

    def compute(self, entry_id: int, last_add_confirmed: int, length: int, payload: bytes) -> bytes:
        header = _HEADER.pack(self.ledger_id, entry_id, last_add_confirmed, length)
        if self.digest_type is DigestType.CRC32C:
            if len(payload) <= 16384:  # one call over a copy beats two calls when small
                return crc32c.crc32c(header + payload).to_bytes(4, "big")
            return crc32c.crc32c(payload, crc32c.crc32c(header)).to_bytes(4, "big")
        mac = hmac.new(self._mac_key, header, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def is_valid(
        self, entry_id: int, last_add_confirmed: int, length: int, payload: bytes, digest: bytes
    ) -> bool:
        """Whether digest matches; a copy that does not is "try another replica"."""
        expected = self.compute(entry_id, last_add_confirmed, length, payload)
        return hmac.compare_digest(expected, digest)
