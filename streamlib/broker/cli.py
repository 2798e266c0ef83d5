"""`streamlib broker`: run a broker of the stream service; `streamlib admin broker
list | load | owner STREAM | unload STREAM | pin STREAM BROKER_ID | unpin STREAM | pins`.

The broker prints one line when it serves: ``broker ID listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
from typing import Any

from streamlib.broker.access import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_PRINCIPAL,
    BrokerAccess,
    Budgets,
    SessionLimits,
)
from streamlib.broker.dedup import INACTIVITY_TIMEOUT_S, MIN_RECENT_IDS, RECENT_IDS
from streamlib.broker.owned import SNAPSHOT_INTERVAL_S
from streamlib.commands.common import fail, positive_float, token_source

Subparsers = Any
_FOLLOWING: set[asyncio.Task[None]] = set()
PULSAR_ADMIN_PORT = 8080  # Pulsar's webServicePort
PULSAR_PORT = 6650  # Pulsar's own (take --port elsewhere then: it is the gRPC port's default)


def add_parsers(commands: Subparsers, admin_commands: Subparsers) -> None:
    serve = commands.add_parser("broker", help="run a broker of the stream service (daemon)")
    serve.add_argument("--metadata", required=True, help="metadata store URI (zk://, sqlite://)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=6650, help="port (0: any free one)")
    serve.add_argument(
        "--advertised-address",
        help="HOST[:PORT] clients dial (default: the bind host; with a wildcard bind, the "
        "host's primary address)",
    )
    serve.add_argument("--broker-id", help="a stable name (default: the advertised address)")
    serve.add_argument("--session-timeout", type=float, default=10.0)
    serve.add_argument(
        "--dedup-snapshot-interval",
        type=float,
        default=SNAPSHOT_INTERVAL_S,
        metavar="SECONDS",
        help="at least this long between two snapshots of a stream's dedup state (Pulsar's "
        f"brokerDeduplicationSnapshotIntervalSeconds; default {SNAPSHOT_INTERVAL_S:g})",
    )
    serve.add_argument(
        "--dedup-inactivity-timeout",
        type=positive_float,
        default=INACTIVITY_TIMEOUT_S,
        metavar="SECONDS",
        help="forget the dedup state of a producer name that is not connected and sent "
        "nothing for this long (Pulsar's brokerDeduplicationProducerInactivityTimeoutMinutes;"
        " default 6 h)",
    )
    serve.add_argument("--tls-cert", help="PEM certificate: serve over TLS")
    serve.add_argument("--tls-key", help="PEM key of --tls-cert")
    serve.add_argument("--tls-ca", help="PEM CA: bookies' (and, with --tls-client-auth, clients')")
    serve.add_argument("--tls-client-auth", action="store_true", help="require client certificates")
    serve.add_argument(
        "--token",
        metavar="file:PATH|env:NAME",
        type=token_source,
        help="where the JWT the broker presents to bookies is (default: $STREAMLIB_TOKEN or "
        "$STREAMLIB_TOKEN_FILE); never the token itself, which every local user would see",
    )
    serve.add_argument(
        "--auth-token-secret-file",
        help="authenticate clients by HS256 tokens signed with this secret (as the bookies)",
    )
    serve.add_argument(
        "--auth-token-public-key-file", help="... or by RS256 tokens checked with this key"
    )
    serve.add_argument(
        "--allow-auto-create",
        choices=["true", "false"],
        default="true",
        help="whether a producer, consumer or lookup naming a stream that does not exist "
        "creates it, for a caller that may create streams (Pulsar's allowAutoTopicCreation; "
        "default true; the secure sandbox sets false)",
    )
    defaults = Budgets()
    for flag, dest, default, text in (
        ("--max-sessions", "max_sessions", DEFAULT_MAX_SESSIONS,
         "producers, consumers and readers this broker serves at once; one more is refused "
         "with TooManySessionsError"),
        ("--max-sessions-per-principal", "max_sessions_per_principal",
         DEFAULT_MAX_SESSIONS_PER_PRINCIPAL, "... of them one principal may hold"),
        ("--max-read-ahead-bytes-per-subscription", "read_ahead_bytes_per_subscription",
         defaults.read_ahead_bytes_per_subscription,
         "bytes a subscription reads ahead of its consumers"),
        ("--max-unacked-bytes-per-consumer", "unacked_bytes_per_consumer",
         defaults.unacked_bytes_per_consumer,
         "bytes handed to a consumer and not yet acknowledged before it gets no more (at "
         "least one message always goes)"),
        ("--max-unacked-messages-per-consumer", "unacked_messages_per_consumer",
         defaults.unacked_messages_per_consumer,
         "... and messages (Pulsar's maxUnackedMessagesPerConsumer)"),
        ("--max-publish-buffer-bytes", "publish_buffer_bytes", defaults.publish_buffer_bytes,
         "bytes of sends read from producers and not yet stored, for the whole broker (past "
         "it, producers wait: Pulsar's maxMessagePublishBufferSizeInMB)"),
        ("--max-dedup-recent-ids", "dedup_recent_ids", defaults.dedup_recent_ids,
         "positions of producers' recent sequence ids (what a duplicate is answered with) "
         "the streams' deduplication keeps, for the whole broker: each producer name keeps "
         f"its share, {MIN_RECENT_IDS} to {RECENT_IDS}"),
    ):  # fmt: skip
        serve.add_argument(
            flag,
            dest=dest,
            type=_positive,
            default=default,
            metavar="N",
            help=f"{text} (default {default})",
        )
    _pulsar_arguments(serve)
    _pulsar_admin_arguments(serve)
    _balance_arguments(serve)
    serve.add_argument(
        "--gc-thresholds",
        type=_gc_thresholds,
        default=GC_THRESHOLDS,
        metavar="G0,G1,G2",
        help="Python's collector thresholds (gc.set_threshold; default "
        f"{','.join(map(str, GC_THRESHOLDS))}): Python's own 700,10,10 scanned a broker of "
        "thousands of streams whole several times a second",
    )
    serve.add_argument(
        "--quiet-lac-ms",
        type=_non_negative,
        default=0,
        metavar="MS",
        help="a stream's writer that has nothing in flight tells the bookies its last "
        "entry's LAC after this long unless an add carries it first (default 0: at once). "
        "A broker of many streams at a message a second or so halves its bookie messages "
        "with 1000; then whoever reads a stream from the bookies (direct mode, Spark, "
        "another broker's admin answers) sees a quiet stream's last entry up to that late. "
        "The broker's own consumers read its writes at once either way",
    )
    serve.add_argument("--log-level", default="WARNING")
    serve.add_argument("--exit-with-stdin", action="store_true", help="stop when stdin closes")
    serve.set_defaults(run=_run_broker)

    admin = admin_commands.add_parser("broker", help="the stream service's brokers")
    admin.add_argument(
        "action", choices=["list", "load", "unload", "owner", "pin", "unpin", "pins"]
    )
    admin.add_argument("stream", nargs="?", help="the stream (unload, owner, pin, unpin)")
    admin.add_argument("broker_id", nargs="?", help="the broker to pin the stream to (pin)")
    admin.add_argument("--json", action="store_true", help="load: one JSON object a broker")
    admin.add_argument("--metadata", default=os.environ.get("STREAMLIB_METADATA"), required=False)
    admin.set_defaults(run=_run_admin)


def _pulsar_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--pulsar-port",
        type=int,
        nargs="?",
        const=PULSAR_PORT,
        metavar="P",
        help="serve Pulsar's binary protocol on this port too (the bare flag: "
        f"{PULSAR_PORT}; 0: any free one): the official Pulsar clients connect unmodified "
        "(pulsar://, or pulsar+ssl:// when the broker has --tls-cert)",
    )


def _balance_arguments(serve: argparse.ArgumentParser) -> None:
    from streamlib.broker.balance import DEFAULT_SHED_INTERVAL_S, BalanceConfig

    defaults = BalanceConfig()
    serve.add_argument(
        "--load-report-interval",
        type=positive_float,
        default=defaults.report_interval_s,
        metavar="SECONDS",
        help="renew this broker's load report (streams, msgs/s, bytes/s, CPU) this often "
        f"(default {defaults.report_interval_s:g})",
    )
    serve.add_argument(
        "--load-shed-interval",
        type=positive_float,
        default=DEFAULT_SHED_INTERVAL_S,
        metavar="SECONDS",
        help="the elected load manager's shedding pass runs this often (Pulsar's "
        f"loadBalancerSheddingIntervalMinutes; default {DEFAULT_SHED_INTERVAL_S:g}); a moved "
        "stream stays where it went for 5 passes",
    )
    serve.add_argument(
        "--load-shed-threshold",
        type=float,
        default=defaults.threshold,
        metavar="FRACTION",
        help="a broker whose load is above the cluster's average by more than this sheds "
        f"streams (1.0: an average broker's load; default {defaults.threshold:g}, as Pulsar's "
        "ThresholdShedder's 10 %%)",
    )
    serve.add_argument(
        "--load-shed-max-streams",
        type=_positive,
        default=defaults.max_streams,
        metavar="N",
        help=f"streams moved per shedding pass, at most (default {defaults.max_streams})",
    )
    serve.add_argument(
        "--load-shedding",
        choices=["true", "false"],
        default="true",
        help="whether this broker campaigns to run the shedding passes (Pulsar's "
        "loadBalancerSheddingEnabled; default true)",
    )


def _pulsar_admin_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--pulsar-admin-port",
        type=int,
        nargs="?",
        const=PULSAR_ADMIN_PORT,
        metavar="Q",
        help="serve the Pulsar admin REST API pulsar-admin and Pulsar's clients use on this "
        f"port too (the bare flag: {PULSAR_ADMIN_PORT}; 0: any free one): HTTPS when the "
        "broker has --tls-cert (docs/pulsar-admin.md)",
    )
    serve.add_argument(
        "--pulsar-admin-host", metavar="H", help="address the admin port binds (default: --host)"
    )


# The collector's thresholds in a broker. A broker holds a few hundred objects a
# stream for as long as it serves it, and makes new ones with every message. Python's
# 700,10,10 makes each full collection scan the whole heap, and as the heap grew with
# the streams opened, full collections came one on another. With 1,000 streams that
# was a third of the broker's time (`streamlib bench service --streams 1000`: 11 s of
# 40, 7.5 s of it in 30 full collections). Young collections every 50,000 allocations,
# and a full one after 100 of the middle ones (and only once the heap grew by a quarter,
# Python's own rule), leave it an eighth (5 s of 40, no full collection). A cycle of
# garbage that outlives a middle collection waits for the next full one: memory bounded
# by what a hundred middle collections let through.
GC_THRESHOLDS = (50_000, 20, 100)


def _gc_thresholds(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not three integers: {text!r}") from None
    if len(values) != 3 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"three integers >= 1 (G0,G1,G2), got {text!r}")
    return values[0], values[1], values[2]


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {value}")
    return value


def _fail(message: str) -> int:
    """One line, as every command's errors (streamlib.commands.common.fail)."""
    return fail(message)


