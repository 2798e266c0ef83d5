"""The ``bookie`` command: ``bookie serve ...`` runs a bookie, ``bookie bench ...`` measures one."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from bookie.errors import BookieError
from metadata.uri import credentials_in_uri


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metadata", help="metadata store URI (sqlite:///path, zk://host:port/chroot)")
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--journal-dir", type=Path, help="default: DATA_DIR/journal")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (0.0.0.0 for every interface; see --advertised-address)",
    )
    p.add_argument(
        "--advertised-address",
        metavar="HOST[:PORT]",
        help="what clients dial, registered in the metadata store (default: the --host "
        "address; with a wildcard --host, this host's address towards the metadata store)",
    )
    p.add_argument(
        "--metrics-host", help="address the metrics/admin HTTP port binds (default: --host)"
    )
    p.add_argument(
        "--metrics-advertised-address",
        metavar="HOST[:PORT]",
        help="registered address of the metrics/admin port (default: as for --advertised-address)",
    )
    p.add_argument("--port", type=int, default=3181, help="0 picks a free port")
    p.add_argument(
        "--framed-port",
        type=int,
        default=0,
        help="port of the framed add stream (adds without gRPC, same TLS and "
        "authentication), bound on --host and registered so clients find it; 0 (default) "
        "picks a free one, -1 serves none (clients then add over gRPC)",
    )
    p.add_argument(
        "--framed-advertised-address",
        metavar="HOST[:PORT]",
        help="registered address of the framed port (default: the advertised gRPC host "
        "with the framed port)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="HTTP port for /metrics and the admin API (bookie/http.py); 0 = free",
    )
    p.add_argument(
        "--bookie-id",
        help="a stable name (default: the one in the data directory's cookie, else the "
        "first advertised HOST:PORT)",
    )
    p.add_argument("--rack", default="/default-rack")
    p.add_argument("--max-entry-bytes", type=int, default=5 << 20)
    p.add_argument("--disk-usage-threshold", type=float, default=0.95)
    p.add_argument("--disk-usage-lwm", type=float, default=0.90)
    p.add_argument(
        "--disk-check-interval",
        type=float,
        default=5.0,
        help="seconds between disk-usage checks (also checked as journal commits use headroom)",
    )
    p.add_argument("--gc-interval", type=float, default=60.0, help="seconds")
    p.add_argument(
        "--gc-max-vanished-fraction",
        type=float,
        default=0.5,
        help="refuse a GC round in which more than this fraction of the bookie's ledgers "
        "vanished from the metadata at once (POST /admin/gc?force=true overrides)",
    )
    p.add_argument(
        "--gc-vanish-check-min-ledgers",
        type=int,
        default=10,
        help="apply --gc-max-vanished-fraction only to a bookie holding at least this many ledgers",
    )
    p.add_argument(
        "--allow-new-cluster",
        action="store_true",
        help="DANGEROUS: start although the metadata store has no or another cluster "
        "instance id than this bookie's cookie, and adopt it; the ledgers on this bookie "
        "that the store does not list are then garbage-collected. Only to move a bookie "
        "to another store on purpose",
    )
    p.add_argument("--flush-interval", type=float, default=1.0, help="seconds")
    p.add_argument(
        "--flush-bytes",
        type=int,
        default=64 << 20,
        help="flush the write cache at this size; past 4x it adds are refused "
        "(TOO_MANY_REQUESTS) until a flush",
    )
    p.add_argument("--journal-max-file-bytes", type=int, default=128 << 20)
    p.add_argument(
        "--journal-prealloc-bytes",
        type=int,
        default=16 << 20,
        help="journal files grow by this much at a time, so a sync needs no metadata commit",
    )
    p.add_argument(
        "--journal-inline-sync-ms",
        type=float,
        default=2.0,
        help="an idle journal commits on the event loop (no thread hop) while its last "
        "sync took at most this long; 0: always in a worker thread",
    )
    p.add_argument(
        "--entrylog-max-file-bytes",
        type=int,
        default=512 << 20,
        help="an entry log rolls past this size (GC also rolls one that holds dead data)",
    )
    p.add_argument("--session-timeout", type=float, default=10.0, help="metadata session, seconds")
    limits = p.add_argument_group("limits")
    limits.add_argument(
        "--max-stream-answer-bytes",
        type=int,
        default=4 << 20,
        help="answers one add stream may queue for a client not reading them before it "
        "stops reading that client's requests (default %(default)s)",
    )
    limits.add_argument(
        "--max-stream-inflight-bytes",
        type=int,
        default=64 << 20,
        help="entry bytes one add stream may have waiting for the journal before it "
        "stops reading that client's requests (default %(default)s)",
    )
    limits.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=1024,
        help="calls served at once (add streams and long polls included); more are "
        "refused with RESOURCE_EXHAUSTED (default %(default)s)",
    )
    limits.add_argument(
        "--framed-hello-timeout",
        type=float,
        default=5.0,
        help="close a framed-port connection that has not said hello (TLS handshake "
        "included) within this long, s (default %(default)s)",
    )
    limits.add_argument(
        "--keepalive-time",
        type=float,
        default=30.0,
        help="ping each connection this often, s (default %(default)s)",
    )
    limits.add_argument(
        "--keepalive-timeout",
        type=float,
        default=10.0,
        help="close a connection whose ping is unanswered this long, s (default %(default)s)",
    )
    limits.add_argument(
        "--min-client-ping-interval",
        type=float,
        default=10.0,
        help="clients pinging more often get GOAWAY too_many_pings, s (default %(default)s)",
    )
    limits.add_argument(
        "--max-connection-idle",
        type=float,
        default=600.0,
        help="close connections without calls after this long, s (default %(default)s; 0: never)",
    )
    limits.add_argument(
        "--max-connection-age",
        type=float,
        default=3600.0,
        help="older connections take no new calls (their open streams go on), s "
        "(default %(default)s; 0: never)",
    )
    tls = p.add_argument_group("TLS (PEM files, read at start)")
    tls.add_argument("--tls-cert", type=Path, help="serve gRPC over TLS with this certificate")
    tls.add_argument("--tls-key", type=Path, help="the private key of --tls-cert")
    tls.add_argument("--tls-ca", type=Path, help="CA that signs client certificates")
    tls.add_argument(
        "--tls-client-auth",
        action="store_true",
        help="mutual TLS: refuse clients without a certificate signed by --tls-ca; the "
        "certificate's common name is the caller's principal (roles enforced)",
    )
    auth = p.add_argument_group(
        "token authentication (JWT; with it or --tls-client-auth every request needs a "
        "principal, whose roles come from the metadata store's principal map)"
    )
    auth.add_argument(
        "--auth-token-secret-file", type=Path, help="the HS256 secret key tokens are signed with"
    )
    auth.add_argument(
        "--auth-token-public-key-file",
        type=Path,
        help="the RS256 public key (PEM) that verifies tokens",
    )
    p.add_argument("--log-level", default="WARNING")
    p.add_argument(
        "--autorecovery",
        action="store_true",
        help="also run an auto-recovery node (child process `python -m streamlib.autorecovery`)",
    )
    p.add_argument(
        "--autorecovery-option",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the auto-recovery node, e.g. --autorecovery-option=--grace-period=5",
    )


def _start_autorecovery(args: argparse.Namespace, bookie_id: str) -> subprocess.Popen[bytes]:
    # A child process: the bookie package must never import the client (streamlib).
    command = [sys.executable, "-m", "streamlib.autorecovery", "--metadata", args.metadata]
    # (It inherits our environment: STREAMLIB_TOKEN / STREAMLIB_TOKEN_FILE give it a
    # principal with the bookie role where tokens are the authentication.)
    command += ["--id", bookie_id, "--log-level", args.log_level, "--exit-with-stdin"]
    # The child's stdin is a pipe only we hold: if we die (even by SIGKILL) it sees EOF
    # and stops, so no node outlives its bookie.
    command += args.autorecovery_option
    env = dict(os.environ)
    if args.tls_ca:
        # The node dials the bookies as a client (paths, never the keys, in its
        # environment): it trusts our CA and shows our certificate for mutual TLS.
        env["STREAMLIB_TLS_CA"] = str(args.tls_ca)
        if args.tls_cert and args.tls_key:
            env["STREAMLIB_TLS_CERT"], env["STREAMLIB_TLS_KEY"] = (
                str(args.tls_cert),
                str(args.tls_key),
            )
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)


async def _serve(args: argparse.Namespace) -> int:
    from bookie.server import BookieConfig, BookieServer

    if args.autorecovery and not args.metadata:
        raise ValueError("--autorecovery needs --metadata")
    if args.metadata and credentials_in_uri(args.metadata):
        raise ValueError(
            "the --metadata URI carries a password, which every local user sees in the "
            "process list: put it in a file (zk://...?auth_file=PATH) or $STREAMLIB_ZK_AUTH"
        )
    # Everything the bookie writes (journal, entry logs, index, ledger keys, cookie) is
    # for its own user only: directories 0700, files 0600.
    os.umask(0o077)
    config = BookieConfig(
        data_dir=args.data_dir,
        journal_dir=args.journal_dir,
        metadata_uri=args.metadata,
        host=args.host,
        advertised_address=args.advertised_address,
        metrics_host=args.metrics_host,
        metrics_advertised_address=args.metrics_advertised_address,
        port=args.port,
        framed_port=args.framed_port,
        framed_advertised_address=args.framed_advertised_address,
        framed_hello_timeout_s=args.framed_hello_timeout,
        metrics_port=args.metrics_port,
        bookie_id=args.bookie_id,
        rack=args.rack,
        max_entry_bytes=args.max_entry_bytes,
        disk_usage_threshold=args.disk_usage_threshold,
        disk_usage_lwm=args.disk_usage_lwm,
        disk_check_interval_s=args.disk_check_interval,
        gc_interval_s=args.gc_interval,
        gc_max_vanished_fraction=args.gc_max_vanished_fraction,
        gc_vanish_check_min_ledgers=args.gc_vanish_check_min_ledgers,
        allow_new_cluster=args.allow_new_cluster,
        flush_interval_s=args.flush_interval,
        flush_bytes=args.flush_bytes,
        journal_max_file_bytes=args.journal_max_file_bytes,
        journal_prealloc_bytes=args.journal_prealloc_bytes,
        journal_inline_sync_s=args.journal_inline_sync_ms / 1000,
        entrylog_max_file_bytes=args.entrylog_max_file_bytes,
        session_timeout_s=args.session_timeout,
        max_stream_answer_bytes=args.max_stream_answer_bytes,
        max_stream_inflight_bytes=args.max_stream_inflight_bytes,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        keepalive_time_s=args.keepalive_time,
        keepalive_timeout_s=args.keepalive_timeout,
        min_client_ping_interval_s=args.min_client_ping_interval,
        max_connection_idle_s=args.max_connection_idle,
        max_connection_age_s=args.max_connection_age,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        tls_client_auth=args.tls_client_auth,
        auth_token_secret_file=args.auth_token_secret_file,
        auth_token_public_key_file=args.auth_token_public_key_file,
    )
    server = BookieServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except BaseException:
        await server.stop()
        raise
    # The add path allocates a few objects per entry and the write cache keeps them
    # alive until the flush, so default cyclic-GC settings rescan them again and again.
    # Freezing the startup heap and collecting young objects less often cut the bookie's
    # CPU per acknowledged entry by ~14% in `bookie bench` (4 alternating A/B pairs).
    gc.freeze()
    gc.set_threshold(20_000, 50, 50)
    autorecovery = _start_autorecovery(args, server.bookie_id) if args.autorecovery else None
    print(
        f"bookie {server.bookie_id} listening on {server.address} "
        f"(metrics {server.metrics_address})"
        + (f" (framed {server.framed_address})" if server.framed_address else ""),
        flush=True,
    )
    await stop.wait()
    if autorecovery is not None:
        autorecovery.terminate()
        await asyncio.to_thread(autorecovery.wait)
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bookie", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_args(sub.add_parser("serve", help="run a bookie"))
    bench = sub.add_parser("bench", help="start one bookie and measure the add stream")
    from bookie.bench import add_bench_args

    add_bench_args(bench)
    args = parser.parse_args(argv)
    if args.command == "bench":
        from bookie.bench import main_bench

        return main_bench(args)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(_serve(args))
    except (BookieError, ValueError, OSError) as e:
        print(f"bookie: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # e.g. the metadata store is unreachable: say so, exit non-zero
        logging.getLogger("bookie").debug("start failed", exc_info=True)
        print(f"bookie: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
