"""Admin operations: status, enable/disable, audit-now, recover and decommission.

`recover` and `decommission` mark every ledger on the bookie and repair them with a
worker of their own (taking the same per-ledger locks as the daemons, so they work
alongside running auto-recovery nodes), until no ledger's metadata names the bookie.
`decommission` then deletes the bookie's cookie, so the id can join again as a new
bookie with fresh directories (what a bookie with wiped disks is told to do).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from metadata.errors import MetadataError
from metadata.services.auditor import AuditorElection
from metadata.services.cookies import CookieStore
from streamlib.autorecovery.auditor import Auditor
from streamlib.autorecovery.errors import (
    BookieStillWritableError,
    DecommissionTimeoutError,
    UnknownBookieError,
)
from streamlib.autorecovery.replicator import ReplicationWorker, WorkerConfig
from streamlib.client import Client
from streamlib.protocol.errors import StreamlibError

log = logging.getLogger(__name__)

# (ledgers repaired so far, ledgers that named the bookie at the start)
Progress = Callable[[int, int], None]

RECHECK_S = 1.0  # how long the wait sleeps between passes when nothing changed


@dataclass(frozen=True)
class Status:
    enabled: bool
    auditor: str | None
    under_replicated: list[dict[str, object]]


async def status(client: Client) -> Status:
    worker = ReplicationWorker(client)
    marks = []
    for record in await worker.underreplication.list():
        marks.append(
            {
                "ledger_id": record.ledger_id,
                "missing_bookies": list(record.missing_bookies),
                "marked_ms": record.marked_ms,
                "locked": await worker.underreplication.is_locked(record.ledger_id),
            }
        )
    leader = await AuditorElection(client.store, "admin-status").leader()
    return Status(await worker.underreplication.is_enabled(), leader, marks)


async def set_enabled(client: Client, enabled: bool) -> None:
    await ReplicationWorker(client).underreplication.set_enabled(enabled)


async def audit_now(client: Client) -> dict[int, list[str]]:
    """Check every ledger now (as the auditor's periodic check) and mark what's missing."""
    return await Auditor(client).check_all()


async def ledgers_on(client: Client, bookie: str) -> list[int]:
    auditor = Auditor(client)
    return [md.ledger_id for md, _ in await auditor.all_ledgers() if bookie in md.bookies()]


async def recover(
    client: Client,
    bookie: str,
    *,
    grace_period_s: float = 30.0,
    timeout_s: float | None = None,
    progress: Progress | None = None,
    known: bool = False,
) -> int:
    """Re-replicate everything `bookie` held; returns once no ledger names it (the
    number of ledgers repaired). DecommissionTimeoutError after timeout_s;
    UnknownBookieError when it is not registered and no ledger names it, unless the
    caller knows it by other means (``known``: decommission finds its cookie)."""
    auditor = Auditor(client)
    worker = ReplicationWorker(client, WorkerConfig(grace_period_s=grace_period_s))
    initial = await auditor.mark_ledgers_on([bookie])
    if not initial and not known and await client.registry.get(bookie) is None:
        raise UnknownBookieError(
            f"bookie {bookie} is not registered, has no cookie and no ledger names it"
        )
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last_error: Exception | None = None
    marks = client.store.watch(
        worker.underreplication.path("underreplication", "ledgers"), children=True
    )
    try:
        while True:
            remaining = await ledgers_on(client, bookie)
            if progress is not None:
                progress(len(initial) - len([r for r in remaining if r in initial]), len(initial))
            if not remaining:
                return len(initial)
            if deadline is not None and time.monotonic() > deadline:
                raise DecommissionTimeoutError(
                    f"{len(remaining)} ledgers still name bookie {bookie}: {remaining[:10]}"
                    + (f" (last failure: {last_error})" if last_error else "")
                )
            # Ledgers changed since the first marking (or whose mark a daemon cleared
            # early) are marked again; marking merges, so this is cheap when unchanged.
            progressed = False
            for ledger_id in remaining:
                await worker.underreplication.mark(ledger_id, [bookie])
                if await worker.underreplication.is_locked(ledger_id):
                    continue  # a daemon is on it
                try:
                    outcome = await worker.repair(ledger_id)
                except (StreamlibError, MetadataError) as exc:
                    last_error = exc
                    log.warning("ledger %d: %s; will retry", ledger_id, exc)
                    continue
                progressed |= outcome.status == "done"
            if not progressed:
                with contextlib.suppress(TimeoutError):
                    await marks.next(RECHECK_S)  # another worker's progress, or a writer
    finally:
        await marks.close()


async def decommission(
    client: Client,
    bookie: str,
    *,
    grace_period_s: float = 30.0,
    timeout_s: float | None = None,
    progress: Progress | None = None,
) -> int:
    """Like recover, for a bookie leaving for good (it must be down or read-only), and
    then delete its cookie: the id may join again, but only as a new bookie."""
    info = await client.registry.get(bookie)
    if info is not None and not info.read_only:
        raise BookieStillWritableError(
            f"bookie {bookie} is up and writable: stop it or make it read-only first"
        )
    cookies = CookieStore(client.store)
    # A wiped bookie that never took a ledger is known by its cookie alone.
    has_cookie = await cookies.read(bookie) is not None
    repaired = await recover(
        client,
        bookie,
        grace_period_s=grace_period_s,
        timeout_s=timeout_s,
        progress=progress,
        known=has_cookie,
    )
    # Only now: until every ledger is re-replicated, the cookie is what keeps a wiped
    # bookie from rejoining under the id those ledgers still name.
    await cookies.delete(bookie)
    return repaired
