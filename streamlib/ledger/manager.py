"""`client.ledgers`: create, open (with or without recovery), delete, list, metadata."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from bookie.wire import bookie_pb2 as pb
from metadata.errors import AuthFailedError, BadVersionError, NoNodeError, TransactionError
from metadata.errors import NoSuchLedgerError as MetadataNoSuchLedger
from metadata.schemas import encode
from metadata.services.ledger_ids import LedgerIdGenerator
from metadata.store import CheckVersion, Op, Set
from streamlib.ledger.codec import metadata_from_pb, metadata_to_pb
from streamlib.ledger.driver import Context, Driver
from streamlib.ledger.handles import ReadHandle, WriteHandle
from streamlib.protocol import DigestManager, DigestType, Fragment, LedgerMetadata, LedgerState
from streamlib.protocol.actions import Action, RecoveryDone, RecoveryFailed
from streamlib.protocol.digest import KEY_VERSION, master_key, password_hash
from streamlib.protocol.errors import (
    BadRequestError,
    BookieTlsError,
    BookieUnavailableError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    RecoveryAbortedError,
    TlsError,
    UnauthorizedError,
    error_for_status,
)
from streamlib.protocol.quorum import validate_quorums
from streamlib.protocol.recovery import LedgerRecovery, RecoveryOptions
from streamlib.protocol.term_recovery import TermRecovery
from streamlib.retry import RECOVERY, RECOVERY_RETRY_FOR_S, retry_cas

T = TypeVar("T")


class _LedgerMoved(Exception):
    """The ledger's metadata changed under a CAS (retried by retry_cas)."""


class _RecoverySink:
    def __init__(self) -> None:
        self.future: asyncio.Future[tuple[LedgerMetadata, int]] = (
            asyncio.get_running_loop().create_future()
        )

    def on_outcome(self, action: Action) -> None:
        if self.future.done():
            return
        if isinstance(action, RecoveryDone):
            self.future.set_result((action.metadata, action.version))
        elif isinstance(action, RecoveryFailed):
            self.future.set_exception(action.error)


# Roles that may add new entries, and that may fence and recover (bookie/ledger_rules.py's
# ROLES_ALLOWED: ADD, and FENCE / RECOVERY_ADD).
ADD_ROLES = frozenset({"write", "admin"})
FENCE_ROLES = frozenset({"write", "bookie", "admin"})
# A new ledger's ensemble is chosen from a list of the bookies read within this long (a
# client creating many ledgers at once -- a broker opening thousands of streams -- reads
# it once, not for each). A bookie gone since is replaced as any that fails.
WRITABLE_AGE_S = 1.0
# ... and whether the bookies take this client's writes, from their answer within this
# long (they enforce it on every add and fence: this asks first so that a refusal changes
# no metadata).
INFO_AGE_S = 1.0


