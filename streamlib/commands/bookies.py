"""`streamlib admin bookies list | info ID`: the registered bookies."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from streamlib.commands.common import (
    NoSuchBookieError,
    Subparsers,
    add_common,
    ms_to_text,
    print_fields,
    print_json,
    print_table,
    run_with_client,
    size_to_text,
)
from streamlib.commands.ledgers import all_ledgers

if TYPE_CHECKING:
    from metadata.schemas import BookieInfo
    from streamlib.client import Client


def add_parsers(admin_commands: Subparsers) -> None:
    group = admin_commands.add_parser("bookies", help="list the bookies, or show one")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every registered bookie")
    add_common(listing)
    listing.set_defaults(run=run_with_client(_list, direct_only=True))
    info = actions.add_parser("info", help="one bookie, and the ledgers that use it")
    info.add_argument("bookie", metavar="ID", help="the bookie id")
    add_common(info)
    info.set_defaults(run=run_with_client(_info, direct_only=True))


def bookie_record(info: BookieInfo) -> dict[str, Any]:
    return {
        "id": info.bookie_id,
        "address": info.address,
        "rack": info.rack,
        "read_only": info.read_only,
        "free_bytes": info.free_bytes,
        "total_bytes": info.total_bytes,
        "metrics_address": info.metrics_address,
        "registered_ms": info.registered_ms,
    }


async def _list(client: Client, args: argparse.Namespace) -> int:
    records = [
        bookie_record(b) for b in sorted(await client.registry.list(), key=lambda b: b.bookie_id)
    ]
    if args.json:
        print_json(records)
        return 0
    print_table(
        ["id", "address", "mode", "free", "total", "registered"],
        [
            (
                r["id"],
                r["address"],
                "read-only" if r["read_only"] else "writable",
                size_to_text(r["free_bytes"]),
                size_to_text(r["total_bytes"]),
                ms_to_text(r["registered_ms"]),
            )
            for r in records
        ],
        title=f"{len(records)} bookies",
    )
    return 0


async def _info(client: Client, args: argparse.Namespace) -> int:
    info = await client.registry.get(args.bookie)
    if info is None:
        raise NoSuchBookieError(
            f"no bookie {args.bookie!r} is registered (see `streamlib admin bookies list`)"
        )
    record = bookie_record(info)
    # Which ledgers a bookie holds is in the ledgers' metadata, not in its registration.
    ledgers = [md.ledger_id for md in await all_ledgers(client) if args.bookie in md.bookies()]
    record["ledgers"] = ledgers
    if args.json:
        print_json(record)
        return 0
    print_fields(
        [
            ("id", record["id"]),
            ("address", record["address"]),
            ("rack", record["rack"] or "-"),
            ("mode", "read-only" if record["read_only"] else "writable"),
            ("disk", f"{size_to_text(info.free_bytes)} free of {size_to_text(info.total_bytes)}"),
            ("metrics", record["metrics_address"] or "-"),
            ("registered", ms_to_text(info.registered_ms)),
            ("ledgers", f"{len(ledgers)}: {' '.join(map(str, ledgers))}" if ledgers else "0"),
        ]
    )
    return 0
