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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from bookie.addresses import advertised_address, join_host_port, split_host_port
from bookie.auth import AccessControl, TokenVerifier, follow_principals
from bookie.cookie import BookieCookie, bookie_id_on_disk, check_cookie
from bookie.errors import GcRefusedError
from bookie.framed import DEFAULT_HELLO_TIMEOUT_S, FramedAddServer
from bookie.http import AdminHttpServer
from bookie.metrics import BookieMetrics
from bookie.service import (
    DEFAULT_MAX_STREAM_ANSWER_BYTES,
    DEFAULT_MAX_STREAM_INFLIGHT_BYTES,
    BookieService,
)
from bookie.storage import LedgerStorage
from bookie.tls import TlsFiles
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
    # What clients dial (bookie/addresses.py); None: the bind host, or for a wildcard
    # bind the address that reaches the metadata store.
    advertised_address: str | None = None
    metrics_host: str | None = None  # the admin/metrics HTTP bind; None: same as host
    metrics_advertised_address: str | None = None
    port: int = 0
    metrics_port: int = 0
    # The framed add port (bookie/framed.py), bound on host beside the gRPC port:
    # 0 picks a free port (clients find it in the registration), -1: none (adds then go
    # over gRPC). Advertised as framed_advertised_address, else the gRPC advertised
    # address's host with this port.
    framed_port: int = 0
    framed_advertised_address: str | None = None
    framed_hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S
    bookie_id: str | None = None
    rack: str = "/default-rack"
    max_entry_bytes: int = 5 << 20
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval_s: float = 5.0
    gc_interval_s: float = 60.0
    compaction_min_live_fraction: float = 0.5
    # GC safety (gc_round): a round in which more than this fraction of the bookie's
    # ledgers vanished from the metadata at once is refused, once it holds at least
    # gc_vanish_check_min_ledgers ledgers (fewer make the fraction jump on every delete).
    gc_max_vanished_fraction: float = 0.5
    gc_vanish_check_min_ledgers: int = 10
    # Adopt the metadata store's cluster even when the cookie names another or none
    # (bookie/cookie.py); dangerous: ledgers the store does not list are then collected.
    allow_new_cluster: bool = False
    flush_interval_s: float = 1.0
    flush_bytes: int = 64 << 20  # the write cache flushes at this size; refuses adds past 4x
    journal_max_file_bytes: int = 128 << 20
    journal_prealloc_bytes: int = 16 << 20
    # Commit on the event loop while the journal is idle and its last sync took at most
    # this long (bookie/journal.py); 0: always in a worker thread.
    journal_inline_sync_s: float = 0.002
    entrylog_max_file_bytes: int = 512 << 20
    session_timeout_s: float = 10.0
    # Limits (see grpc_server_options and BookieService.AddStream).
    max_stream_answer_bytes: int = DEFAULT_MAX_STREAM_ANSWER_BYTES
    max_stream_inflight_bytes: int = DEFAULT_MAX_STREAM_INFLIGHT_BYTES
    max_concurrent_rpcs: int = 1024
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    min_client_ping_interval_s: float = 10.0
    max_connection_idle_s: float = 600.0  # 0: never
    max_connection_age_s: float = 3600.0  # 0: never
    # TLS on the gRPC port (PEM file paths, read at start): cert + key turn it on; with
    # tls_client_auth, clients must present a certificate signed by tls_ca (mutual TLS).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    tls_client_auth: bool = False
    # Token authentication (bookie/auth.py): the HS256 secret or the RS256 public key.
    # With a token key or tls_client_auth the bookie authenticates every request and
    # enforces the principal map's roles.
    auth_token_secret_file: Path | None = None
    auth_token_public_key_file: Path | None = None

    @property
    def tls(self) -> TlsFiles | None:
        if self.tls_cert is None or self.tls_key is None:
            return None
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_ca, self.tls_client_auth)

    def access_control(self, metrics: BookieMetrics) -> AccessControl:
        tokens = None
        if self.auth_token_secret_file or self.auth_token_public_key_file:
            tokens = TokenVerifier.from_files(
                self.auth_token_secret_file, self.auth_token_public_key_file
            )
        return AccessControl(metrics, tokens=tokens, certificates=self.tls_client_auth)

    def __post_init__(self) -> None:
        if self.auth_token_secret_file and self.auth_token_public_key_file:
            raise ValueError(
                "give --auth-token-secret-file (HS256) or --auth-token-public-key-file "
                "(RS256), not both"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key (or neither)")
        if self.tls_client_auth and (self.tls_ca is None or self.tls_cert is None):
            raise ValueError(
                "--tls-client-auth needs --tls-ca (the CA that signs client certificates) "
                "and --tls-cert/--tls-key"
            )
        if self.tls_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-ca is only used with --tls-cert and --tls-key")
        if not 0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1:
            raise ValueError("need 0 < disk-usage-lwm <= disk-usage-threshold <= 1")
        if not 0 < self.gc_max_vanished_fraction <= 1 or self.gc_vanish_check_min_ledgers < 0:
            raise ValueError(
                "need 0 < gc-max-vanished-fraction <= 1, gc-vanish-check-min-ledgers >= 0"
            )
        if self.flush_bytes <= 0:
            raise ValueError("flush-bytes must be > 0")
        if self.max_stream_answer_bytes <= 0 or self.max_stream_inflight_bytes <= 0:
            raise ValueError("the per-stream answer and in-flight limits must be > 0")
        if self.framed_port < -1 or self.framed_port > 65535:
            raise ValueError("framed-port must be a port, 0 (pick one) or -1 (none)")
        if self.framed_hello_timeout_s <= 0:
            raise ValueError("the framed port's hello timeout must be > 0")
        if self.max_concurrent_rpcs <= 0:
            raise ValueError("max-concurrent-rpcs must be > 0")
        if self.journal_prealloc_bytes < 0 or not self.journal_inline_sync_s >= 0:
            raise ValueError("journal-prealloc-bytes and journal-inline-sync-ms must be >= 0")
        if min(self.keepalive_time_s, self.keepalive_timeout_s) <= 0:
            raise ValueError("keepalive time and timeout must be > 0")
        if min(self.min_client_ping_interval_s, self.max_connection_idle_s) < 0:
            raise ValueError("ping interval and connection idle time must be >= 0")
        if self.max_connection_age_s < 0:
            raise ValueError("max-connection-age must be >= 0")


@dataclass(frozen=True)
class GcRound:
    """What one GC round did: ledgers deleted, {ledger: entries deleted below its first
    listed entry}, entry logs compacted; or why it was refused (then nothing was done)."""

    deleted: list[int] = field(default_factory=list)
    trimmed: dict[int, int] = field(default_factory=dict)
    compacted: list[int] = field(default_factory=list)
    refused: str | None = None


def grpc_server_options(cfg: BookieConfig) -> list[tuple[str, int]]:
    """The gRPC core channel arguments of the bookie's server.

    Keepalive: the bookie pings every connection, busy or idle, so a client that vanished
    without closing (a dead host, a partition) is found and its calls end, freeing what
    they hold. Clients may ping as often as every ``min_client_ping_interval_s`` even
    with no call open; more often is abuse and gRPC answers GOAWAY "too_many_pings"
    (streamlib's client pings every 30 s: keep this interval below that). Connection age
    has NO grace limit on purpose: a client keeps one long-lived add stream per bookie,
    and a stream cut by age would look like a bookie failure and cost an ensemble
    change; past its age a connection only takes no new calls, its streams finish.
    """

    def ms(seconds: float) -> int:
        return max(1, int(seconds * 1000))

    opts = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", ms(cfg.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", ms(cfg.keepalive_timeout_s)),
        # gRPC waits 60 s for a ping's answer unless told: make it the keepalive timeout.
        ("grpc.http2.ping_timeout_ms", ms(cfg.keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", 1),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            int(cfg.min_client_ping_interval_s * 1000),
        ),
        # 0 = no cap on pings sent between data frames: a quiet add stream is still checked.
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if cfg.max_connection_idle_s:
        opts.append(("grpc.max_connection_idle_ms", ms(cfg.max_connection_idle_s)))
    if cfg.max_connection_age_s:
        opts.append(("grpc.max_connection_age_ms", ms(cfg.max_connection_age_s)))
    return opts


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
            flush_bytes=config.flush_bytes,
            journal_max_file_bytes=config.journal_max_file_bytes,
            journal_prealloc_bytes=config.journal_prealloc_bytes,
            journal_inline_sync_s=config.journal_inline_sync_s,
            entrylog_max_file_bytes=config.entrylog_max_file_bytes,
            on_commit=self._on_commit,
            on_fault=self._on_storage_fault,
        )
        self.disk_full = False
        # Journal bytes committed since the last disk check, and how many may be written
        # before the next one (a fraction of the headroom left under the threshold).
        self._unchecked_bytes = 0
        self._check_budget = 0
        self._registered = False
        self._published_read_only = False
        self._publishing: asyncio.Task[None] | None = None
        self.disk_usage = 0.0
        self.free_bytes = 0
        self.total_bytes = 0
        self.bookie_id = ""
        self.address = ""  # advertised: what clients dial
        self.metrics_address = ""
        self.framed_address = ""  # advertised; empty: no framed port
        self.port = 0
        self.metrics_port = 0
        self.meta: MetadataLink | None = None
        self.cookie: BookieCookie | None = None
        self._storage_started = False
        self._grpc: grpc.aio.Server | None = None
        self._http: AdminHttpServer | None = None
        self._framed: FramedAddServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.access = config.access_control(self.metrics)

    async def start(self) -> None:
        cfg = self.config
        # Ledger keys and payloads are for the bookie's own user only (bookie serve also
        # sets umask 077 for what it creates inside).
        for directory in (self.data_dir, self.journal_dir):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            directory.chmod(0o700)
        self._grpc = grpc.aio.server(
            options=grpc_server_options(cfg), maximum_concurrent_rpcs=cfg.max_concurrent_rpcs
        )
        tls = cfg.tls
        bind = f"{cfg.host}:{cfg.port}"
        if tls is None:
            self.port = self._grpc.add_insecure_port(bind)
        else:
            self.port = self._grpc.add_secure_port(bind, tls.grpc_credentials())
        if not self.port:
            raise OSError(f"cannot bind {cfg.host}:{cfg.port}")
        self.address = advertised_address(
            cfg.host, self.port, cfg.advertised_address, cfg.metadata_uri
        )
        if cfg.framed_port >= 0:
            await self._bind_framed(tls)
        # An id is a name: the one in the cookie (a bookie keeps it when its address
        # changes), else the first advertised address, as BookKeeper's default.
        self.bookie_id = (
            cfg.bookie_id or bookie_id_on_disk(self.journal_dir, self.data_dir) or self.address
        )
        if cfg.metadata_uri:
            from bookie.meta import MetadataLink  # only a bookie with a metadata store needs it

            self.meta = await MetadataLink.connect(
                cfg.metadata_uri, self.bookie_id, cfg.session_timeout_s
            )
            self.storage.ledger_exists = self.meta.ledger_exists
        self.cookie = await check_cookie(
            self.bookie_id,
            self.journal_dir,
            self.data_dir,
            int(time.time() * 1000),
            self.meta,
            allow_new_cluster=cfg.allow_new_cluster,
        )
        if self.access.enabled:
            await self._follow_principals()
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
            max_stream_answer_bytes=cfg.max_stream_answer_bytes,
            max_stream_inflight_bytes=cfg.max_stream_inflight_bytes,
            access=self.access,
        )
        self._grpc.add_generic_rpc_handlers((service.handler(),))
        await self._grpc.start()
        if self._framed is not None:
            await self._framed.serve(service)
        self._http = AdminHttpServer(
            self.metrics.registry,
            {
                ("GET", "/admin/state"): self._admin_state,
                ("POST", "/admin/disk-thresholds"): self._admin_thresholds,
                ("POST", "/admin/gc"): self._admin_gc,
            },
            access=self.access,
            ssl=tls.ssl_context() if tls is not None else None,
        )
        metrics_host = cfg.host if cfg.metrics_host is None else cfg.metrics_host
        self.metrics_port = await self._http.start(metrics_host, cfg.metrics_port)
        self.metrics_address = advertised_address(
            metrics_host,
            self.metrics_port,
            cfg.metrics_advertised_address,
            cfg.metadata_uri,
            what="--metrics-advertised-address",
        )
        if self.meta is not None:
            self._published_read_only = self.read_only
            await self.meta.register(self._registration())
            self._registered = True
            self._read_only_changed()  # a fault during the registration
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._disk_loop(), name="disk-check"))
        self._tasks.append(loop.create_task(self._gc_loop(), name="gc"))

    async def _bind_framed(self, tls: TlsFiles | None) -> None:
        """Bind the framed add port (it serves once the service is up), with the gRPC
        port's TLS files and limits."""
        cfg = self.config
        self._framed = FramedAddServer(
            self.access,
            self.metrics,
            max_message_bytes=MAX_MESSAGE_BYTES,
            max_connections=cfg.max_concurrent_rpcs,
            hello_timeout_s=cfg.framed_hello_timeout_s,
            keepalive_time_s=cfg.keepalive_time_s,
            keepalive_timeout_s=cfg.keepalive_timeout_s,
        )
        ssl = tls.reloading_ssl_context() if tls is not None else None
        port = await self._framed.bind(cfg.host, cfg.framed_port, ssl)
        if cfg.framed_advertised_address:
            self.framed_address = advertised_address(
                cfg.host,
                port,
                cfg.framed_advertised_address,
                cfg.metadata_uri,
                what="--framed-advertised-address",
            )
        else:  # where clients dial the gRPC port, at the framed port
            self.framed_address = join_host_port(split_host_port(self.address)[0], port)

    async def _follow_principals(self) -> None:
        """Read the principal map before serving (an authenticating bookie without it
        would refuse everyone), then follow it."""
        if self.meta is None:
            raise ValueError(
                "authentication needs --metadata: the principal -> roles map lives there"
            )
        ready = asyncio.Event()
        task = asyncio.get_running_loop().create_task(
            follow_principals(self.meta.store, self.access, ready), name="principals"
        )
        self._tasks.append(task)
        waiting = asyncio.ensure_future(ready.wait())
        await asyncio.wait(
            [waiting, task],
            timeout=self.config.session_timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        waiting.cancel()
        if task.done():
            task.result()  # it failed: say why
        if not ready.is_set():
            raise OSError("cannot read the principal map from the metadata store")

    async def stop(self) -> None:
        if self._publishing is not None:
            self._tasks.append(self._publishing)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        if self.meta is not None:
            await self.meta.close()  # ends the session: the registration vanishes
        if self._framed is not None:
            await self._framed.close()
        if self._grpc is not None:
            await self._grpc.stop(grace=2)
        if self._http is not None:
            await self._http.close()
        if self._storage_started:
            await self.storage.close()

    # -- read-only mode ---------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        """Normal adds are refused while the disks are past the usage threshold or the
        storage cannot write (a journal or flush failure); recovery adds go on."""
        return self.disk_full or self.storage.fault is not None

    def _check_disks(self) -> None:
        """Update disk-full mode from disk usage (cheap: one statvfs per filesystem)."""
        cfg = self.config
        self.disk_usage, self.free_bytes, self.total_bytes = disk_usage(
            [self.data_dir, self.journal_dir]
        )
        self.metrics.disk_usage.set(self.disk_usage)
        # Every journaled byte is written again by the flush: count what the write cache
        # holds as used already, or a burst taken in at 69% fills the disk when flushed.
        data_fs = os.statvfs(self.data_dir)
        projected = self.disk_usage + self.storage.cache_bytes / max(
            1, data_fs.f_blocks * data_fs.f_frsize
        )
        if not self.disk_full and projected >= cfg.disk_usage_threshold:
            self.disk_full = True
            log.warning(
                "disk usage %.1f%% (%.1f%% once flushed) >= threshold: going read-only",
                100 * self.disk_usage,
                100 * projected,
            )
        elif self.disk_full and projected < cfg.disk_usage_lwm:
            self.disk_full = False
            log.warning("disk usage %.1f%% < low-water mark: writable again", 100 * projected)
        # The next check comes after an eighth of the headroom left is written to the
        # journal, so a burst cannot fill the disk between two timer ticks.
        headroom = self.total_bytes * (cfg.disk_usage_threshold - projected)
        self._unchecked_bytes = 0
        self._check_budget = max(1 << 20, int(headroom / 8))
        self._read_only_changed()

    def _on_commit(self, entries: int, nbytes: int, fsync_s: float) -> None:
        self.metrics.on_commit(entries, nbytes, fsync_s)
        self._unchecked_bytes += nbytes
        if self._unchecked_bytes >= self._check_budget:
            self._check_disks()

    def _on_storage_fault(self, reason: str | None) -> None:
        if reason is not None:
            self.metrics.storage_faults.inc()
            log.error("storage fault, read-only until the disk takes writes again: %s", reason)
        else:
            log.warning("storage writes succeed again")
        self._read_only_changed()

    def _read_only_changed(self) -> None:
        now = self.read_only
        self.metrics.read_only.set(1 if now else 0)
        self.metrics.read_only_reason.labels("disk_full").set(1 if self.disk_full else 0)
        fault = 1 if self.storage.fault is not None else 0
        self.metrics.read_only_reason.labels("storage_fault").set(fault)
        idle = self._publishing is None or self._publishing.done()
        if now != self._published_read_only and self._registered and idle:
            self._publishing = asyncio.get_running_loop().create_task(self._publish())

    async def _publish(self) -> None:
        """Bring the registration's read-only flag up to date (a failure is retried by
        the next disk check)."""
        while self.meta is not None and self._published_read_only != self.read_only:
            read_only = self.read_only
            try:
                await self.meta.set_read_only(read_only)
            except Exception as e:  # the metadata store is down: the disk loop retries
                log.error("could not re-register as read_only=%s: %s", read_only, e)
                return
            self._published_read_only = read_only

    async def _update_disk_state(self) -> None:
        self._check_disks()
        await self._publish()

    async def _disk_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.disk_check_interval_s)
            try:
                if self.storage.fault is not None:
                    await self.storage.heal()
                await self._update_disk_state()
            except Exception as e:  # keep checking; a metadata hiccup is retried next round
                log.error("disk check / re-registration failed: %s", e)

    # -- garbage collection -------------------------------------------------------------

    async def gc_round(self, *, force: bool = False) -> GcRound:
        """One GC round: delete the ledgers whose metadata is gone and the entries below
        each ledger's first listed entry, then compact entry logs (only compaction runs
        without metadata).

        A ledger missing from the metadata is deleted for good, so the round is refused
        (nothing deleted or compacted; logged, counted in bookie_gc_refused_rounds) when
        "missing" more likely means "wrong store": the store's cluster instance id is not
        the cookie's any more, or too many ledgers vanished at once. ``force`` skips both
        checks, for an operator who knows the deletion is real.
        """
        deleted: list[int] = []
        trimmed: dict[int, int] = {}
        if self.meta is not None:
            cfg = self.config
            try:
                if not force:
                    await self._check_gc_cluster(self.meta)
                collected = await self.storage.collect_garbage(
                    self.meta.first_entry,
                    max_vanished_fraction=None if force else cfg.gc_max_vanished_fraction,
                    vanish_check_min_ledgers=cfg.gc_vanish_check_min_ledgers,
                )
            except GcRefusedError as e:
                self.metrics.gc_refused.labels(e.reason).inc()
                refused = (
                    f"{e} Nothing was deleted, and every round is refused until this is "
                    f"resolved. To run one round that deletes every local ledger this store "
                    f"does not list: curl -X POST "
                    f"'http://{self.metrics_address}/admin/gc?force=true'"
                )
                log.warning("gc round refused: %s", refused)
                return GcRound(refused=refused)
            deleted, trimmed = collected.deleted, collected.trimmed
            self.metrics.gc_deleted.inc(len(deleted))
        compacted = await self.storage.compact(self.config.compaction_min_live_fraction)
        if deleted or trimmed or compacted:
            # What GC freed shows at once: checkpointed journal files go too, and a
            # bookie made read-only by a full disk need not wait for the next tick.
            await self.storage.reclaim_journal()
            await self._update_disk_state()
        return GcRound(deleted, trimmed, compacted)

    async def _check_gc_cluster(self, meta: MetadataLink) -> None:
        ours = self.cookie.cluster_instance_id if self.cookie else ""
        theirs = await meta.read_cluster_instance()
        if theirs is None:
            raise GcRefusedError(
                f"the metadata store {meta.uri} has no cluster instance id any more (this "
                f"bookie belongs to cluster {ours}): it was wiped or replaced under the "
                f"running bookie.",
                reason="cluster_mismatch",
            )
        if theirs != ours:
            raise GcRefusedError(
                f"the metadata store {meta.uri} is now cluster {theirs}, but this bookie "
                f"belongs to cluster {ours}: it was re-created or replaced under the running "
                f"bookie.",
                reason="cluster_mismatch",
            )

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gc_interval_s)
            try:
                done = await self.gc_round()
                if done.deleted or done.trimmed or done.compacted:
                    log.info(
                        "gc: deleted ledgers %s, trimmed %s, compacted logs %s",
                        done.deleted,
                        done.trimmed,
                        done.compacted,
                    )
            except Exception as e:  # metadata unreadable: skip this round, delete nothing
                log.error("gc round skipped: %s", e)

    # -- info ---------------------------------------------------------------------------

    def _registration(self) -> dict[str, object]:
        return {
            "bookie_id": self.bookie_id,
            "address": self.address,
            "rack": self.config.rack,
            "read_only": self.read_only,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "metrics_address": self.metrics_address,
            "framed_address": self.framed_address,
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
            "disk_full": self.disk_full,
            "storage_fault": self.storage.fault,
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
        force = params.get("force", "false").lower()
        if force not in ("true", "false"):
            raise ValueError(f"force must be true or false, got {force!r}")
        done = await self.gc_round(force=force == "true")
        return {
            "deleted": done.deleted,
            "trimmed": {str(k): v for k, v in done.trimmed.items()},
            "compacted": done.compacted,
            "refused": done.refused,
        }
