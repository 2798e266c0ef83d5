"""One auto-recovery node: an auditor candidate and a replication worker.

Every node campaigns in the auditor election; the winner audits until it dies, stops
or loses its metadata session (then it campaigns again), and another node's campaign
succeeds. Every node runs a worker, which repairs marked ledgers (unless an admin
disabled auto-recovery) and otherwise waits for new marks, the enable switch, or the
end of a writer's grace period. A failing metadata store or bookie makes a loop log,
back off and try again; it never ends the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from metadata.errors import MetadataError
from metadata.services.auditor import AuditorElection
from metadata.store import Watch
from streamlib.autorecovery.auditor import Auditor, AuditorConfig
from streamlib.autorecovery.replicator import ReplicationWorker, WorkerConfig
from streamlib.client import Client
from streamlib.protocol.errors import StreamlibError

log = logging.getLogger(__name__)

IDLE_POLL_S = 5.0  # a worker looks again this often even without events (a dead
# worker's lock going away is not an event it watches)
ERROR_BACKOFF_S = 1.0


class AutoRecoveryDaemon:
    def __init__(
        self,
        client: Client,
        identifier: str,
        auditor_config: AuditorConfig | None = None,
        worker_config: WorkerConfig | None = None,
    ) -> None:
        self.client = client
        self.identifier = identifier
        self.auditor = Auditor(client, auditor_config)
        self.worker = ReplicationWorker(client, worker_config)
        self.election = AuditorElection(client.store, identifier)

    async def run(self, stop: asyncio.Event) -> None:
        """Audit (when elected) and repair until `stop` is set."""
        tasks = [
            asyncio.create_task(self._audit(), name="auditor"),
            asyncio.create_task(self._work(), name="worker"),
        ]
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopping:
                    task.result()  # a loop that ended on its own is a bug: surface it
        finally:
            for task in [*tasks, stopping]:
                task.cancel()
            await asyncio.gather(*tasks, stopping, return_exceptions=True)
            with contextlib.suppress(MetadataError):
                await self.election.resign()

    async def _audit(self) -> None:
        while True:
            try:
                await self.election.campaign()
                log.warning("%s is the auditor", self.identifier)
                await self.auditor.run(lambda: self.election.is_leader)
                log.warning("%s lost the auditor election (session lost?)", self.identifier)
                await self.election.resign()
            except (MetadataError, StreamlibError) as exc:
                log.warning("auditor: %s; retrying in %.1fs", exc, ERROR_BACKOFF_S)
                with contextlib.suppress(MetadataError):
                    await self.election.resign()
                await asyncio.sleep(ERROR_BACKOFF_S)

    async def _work(self) -> None:
        underreplication = self.worker.underreplication
        # Not the locks: a worker that waits out a writer's grace releases its own lock,
        # which would wake it at once.
        watches = [
            self.client.store.watch(
                underreplication.path("underreplication", "ledgers"), children=True
            ),
            self.client.store.watch(underreplication.path("underreplication", "disabled")),
        ]
        try:
            while True:
                timeout = IDLE_POLL_S
                try:
                    if await underreplication.is_enabled():
                        outcomes = await self.worker.run_once()
                        waits = [o.wait_until_ms for o in outcomes if o.wait_until_ms]
                        if waits:
                            timeout = min(timeout, max(0.0, min(waits) / 1000 - time.time()))
                except MetadataError as exc:
                    log.warning("worker: %s; retrying in %.1fs", exc, ERROR_BACKOFF_S)
                    timeout = ERROR_BACKOFF_S
                await _next_event(watches, timeout)
        finally:
            for watch in watches:
                await watch.close()


async def _next_event(watches: list[Watch], timeout_s: float) -> None:
    """Wait until any of the watches fires, at most timeout_s."""
    waits = [asyncio.ensure_future(w.next(timeout_s)) for w in watches]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
