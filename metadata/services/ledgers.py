"""Ledger metadata: create, read, compare-and-swap, delete, list, watch.

Every update is a CAS on the node version (ARCHITECTURE.md §3): `write` takes the
version the caller read and raises BadVersionError when someone else wrote in between.
"""

from __future__ import annotations

from metadata.errors import (
    BadVersionError,
    InvalidValueError,
    LedgerExistsError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
    TransactionError,
)
from metadata.schemas import LedgerMetadata, decode, encode
from metadata.services._base import Service, validate_ledger_id
from metadata.services.ledger_ids import LedgerIdGenerator
from metadata.store import CheckVersion, Create, Delete, Op, Watch

BUCKET = 10_000


def _parts(ledger_id: int) -> tuple[str, str]:
    return f"{ledger_id // BUCKET:016d}", f"{ledger_id % BUCKET:04d}"


class LedgerMetadataManager(Service):
    def ledger_path(self, ledger_id: int) -> str:
        return self.path("ledgers", *_parts(validate_ledger_id(ledger_id)))

    def secret_path(self, ledger_id: int) -> str:
        return self.path("ledger-secrets", *_parts(validate_ledger_id(ledger_id)))

    async def create(self, md: LedgerMetadata, secret: bytes | None = None) -> int:
        """Store new metadata under md.ledger_id, and with it (one transaction) the
        ledger's secret in a private node; returns the metadata's version (0)."""
        path = self.ledger_path(md.ledger_id)
        await self.ensure(path.rsplit("/", 1)[0])
        ops = [Create(path, encode(md))]
        if secret is not None:
            secret_path = self.secret_path(md.ledger_id)
            await self.ensure(secret_path.rsplit("/", 1)[0])
            ops.append(Create(secret_path, secret, private=True))
        try:
            await self.store.transaction(ops)
        except TransactionError as exc:
            if isinstance(exc.cause, NodeExistsError):
                raise LedgerExistsError(f"ledger {md.ledger_id} already exists") from None
            raise exc.cause from None
        return 0

    async def read_secret(self, ledger_id: int) -> bytes | None:
        """The ledger's secret (its password); None when none was stored (ledgers made
        before key version 1). Another identity than the writers' gets AuthFailedError
        on ZooKeeper (the node is private)."""
        try:
            return (await self.store.get(self.secret_path(ledger_id))).data
        except NoNodeError:
            return None

    async def create_with_new_id(self, md: LedgerMetadata, ids: LedgerIdGenerator) -> int:
        """Assign md.ledger_id from the generator, store it; returns the id."""
        md.ledger_id = await ids.next_id()
        await self.create(md)
        return md.ledger_id

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        try:
            stored = await self.store.get(self.ledger_path(ledger_id))
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        return decode(LedgerMetadata, stored.data), stored.version

    async def write(self, ledger_id: int, md: LedgerMetadata, version: int) -> int:
        """CAS: replace the metadata if it is still at `version`; the new version."""
        if md.ledger_id != ledger_id:
            raise InvalidValueError(f"metadata of ledger {md.ledger_id} written to {ledger_id}")
        try:
            return await self.store.set(self.ledger_path(ledger_id), encode(md), version=version)
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def delete(
        self, ledger_id: int, version: int = -1, guard: tuple[str, int] | None = None
    ) -> None:
        """Delete the metadata and, in the same transaction, the secret if there is one.
        guard (a path and its version): only while that node is still at that version,
        else BadVersionError and nothing is deleted."""
        ops: list[Op] = [Delete(self.ledger_path(ledger_id), version)]
        if await self.store.exists(self.secret_path(ledger_id)) is not None:
            ops.append(Delete(self.secret_path(ledger_id)))
        if guard is not None:
            ops.insert(0, CheckVersion(*guard))
        try:
            await self.store.transaction(ops)
        except TransactionError as exc:
            if guard is not None and exc.index == 0:
                raise BadVersionError(f"{guard[0]} moved on: ledger {ledger_id} kept") from None
            if isinstance(exc.cause, NoNodeError):
                raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
            raise exc.cause from None

    async def exists(self, ledger_id: int) -> bool:
        return await self.store.exists(self.ledger_path(ledger_id)) is not None

    async def list(self) -> list[int]:
        ids: list[int] = []
        try:
            buckets = await self.store.children(self.path("ledgers"))
        except NoNodeError:
            return []
        for bucket in buckets:
            try:
                names = await self.store.children(self.path("ledgers", bucket))
            except NoNodeError:
                continue  # an empty bucket removed meanwhile
            ids += [int(bucket) * BUCKET + int(name) for name in names]
        return sorted(ids)

    def watch(self, ledger_id: int) -> Watch:
        return self.store.watch(self.ledger_path(ledger_id))
