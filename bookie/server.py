"""One bookie process: storage + gRPC service + identity + registration + housekeeping.

Start order matters: bind the gRPC port (so ``--port 0`` knows its id), check the
cookie, replay the journal, and only then start serving and register as writable,
so nobody is sent adds before acknowledged data is back in place. Stop order is the
reverse: unregister, stop serving, commit and flush.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from bookie.cookie import check_cookie
from bookie.http import AdminHttpServer
from bookie.metrics import BookieMetrics
from bookie.service import BookieService
from bookie.storage import LedgerStorage
from bookie.wire import bookie_pb2 as pb

if TYPE_CHECKING:
    from bookie.meta import MetadataLink

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20


@dataclass
class BookieConfig:
    data_dir: Path
    journal_dir: Path | None = None
    metadata_uri: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int = 0
    bookie_id: str | None = None
    rack: str = "/default-rack"
    max_entry_bytes: int = 5 << 20
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval_s: float = 5.0
    gc_interval_s: float = 60.0
    compaction_min_live_fraction: float = 0.5
    flush_interval_s: float = 1.0
    journal_max_file_bytes: int = 128 << 20
    session_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1:
            raise ValueError("need 0 < disk-usage-lwm <= disk-usage-threshold <= 1")


def disk_usage(paths: list[Path]) -> tuple[float, int, int]:
    """(highest used fraction, free bytes, total bytes) over the filesystems of ``paths``."""
    worst, free, total = 0.0, 0, 0
    seen = set()
    for p in paths:
        st = os.statvfs(p)
        if st.f_fsid in seen:
            continue
        seen.add(st.f_fsid)
        t = st.f_blocks * st.f_frsize
        f = st.f_bavail * st.f_frsize
        total += t
        free += f
        if t:
            worst = max(worst, 1 - f / t)
    return worst, free, total


class BookieServer:
    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.journal_dir = (config.journal_dir or config.data_dir / "journal").resolve()
        self.metrics = BookieMetrics()
        self.storage = LedgerStorage(
            self.journal_dir,
            self.data_dir,
            flush_interval_s=config.flush_interval_s,
            journal_max_file_bytes=config.journal_max_file_bytes,
            on_commit=self.metrics.on_commit,
        )
        self.read_only = False
        self.disk_usage = 0.0
        self.free_bytes = 0
        self.total_bytes = 0
        self.bookie_id = ""
        self.port = 0
        self.metrics_port = 0
        self.meta: MetadataLink | None = None
        self._storage_started = False
        self._grpc: grpc.aio.Server | None = None
        self._http: AdminHttpServer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        cfg = self.config
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self._grpc = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ]
        )
        self.port = self._grpc.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if not self.port:
            raise OSError(f"cannot bind {cfg.host}:{cfg.port}")
        self.bookie_id = cfg.bookie_id or f"{cfg.host}:{self.port}"
        if cfg.metadata_uri:
            from bookie.meta import MetadataLink  # only a bookie with a metadata store needs it

            self.meta = await MetadataLink.connect(
                cfg.metadata_uri, self.bookie_id, cfg.session_timeout_s
            )
        await check_cookie(
            self.bookie_id,
            self.journal_dir,
            self.data_dir,
            int(time.time() * 1000),
            self.meta.read_cookie if self.meta else None,
            self.meta.write_cookie if self.meta else None,
        )
        replayed = await self.storage.start()
        self._storage_started = True
        if replayed:
            log.info("replayed %d journal entries", replayed)
        self._check_disks()
        service = BookieService(
            self.storage,
            self.metrics,
            max_entry_bytes=cfg.max_entry_bytes,
            is_read_only=lambda: self.read_only,
            bookie_info=self._info,
        )
        self._grpc.add_generic_rpc_handlers((service.handler(),))
        await self._grpc.start()
        self._http = AdminHttpServer(
            self.metrics.registry,
            {
                ("GET", "/admin/state"): self._admin_state,
                ("POST", "/admin/disk-thresholds"): self._admin_thresholds,
                ("POST", "/admin/gc"): self._admin_gc,
            },
        )
        self.metrics_port = await self._http.start(cfg.host, cfg.metrics_port)
        if self.meta is not None:
            await self.meta.register(self._registration())
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._disk_loop(), name="disk-check"))
        self._tasks.append(loop.create_task(self._gc_loop(), name="gc"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        if self.meta is not None:
            await self.meta.close()  # ends the session: the registration vanishes
        if self._grpc is not None:
            await self._grpc.stop(grace=2)
        if self._http is not None:
            await self._http.close()
        if self._storage_started:
            await self.storage.close()

    # -- read-only mode ---------------------------------------------------------------

    def _check_disks(self) -> bool:
        """Update read-only mode from disk usage; whether it changed."""
        cfg = self.config
        self.disk_usage, self.free_bytes, self.total_bytes = disk_usage(
            [self.data_dir, self.journal_dir]
        )
        self.metrics.disk_usage.set(self.disk_usage)
        was = self.read_only
        if not was and self.disk_usage >= cfg.disk_usage_threshold:
            self.read_only = True
            log.warning("disk usage %.1f%% >= threshold: going read-only", 100 * self.disk_usage)
        elif was and self.disk_usage < cfg.disk_usage_lwm:
            self.read_only = False
            log.warning("disk usage %.1f%% < low-water mark: writable again", 100 * self.disk_usage)
        self.metrics.read_only.set(1 if self.read_only else 0)
        return was != self.read_only

    async def _update_disk_state(self) -> None:
        if self._check_disks() and self.meta is not None:
            await self.meta.set_read_only(self.read_only)

    async def _disk_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.disk_check_interval_s)
            try:
                await self._update_disk_state()
            except Exception as e:  # keep checking; a metadata hiccup is retried next round
                log.error("disk check / re-registration failed: %s", e)

    # -- garbage collection -------------------------------------------------------------

    async def gc_round(self) -> tuple[list[int], dict[int, int], list[int]]:
        """One GC round: (ledgers deleted, {ledger: entries deleted below its first
        listed entry}, entry logs compacted). Skipped without metadata."""
        deleted: list[int] = []
        trimmed: dict[int, int] = {}
        if self.meta is not None:
            collected = await self.storage.collect_garbage(self.meta.first_entry)
            deleted, trimmed = collected.deleted, collected.trimmed
            self.metrics.gc_deleted.inc(len(deleted))
        compacted = await self.storage.compact(self.config.compaction_min_live_fraction)
        return deleted, trimmed, compacted

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gc_interval_s)
            try:
                deleted, trimmed, compacted = await self.gc_round()
                if deleted or trimmed or compacted:
                    log.info(
                        "gc: deleted ledgers %s, trimmed %s, compacted logs %s",
                        deleted,
                        trimmed,
                        compacted,
                    )
            except Exception as e:  # metadata unreadable: skip this round, delete nothing
                log.error("gc round skipped: %s", e)

    # -- info ---------------------------------------------------------------------------

    def _registration(self) -> dict[str, object]:
        return {
            "bookie_id": self.bookie_id,
            "address": f"{self.config.host}:{self.port}",
            "rack": self.config.rack,
            "read_only": self.read_only,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "metrics_address": f"{self.config.host}:{self.metrics_port}",
        }

    def _info(self) -> pb.GetBookieInfoResponse:
        return pb.GetBookieInfoResponse(
            status=pb.OK,
            bookie_id=self.bookie_id,
            free_bytes=self.free_bytes,
            total_bytes=self.total_bytes,
            read_only=self.read_only,
        )

    async def _admin_state(self, params: dict[str, str]) -> dict[str, object]:
        return {
            "bookie_id": self.bookie_id,
            "read_only": self.read_only,
            "disk_usage": self.disk_usage,
            "disk_usage_threshold": self.config.disk_usage_threshold,
            "disk_usage_lwm": self.config.disk_usage_lwm,
        }

    async def _admin_thresholds(self, params: dict[str, str]) -> dict[str, object]:
        threshold = float(params.get("threshold", self.config.disk_usage_threshold))
        lwm = float(params.get("lwm", min(self.config.disk_usage_lwm, threshold)))
        if not 0 < lwm <= threshold <= 1:
            raise ValueError("need 0 < lwm <= threshold <= 1")
        self.config.disk_usage_threshold, self.config.disk_usage_lwm = threshold, lwm
        await self._update_disk_state()
        return await self._admin_state(params)

    async def _admin_gc(self, params: dict[str, str]) -> dict[str, object]:
        deleted, trimmed, compacted = await self.gc_round()
        return {
            "deleted": deleted,
            "trimmed": {str(k): v for k, v in trimmed.items()},
            "compacted": compacted,
        }
