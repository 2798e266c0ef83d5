"""Command line of auto-recovery: the daemon and the admin commands.

    streamlib autorecovery --metadata URI [--lost-bookie-delay S] [--grace-period S]
                           [--check-interval S] [--retention-interval S]
                           [--compaction-interval S]
    streamlib admin autorecovery status|enable|disable|audit-now --metadata URI
    streamlib admin recover BOOKIE --metadata URI
    streamlib admin decommission BOOKIE --metadata URI

streamlib.cli wires these in with :func:`add_parsers`; :func:`main` runs them alone
(``python -m streamlib.autorecovery`` is the daemon). Errors: one line on stderr and
exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from metadata.errors import MetadataError
from streamlib.protocol.errors import StreamlibError

if TYPE_CHECKING:
    from streamlib.client import Client

# argparse's subparsers object (its class is private).
Subparsers = Any


def _metadata_arg(p: argparse.ArgumentParser) -> None:
    from streamlib.commands.common import metadata_uri_arg

    p.add_argument(
        "--metadata",
        required=True,
        type=metadata_uri_arg,
        help="metadata store URI (sqlite:///path, zk://host:port/chroot)",
    )
    p.add_argument("--session-timeout", type=float, default=10.0, help="metadata session, s")


def add_parsers(commands: Subparsers, admin_commands: Subparsers) -> None:
    """Add `autorecovery` to `commands` and `autorecovery`, `recover` and
    `decommission` to `admin_commands`; each parser sets run(args) -> exit code."""
    daemon = commands.add_parser("autorecovery", help="run an auto-recovery node (daemon)")
    _metadata_arg(daemon)
    daemon.add_argument("--id", help="this node's name in the auditor election; default host:pid")
    daemon.add_argument(
        "--lost-bookie-delay",
        type=float,
        default=30.0,
        help="seconds a lost bookie has to come back before its ledgers are marked",
    )
    daemon.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        help="seconds an OPEN ledger's writer keeps its under-replicated last fragment",
    )
    daemon.add_argument(
        "--check-interval",
        type=float,
        default=3600.0,
        help="seconds between full checks of every ledger (0 = never)",
    )
    daemon.add_argument(
        "--retention-interval",
        type=float,
        default=300.0,
        help="seconds between applying every stream's retention, idle streams too, and "
        "sweeping leaked ledgers (0 = never)",
    )
    daemon.add_argument(
        "--compaction-interval",
        type=float,
        default=60.0,
        help="seconds between looking for streams past their compaction threshold, and "
        "compacting them (0 = never; see `admin streams set-policies`)",
    )
    daemon.add_argument("--log-level", default="WARNING")
    daemon.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="stop when stdin closes (how `bookie serve --autorecovery` ties us to it)",
    )
    daemon.set_defaults(run=_run_daemon)

    admin = admin_commands.add_parser("autorecovery", help="auto-recovery status and switches")
    admin.add_argument("action", choices=["status", "enable", "disable", "audit-now"])
    _metadata_arg(admin)
    admin.add_argument("--json", action="store_true", help="status as JSON")
    admin.set_defaults(run=lambda args: _run(args, _admin_autorecovery))

    for name, text in (
        ("recover", "re-replicate every ledger fragment a bookie held"),
        (
            "decommission",
            "re-replicate a down or read-only bookie's data, wait until done, then delete "
            "its cookie (the id can then join again as a new bookie)",
        ),
    ):
        p = admin_commands.add_parser(name, help=text)
        p.add_argument("bookie", metavar="BOOKIE", help="the bookie id (host:port)")
        _metadata_arg(p)
        p.add_argument(
            "--grace-period",
            type=float,
            default=30.0,
            help="seconds before an OPEN ledger on the bookie is fenced and recovered",
        )
        p.add_argument("--timeout", type=float, help="give up after this many seconds")
        p.set_defaults(run=lambda args: _run(args, _admin_recover), operation=name)


def _fail(message: str) -> int:
    print(f"streamlib: error: {message}", file=sys.stderr)
    return 1


def _run(
    args: argparse.Namespace, body: Callable[[Client, argparse.Namespace], Awaitable[int]]
) -> int:
    from streamlib.client import Client

    async def go() -> int:
        if str(args.metadata).startswith("streamlib://"):
            raise ValueError(
                "auto-recovery needs direct mode: --metadata must name the metadata store "
                "(zk://, sqlite://), not the stream service's brokers"
            )
        client = await Client.connect(args.metadata, session_timeout_s=args.session_timeout)
        try:
            return await body(client, args)
        finally:
            await client.close()

    try:
        return asyncio.run(go())
    except (StreamlibError, MetadataError, ValueError, OSError) as exc:
        return _fail(f"{type(exc).__name__}: {exc}")


async def _admin_autorecovery(client: Client, args: argparse.Namespace) -> int:
    from streamlib.autorecovery import admin

    if args.action in ("enable", "disable"):
        await admin.set_enabled(client, args.action == "enable")
        print(f"auto-recovery {args.action}d")
    elif args.action == "audit-now":
        found = await admin.audit_now(client)
        print(f"marked {len(found)} ledgers under-replicated")
        for ledger_id, bookies in sorted(found.items()):
            print(f"  ledger {ledger_id}: missing on {', '.join(bookies)}")
    else:
        st = await admin.status(client)
        if args.json:
            print(json.dumps(st.__dict__))
        else:
            print(f"auto-recovery: {'enabled' if st.enabled else 'DISABLED'}")
            print(f"auditor: {st.auditor or 'none elected'}")
            print(f"under-replicated ledgers: {len(st.under_replicated)}")
            for mark in st.under_replicated:
                locked = " (being repaired)" if mark["locked"] else ""
                print(f"  ledger {mark['ledger_id']}: {mark['missing_bookies']}{locked}")
    return 0


async def _admin_recover(client: Client, args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from streamlib.autorecovery import admin

    operation = admin.decommission if args.operation == "decommission" else admin.recover
    with Progress(transient=False) as bar:
        task = bar.add_task(f"{args.operation} {args.bookie}", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, 1))

        count = await operation(
            client,
            args.bookie,
            grace_period_s=args.grace_period,
            timeout_s=args.timeout,
            progress=progress,
        )
    print(f"{args.bookie}: {count} ledgers re-replicated; no ledger references it")
    if args.operation == "decommission":
        print(
            f"{args.bookie}: cookie deleted; started with empty directories, it joins "
            f"again as a new bookie"
        )
    return 0


def _run_daemon(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(_daemon(args))
    except (StreamlibError, MetadataError, ValueError, OSError) as exc:
        return _fail(f"{type(exc).__name__}: {exc}")


async def _daemon(args: argparse.Namespace) -> int:
    from streamlib.autorecovery.auditor import AuditorConfig
    from streamlib.autorecovery.daemon import AutoRecoveryDaemon
    from streamlib.autorecovery.replicator import WorkerConfig
    from streamlib.client import Client

    for name in ("lost_bookie_delay", "grace_period", "check_interval", "retention_interval",
                 "compaction_interval"):  # fmt: skip
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    identifier = args.id or f"{socket.gethostname()}:{os.getpid()}"
    client = await Client.connect(args.metadata, session_timeout_s=args.session_timeout)
    from streamlib.daemons import stop_event

    stop = stop_event(args.exit_with_stdin)
    daemon = AutoRecoveryDaemon(
        client,
        identifier,
        AuditorConfig(
            args.lost_bookie_delay,
            args.check_interval,
            retention_interval_s=args.retention_interval,
            compaction_interval_s=args.compaction_interval,
        ),
        WorkerConfig(grace_period_s=args.grace_period),
    )
    print(f"autorecovery {identifier} running", flush=True)
    try:
        await daemon.run(stop)
    finally:
        await client.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The daemon and admin commands without the rest of the streamlib command line."""
    parser = argparse.ArgumentParser(prog="streamlib")
    commands = parser.add_subparsers(dest="command", required=True)
    admin = commands.add_parser("admin", help="administration")
    admin_commands = admin.add_subparsers(dest="command_name", required=True)
    add_parsers(commands, admin_commands)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