def _run_broker(args: argparse.Namespace) -> int:
    import logging

    from metadata.errors import MetadataError
    from streamlib.protocol.errors import StreamlibError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    gc.set_threshold(*args.gc_thresholds)
    try:
        return asyncio.run(_serve(args))
    except (StreamlibError, MetadataError, ValueError, OSError) as exc:
        return _fail(f"{type(exc).__name__}: {exc}")


async def _serve(args: argparse.Namespace) -> int:
    import grpc

    from bookie.addresses import advertised_address
    from bookie.tls import TlsFiles
    from streamlib.broker.server import Broker, BrokerService, server_options
    from streamlib.client import Client
    from streamlib.wire import broker_pb2_grpc as pb_grpc

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    server = grpc.aio.server(options=server_options())
    bind = f"{args.host}:{args.port}"
    tls = None
    if args.tls_cert:
        from pathlib import Path

        tls = TlsFiles(
            Path(args.tls_cert),
            Path(args.tls_key),
            Path(args.tls_ca) if args.tls_ca else None,
            args.tls_client_auth,
        )
        port = server.add_secure_port(bind, tls.grpc_credentials())
    else:
        port = server.add_insecure_port(bind)
    if not port:
        raise OSError(f"cannot bind {bind}")
    address = advertised_address(args.host, port, args.advertised_address, args.metadata)
    client = await Client.connect(
        args.metadata,
        session_timeout_s=args.session_timeout,
        **({"tls_ca": args.tls_ca} if args.tls_ca else {}),
        **({"token": args.token} if args.token else {}),
    )
    if args.quiet_lac_ms:
        client.context.quiet_lac_s = args.quiet_lac_ms / 1000
    budgets = Budgets(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Budgets)})
    from streamlib.broker.balance import BalanceConfig

    balance = BalanceConfig(
        report_interval_s=args.load_report_interval,
        shed_interval_s=args.load_shed_interval,
        threshold=args.load_shed_threshold,
        max_streams=args.load_shed_max_streams,
        shedding=args.load_shedding == "true",
    )
    broker = Broker(
        client,
        args.broker_id or address,
        address,
        allow_auto_create=args.allow_auto_create == "true",
        budgets=budgets,
        dedup_inactivity_timeout_s=args.dedup_inactivity_timeout,
        dedup_snapshot_interval_s=args.dedup_snapshot_interval,
        balance=balance,
    )
    access = await _access_control(args, client)
    limits = SessionLimits(args.max_sessions, args.max_sessions_per_principal)
    from streamlib.daemons import stop_event

    service = BrokerService(broker, access, limits)
    stop = stop_event(args.exit_with_stdin)
    pulsar = admin_http = None
    try:
        if args.pulsar_port is not None:
            pulsar = await _serve_pulsar(args, service, tls)
        admin_http = await _bind_pulsar_admin(args, broker, access, tls)
        await broker.start(args.session_timeout)
        if admin_http is not None:
            await admin_http.serve()
        pb_grpc.add_BrokerServicer_to_server(service, server)
        await server.start()
        print(f"broker {broker.broker_id} listening on {address}", flush=True)
        if pulsar is not None:
            print(f"pulsar listening on {broker.pulsar_url or broker.pulsar_url_tls}", flush=True)
        if admin_http is not None:
            print(f"pulsar admin listening on {broker.http_url}", flush=True)
        await stop.wait()
    finally:
        if admin_http is not None:
            await admin_http.close()
        if pulsar is not None:
            await pulsar.close()
        await broker.close()
        await server.stop(grace=1.0)
        await client.close()
    return 0


