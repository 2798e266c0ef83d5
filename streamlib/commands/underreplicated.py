"""`streamlib admin under-replicated list`: the ledgers the auditor marked as missing
copies on lost bookies, and whether a replication worker is repairing them."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from metadata.services.underreplication import UnderReplicationManager
from streamlib.commands.common import (
    Subparsers,
    add_common,
    ms_to_text,
    print_json,
    print_table,
    run_with_client,
)

if TYPE_CHECKING:
    from streamlib.client import Client


def add_parsers(admin_commands: Subparsers) -> None:
    group = admin_commands.add_parser("under-replicated", help="ledgers awaiting re-replication")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every ledger marked under-replicated")
    add_common(listing)
    listing.set_defaults(run=run_with_client(_list, direct_only=True))


async def _list(client: Client, args: argparse.Namespace) -> int:
    manager = UnderReplicationManager(client.store)
    records: list[dict[str, Any]] = []
    for mark in sorted(await manager.list(), key=lambda m: m.ledger_id):
        records.append(
            {
                "ledger_id": mark.ledger_id,
                "missing_bookies": list(mark.missing_bookies),
                "marked_ms": mark.marked_ms,
                "being_repaired": await manager.is_locked(mark.ledger_id),
            }
        )
    if args.json:
        print_json(records)
        return 0
    if not records:
        print("no ledger is under-replicated")
        return 0
    print_table(
        ["ledger", "missing on", "marked", "being repaired"],
        [
            (
                r["ledger_id"],
                " ".join(r["missing_bookies"]),
                ms_to_text(r["marked_ms"]),
                "yes" if r["being_repaired"] else "no",
            )
            for r in records
        ],
        title=f"{len(records)} under-replicated ledgers",
    )
    return 0