class LedgerManager:
    def __init__(self, context: Context, ids: LedgerIdGenerator) -> None:
        self._context = context
        self._ids = ids
        self.recovery_options = RecoveryOptions()

    async def metadata_node(self, ledger_id: int) -> tuple[str, int]:
        """The metadata store node of a ledger's metadata and its version (for a
        transaction's check that the ledger is still there); NoSuchLedgerError."""
        _, version = await self._read(ledger_id)
        return self._context.ledgers.ledger_path(ledger_id), version

    async def create(
        self,
        ensemble: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        digest: str | DigestType = "crc32c",
        custom_metadata: Mapping[str, bytes] | None = None,
        *,
        unbounded: bool = False,
    ) -> WriteHandle:
        """Create a ledger on `ensemble` writable bookies and return its writer."""
        validate_quorums(ensemble, write_quorum, ack_quorum)
        digest_type = DigestType.parse(digest)
        custom = dict(custom_metadata or {})
        for key, value in custom.items():
            if not isinstance(key, str) or not isinstance(value, bytes):
                raise BadRequestError("custom_metadata maps str to bytes")
        pool = self._context.pool
        try:
            bookies = self._context.placement.new_ensemble(
                await pool.writable(WRITABLE_AGE_S), ensemble, write_quorum
            )
        except NotEnoughBookiesError:  # (perhaps some joined since that list: look)
            bookies = self._context.placement.new_ensemble(
                await pool.writable(), ensemble, write_quorum
            )
        await pool.prepare(bookies)
        await self.check_may_write(bookies, "create a ledger")
        ledger_id = await self._ids.next_id()
        created = int(time.time() * 1000)
        metadata = LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            fragments=(Fragment(0, tuple(bookies), created, 0, 1 if unbounded else 0),),
            digest_type=digest_type,
            password_hash=password_hash(password),
            term=1 if unbounded else 0,
            unbounded=unbounded,
            custom_metadata=custom,
            creation_time_ms=created,
            key_version=KEY_VERSION,
        )
        # The password goes to the ledger's private secret node (auto-recovery and a
        # stream's next writer recover with it); the public metadata holds only its hash.
        version = await self._context.ledgers.create(metadata_to_pb(metadata), secret=password)
        return WriteHandle(
            metadata, version, self._context, material=metadata.key_material(password)
        )

    async def material(self, metadata: LedgerMetadata, password: bytes | None) -> bytes:
        """The ledger's key material: from password (checked against the metadata's
        hash, in constant time), else from the ledger's stored secret -- which only the
        writers' metadata identity may read -- or, for a key version 0 ledger, from its
        metadata."""
        ledger_id = metadata.ledger_id
        if password is not None:
            if not hmac.compare_digest(password_hash(password), metadata.password_hash):
                raise UnauthorizedError(f"wrong password for ledger {ledger_id}")
            return metadata.key_material(password)
        if metadata.key_version == 0:
            return metadata.password_hash
        try:
            secret = await self._context.ledgers.read_secret(ledger_id)
        except AuthFailedError as e:
            raise UnauthorizedError(
                f"this client's metadata identity may not read ledger {ledger_id}'s secret: "
                f"pass the ledger's password, or connect with the writers' identity"
            ) from e
        if secret is None:
            raise UnauthorizedError(f"ledger {ledger_id} has no stored secret: pass its password")
        return metadata.key_material(secret)

    async def check_may_write(
        self,
        bookies: Sequence[str],
        what: str,
        *,
        need_answer: bool = False,
        roles: frozenset[str] = ADD_ROLES,
    ) -> None:
        """UnauthorizedError when the bookies would refuse this client's writes or fences.

        Asked BEFORE a recovery marks a ledger IN_RECOVERY or a ledger is created: the
        bookies enforce roles, but a refused recovery would otherwise leave the ledger's
        metadata changed (its writer could no longer close it). One bookie's answer is
        enough (they share the principal map). If none answers: a TLS mismatch with
        every one is a misconfiguration no retry mends (plaintext to TLS, another CA, an
        expired certificate), said at once (BookieTlsError); otherwise, with
        need_answer (a recovery, which could fence nothing anyway), RecoveryAbortedError
        -- retried like an aborted recovery, and nothing changed meanwhile (a client
        that cannot reach the bookies at all, e.g. plaintext against TLS, used to mark
        a live writer's ledger IN_RECOVERY and then give up)."""
        mismatches = 0
        unreachable: BookieUnavailableError | None = None
        for bookie in bookies:
            try:
                # (A recovery asks afresh: that a bookie answers now is what it needs.)
                fresh = 0.0 if need_answer else INFO_AGE_S
                info = await self._context.pool.get(bookie).info(fresh)
            except BookieUnavailableError as e:
                unreachable = e
                mismatches += isinstance(e, TlsError)
                if mismatches == len(bookies):
                    others = (
                        f" (and with every bookie of {list(bookies)})" if mismatches > 1 else ""
                    )
                    raise BookieTlsError(f"cannot {what}: {e}{others}") from e
                continue
            if info.status in (pb.UNAUTHORIZED, pb.UNAUTHENTICATED):
                raise error_for_status(info.status, f"bookie {bookie}: {info.message}")
            if info.status != pb.OK:
                continue
            if info.authenticated and not roles & set(info.roles):
                raise UnauthorizedError(
                    f"principal {info.principal!r} may not {what}: that needs one of the "
                    f"roles {sorted(roles)}, and it has {sorted(info.roles) or 'none'}"
                )
            return
        if need_answer and unreachable is not None:
            raise RecoveryAbortedError(
                f"no bookie of {list(bookies)} answered, so nothing was changed to {what} "
                f"(check that they are up, and that this client speaks TLS if they do): "
                f"{unreachable}"
            )

    async def check_may_add(self, what: str) -> None:
        """UnauthorizedError unless the bookies take new entries from this client: asked
        before a stream's takeover fences anything (a principal that may recover but not
        add -- a bookie's -- would otherwise fence the live writer, then fail)."""
        writable = [b.bookie_id for b in await self._context.pool.writable(WRITABLE_AGE_S)]
        await self.check_may_write(writable[:3], what)

    async def metadata(self, ledger_id: int) -> LedgerMetadata:
        return (await self._read(ledger_id))[0]

    async def _read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) or ledger_id < 0:
            raise BadRequestError(f"ledger id must be an int >= 0, got {ledger_id!r}")
        try:
            stored, version = await self._context.ledgers.read(ledger_id)
        except MetadataNoSuchLedger:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        return metadata_from_pb(stored), version

    async def open(
        self,
        ledger_id: int,
        password: bytes | None = b"",
        recover: bool = True,
        *,
        attempts: int | None = None,
        retry_for_s: float = RECOVERY_RETRY_FOR_S,
    ) -> ReadHandle:
        """Open for reading. With recover=True (the default) an OPEN ledger is fenced,
        recovered and closed first, so the handle sees its final content; with
        recover=False the writer is left alone and reads stop at the LAC. A recovery
        that aborts (RecoveryAbortedError: bookies did not answer) is tried again for up
        to retry_for_s seconds, and at most `attempts` times if given.

        password None: no password. A reader needs none for a crc32c ledger; a recovery
        then uses the ledger's stored secret (see material())."""
        metadata, version = await self._read(ledger_id)
        if password is not None or recover:
            material: bytes | None = await self.material(metadata, password)
        else:
            material = None
        await self._context.pool.prepare(metadata.bookies())
        if recover and metadata.unbounded and not metadata.is_closed:
            raise BadRequestError(
                f"ledger {ledger_id} is unbounded: open(recover=False) to read it, "
                "take_over() to become its writer"
            )
        if not recover or metadata.is_closed:
            handle = ReadHandle(metadata, version, self._context, lac=-1, material=material)
            if not metadata.is_closed:
                await handle.read_last_add_confirmed()
            return handle
        known: tuple[LedgerMetadata, int] | None = (metadata, version)

        async def recover_once() -> tuple[LedgerMetadata, int]:
            nonlocal known
            # Each retry re-reads: another recovery may have moved the ledger on meanwhile.
            current = known if known is not None else await self._read(ledger_id)
            known = None
            return await self.recover(*current, material=material)

        metadata, version = await self._retry_aborted(
            ledger_id, "recovery", recover_once, attempts, retry_for_s
        )
        return ReadHandle(
            metadata, version, self._context, lac=metadata.last_entry_id, material=material
        )

    async def _retry_aborted(
        self,
        ledger_id: int,
        what: str,
        attempt: Callable[[], Awaitable[T]],
        attempts: int | None,
        retry_for_s: float,
    ) -> T:
        """attempt() again while it raises RecoveryAbortedError (streamlib.retry.RECOVERY),
        for up to retry_for_s seconds (and `attempts` tries, if given); then a
        RecoveryRetriesExhausted (a RecoveryAbortedError) saying how long it tried. Other
        errors end it at once."""
        policy = RECOVERY.replace(stop_after_s=retry_for_s, attempts=attempts)
        return await policy.run(f"ledger {ledger_id}: {what}", attempt)

    async def recover(
        self, metadata: LedgerMetadata, version: int, *, material: bytes | None = None
    ) -> tuple[LedgerMetadata, int]:
        """Run one recovery of an OPEN or IN_RECOVERY ledger to its CLOSE, with the
        ledger's key material (None: from its stored secret, as auto-recovery does).
        Nothing is marked IN_RECOVERY before a bookie answers and lets this client fence
        (check_may_write)."""
        await self.check_may_write(
            metadata.last_fragment.ensemble,
            f"recover ledger {metadata.ledger_id}",
            need_answer=True,
            roles=FENCE_ROLES,
        )
        if material is None:
            material = await self.material(metadata, None)
        recovery = LedgerRecovery(
            metadata,
            version,
            master_key=master_key(material),
            digest=DigestManager(metadata.ledger_id, metadata.digest_type, material),
            options=self.recovery_options,
        )
        sink = _RecoverySink()
        driver = Driver(recovery, metadata.ledger_id, self._context, sink)
        driver.execute(recovery.start())
        try:
            return await sink.future
        finally:
            await driver.cancel_pending()

    async def take_over(
        self,
        ledger_id: int,
        password: bytes | None = b"",
        *,
        attempts: int | None = None,
        retry_for_s: float = RECOVERY_RETRY_FOR_S,
    ) -> WriteHandle:
        """Become the writer of an unbounded ledger: claim term + 1 by CAS, recover the
        last fragment under it, seal the old term with the TRUNCATE no-op and reopen.
        The previous writer's next add fails with InvalidTermError. A takeover whose
        recovery aborts is tried again (re-read, new term) as open() retries recovery."""

        async def take_over_once() -> WriteHandle:
            return await self._take_over_once(ledger_id, password)

        return await self._retry_aborted(
            ledger_id, "takeover", take_over_once, attempts, retry_for_s
        )

    async def _take_over_once(self, ledger_id: int, password: bytes | None) -> WriteHandle:
        metadata, version = await self._read(ledger_id)
        if not metadata.unbounded:
            raise BadRequestError(f"ledger {ledger_id} is bounded: open() recovers it")
        material = await self.material(metadata, password)
        await self._context.pool.prepare(metadata.bookies())
        await self.check_may_write(
            metadata.last_fragment.ensemble,
            f"take unbounded ledger {ledger_id} over",
            need_answer=True,
        )
        recovery = TermRecovery(
            metadata,
            version,
            master_key=master_key(material),
            digest=DigestManager(ledger_id, metadata.digest_type, material),
        )
        sink = _RecoverySink()
        driver = Driver(recovery, ledger_id, self._context, sink)
        driver.execute(recovery.start())
        try:
            reopened, version = await sink.future
        finally:
            await driver.cancel_pending()
        await self._context.pool.prepare(reopened.bookies())
        return WriteHandle(
            reopened,
            version,
            self._context,
            last_add_confirmed=recovery.last_add_confirmed,
            length=recovery.length,
            material=material,
        )

    async def drop_fragments(
        self,
        ledger_id: int,
        plan: Callable[[LedgerMetadata], int],
        *,
        guard: tuple[str, int] | None = None,
        attempts: int = 10,
    ) -> list[int]:
        """Fragment retention: drop the leading fragments ``plan(metadata)`` counts, by
        CAS (re-planned on the fresh metadata after a conflict, e.g. a writer's fragment
        roll). With ``guard`` (a metadata path and version) the CAS is one transaction
        with a check that the path is still at that version; BadVersionError if not.
        Returns the first entry ids of the dropped fragments; bookies delete those
        entries in their garbage collection, once the metadata no longer lists them."""
        ledgers = self._context.ledgers

        async def attempt() -> list[int]:
            metadata, version = await self._read(ledger_id)
            if metadata.state is LedgerState.IN_RECOVERY:
                return []  # a takeover is under way: retention waits for the next round
            count = plan(metadata)
            if count <= 0:
                return []
            data = encode(metadata_to_pb(metadata.with_fragments_dropped(count)))
            ops: list[Op] = [Set(ledgers.ledger_path(ledger_id), data, version)]
            if guard is not None:
                ops.insert(0, CheckVersion(*guard))
            try:
                await ledgers.store.transaction(ops)
            except TransactionError as failed:
                if failed.index == 0 and guard is not None:
                    raise BadVersionError(f"{guard[0]} moved on") from None
                if isinstance(failed.cause, BadVersionError):
                    raise _LedgerMoved from None  # re-plan on the fresh metadata
                if isinstance(failed.cause, NoNodeError):
                    raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
                raise
            return [f.first_entry_id for f in metadata.fragments[:count]]

        return await retry_cas(
            f"ledger {ledger_id}: dropping fragments",
            attempt,
            attempts=attempts,
            conflict=_LedgerMoved,
        )

    async def delete(self, ledger_id: int, *, guard: tuple[str, int] | None = None) -> None:
        """Delete the ledger's metadata; bookies garbage-collect its entries. guard (a
        metadata path and version): only while that node is at that version (one
        transaction), else BadVersionError and the ledger stays."""
        await self._read(ledger_id)
        try:
            await self._context.ledgers.delete(ledger_id, guard=guard)
        except MetadataNoSuchLedger:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def list(self) -> list[int]:
        return await self._context.ledgers.list()