async def _serve_pulsar(args: argparse.Namespace, service: Any, tls: Any) -> Any:
    """The Pulsar port (streamlib/broker/pulsar_server.py), bound before the broker registers:
    its URL is in the registration lookups answer with. TLS when the broker has it."""
    from streamlib.broker.pulsar_server import PulsarFrontEnd

    if args.pulsar_port == args.port and args.port != 0:
        raise ValueError(
            f"--pulsar-port {args.pulsar_port} is the gRPC port (--port): give either another"
        )
    front = PulsarFrontEnd(service)
    port = await front.bind(
        args.host, args.pulsar_port, tls.reloading_ssl_context() if tls else None
    )
    where = _advertised_at(args, args.host, port)
    if tls:
        service.broker.pulsar_url_tls = f"pulsar+ssl://{where}"
    else:
        service.broker.pulsar_url = f"pulsar://{where}"
    return front


def _advertised_at(args: argparse.Namespace, host: str, port: int) -> str:
    """HOST:PORT clients dial for another port of this broker (bound on host): the
    advertised address's host -- or, without one, as the gRPC port's is found -- and it."""
    from bookie.addresses import advertised_address, split_host_port

    given = split_host_port(args.advertised_address, 0)[0] if args.advertised_address else None
    return advertised_address(host, port, given, args.metadata)


