"""Prometheus metrics of one bookie, in a registry of its own (one per server object).

Latencies are observed once per request batch (not per entry) to keep the hot path
cheap; add latency is from receiving a batch to its acknowledgement being queued.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LAT = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class BookieMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.adds = Counter("bookie_add_entries", "Entries acknowledged OK", registry=r)
        self.add_errors = Counter(
            "bookie_add_errors", "Entries refused or failed", ["status"], registry=r
        )
        self.add_bytes = Counter(
            "bookie_add_bytes", "Bytes of entry records accepted (payload and headers)", registry=r
        )
        self.add_stream_pauses = Counter(
            "bookie_add_stream_pauses",
            "Times an add stream stopped reading: its client was not reading its answers, "
            "or the stream had too many bytes waiting for the journal",
            registry=r,
        )
        self.add_latency = Histogram(
            "bookie_add_batch_latency_seconds",
            "Receive-to-ack time of an add batch",
            buckets=_LAT,
            registry=r,
        )
        self.lac_errors = Counter(
            "bookie_stream_lac_errors",
            "Explicit LACs sent on an add stream and refused (never answered), by status",
            ["status"],
            registry=r,
        )
        self.auth_refusals = Counter(
            "bookie_auth_refusals",
            "Requests refused by authentication (unauthenticated) or by the principal's roles",
            ["reason"],
            registry=r,
        )
        self.framed_connections = Counter(
            "bookie_framed_connections",
            "Connections to the framed add port, by how they began (ok: an add stream; "
            "unauthenticated, bad_hello, too_many, no_hello: refused or closed at the "
            "hello; bad_frame: ended by a frame past the size limit)",
            ["outcome"],
            registry=r,
        )
        self.framed_open = Gauge(
            "bookie_framed_open_connections", "Connections open to the framed add port", registry=r
        )
        self.reads = Counter("bookie_read_entries", "Entries read", registry=r)
        self.read_bytes = Counter("bookie_read_payload_bytes", "Payload bytes read", registry=r)
        self.read_latency = Histogram(
            "bookie_read_latency_seconds", "ReadEntries request latency", buckets=_LAT, registry=r
        )
        self.fsync_latency = Histogram(
            "bookie_journal_fsync_seconds", "Journal fdatasync latency", buckets=_LAT, registry=r
        )
        self.entries_per_fsync = Histogram(
            "bookie_journal_entries_per_fsync",
            "Entries committed by one journal fdatasync",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
            registry=r,
        )
        self.journal_bytes = Counter(
            "bookie_journal_bytes", "Bytes written to the journal", registry=r
        )
        self.fsyncs = Counter("bookie_journal_fsyncs", "Journal fdatasyncs", registry=r)
        self.read_only = Gauge("bookie_read_only", "1 while the bookie is read-only", registry=r)
        self.read_only_reason = Gauge(
            "bookie_read_only_reason",
            "1 for each reason the bookie is read-only now (disk_full: usage past the "
            "threshold; storage_fault: a journal or flush write failed)",
            ["reason"],
            registry=r,
        )
        self.storage_faults = Counter(
            "bookie_storage_faults",
            "Journal or flush write failures that turned the bookie read-only",
            registry=r,
        )
        for reason in ("disk_full", "storage_fault"):
            self.read_only_reason.labels(reason).set(0)
        self.disk_usage = Gauge(
            "bookie_disk_usage_ratio", "Highest used fraction of its disks", registry=r
        )
        self.gc_deleted = Counter(
            "bookie_gc_deleted_ledgers", "Ledgers garbage-collected", registry=r
        )
        self.gc_refused = Counter(
            "bookie_gc_refused_rounds",
            "GC rounds that deleted nothing because the metadata looked wrong "
            "(cluster_mismatch: another or no cluster instance id; mass_vanish: too many "
            "ledgers gone at once)",
            ["reason"],
            registry=r,
        )
        for reason in ("cluster_mismatch", "mass_vanish"):
            self.gc_refused.labels(reason)  # exported as 0 from the start, for alerts

    def on_commit(self, entries: int, nbytes: int, fsync_s: float) -> None:
        self.fsyncs.inc()
        self.fsync_latency.observe(fsync_s)
        self.entries_per_fsync.observe(entries)
        self.journal_bytes.inc(nbytes)