async def _bind_pulsar_admin(args: argparse.Namespace, broker: Any, access: Any, tls: Any) -> Any:
    """The Pulsar admin REST port (streamlib/broker/pulsar_admin.py), bound before the
    broker registers (its http_url is in the registration) and serving after; None
    without --pulsar-admin-port. Advertised as the gRPC port is (its host, this port)."""
    if args.pulsar_admin_port is None:
        return None
    from streamlib.broker.pulsar_admin import serve_admin

    host = args.host if args.pulsar_admin_host is None else args.pulsar_admin_host
    ssl_context = tls.reloading_ssl_context() if tls else None
    server, port = await serve_admin(broker, access, host, args.pulsar_admin_port, ssl_context)
    broker.http_url = f"{'https' if tls else 'http'}://{_advertised_at(args, host, port)}"
    return server


async def _access_control(args: argparse.Namespace, client: Any) -> BrokerAccess:
    """The bookies' authentication and roles (bookie/auth.py), when asked for, and the
    brokers' subscription grants (streamlib/broker/access.py); off: everyone may do
    everything. Roles and grants come from the metadata store (`streamlib admin
    principals`), followed by watches."""
    from pathlib import Path

    from bookie.auth import AccessControl, TokenVerifier, follow_principals
    from streamlib.broker.access import follow_grants

    secret, public = args.auth_token_secret_file, args.auth_token_public_key_file
    if secret is None and public is None and not args.tls_client_auth:
        return BrokerAccess()
    tokens = None
    if secret is not None or public is not None:
        tokens = TokenVerifier.from_files(
            Path(secret) if secret else None, Path(public) if public else None, server="broker"
        )
    control = AccessControl(
        _BrokerMetrics(), tokens=tokens, certificates=args.tls_client_auth, server="broker"
    )
    access = BrokerAccess(control)
    loop = asyncio.get_running_loop()
    roles_read, grants_read = asyncio.Event(), asyncio.Event()
    for following in (
        follow_principals(client.store, control, roles_read),
        follow_grants(client.store, access, grants_read),
    ):
        task = loop.create_task(following)
        _FOLLOWING.add(task)  # (a reference, so the task lives as long as the broker)
    await asyncio.wait_for(asyncio.gather(roles_read.wait(), grants_read.wait()), 30)
    return access


class _BrokerMetrics:
    """What AccessControl counts: refusals by reason."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter

        self.registry = CollectorRegistry()
        self.auth_refusals = Counter(
            "broker_auth_refusals",
            "requests refused, by reason",
            ["reason"],
            registry=self.registry,
        )


def _run_admin(args: argparse.Namespace) -> int:
    from metadata.errors import MetadataError
    from streamlib.protocol.errors import StreamlibError

    if not args.metadata:
        return _fail("give --metadata URI (or set STREAMLIB_METADATA)")
    if args.action in ("unload", "owner", "pin", "unpin") and not args.stream:
        return _fail(f"admin broker {args.action} needs a STREAM")
    if args.action == "pin" and not args.broker_id:
        return _fail("admin broker pin needs a STREAM and a BROKER_ID")
    try:
        return asyncio.run(_admin(args))
    except (StreamlibError, MetadataError, ValueError, OSError) as exc:
        return _fail(f"{type(exc).__name__}: {exc}")


async def _admin(args: argparse.Namespace) -> int:
    import json

    import metadata
    from metadata.services.brokers import BrokerRegistry

    store = await metadata.connect(args.metadata)
    try:
        registry = BrokerRegistry(store)
        if args.action == "list":
            for info in await registry.live():
                print(json.dumps({"broker_id": info.broker_id, "address": info.address,
                                  "owned": info.owned, "pid": info.pid}))  # fmt: skip
            return 0
        if args.action in ("load", "pin", "unpin", "pins"):
            from streamlib.broker.load_admin import run

            return await run(store, registry, args)
        owner = await registry.owner(args.stream)
        if args.action == "owner":
            print(owner.broker_id + " " + owner.address if owner else "none")
            return 0
        if owner is None:
            print(f"{args.stream}: no broker owns it")
            return 0
    finally:
        await store.close()
    from streamlib.service.client import unload

    await unload(owner.address, args.stream)
    print(f"{args.stream}: unloaded from {owner.broker_id}")
    return 0
