"""`streamlib admin cursors list STREAM | reset STREAM SUB POSITION`: subscriptions'
durable cursors (their mark-delete positions)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from streamlib.commands.common import (
    Subparsers,
    add_common,
    print_json,
    print_table,
    run_with_client,
)

if TYPE_CHECKING:
    from streamlib.client import Client


def add_parsers(admin_commands: Subparsers) -> None:
    group = admin_commands.add_parser("cursors", help="list or reset subscriptions' cursors")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="a stream's subscriptions and their positions")
    listing.add_argument("stream", metavar="STREAM")
    add_common(listing)
    listing.set_defaults(run=run_with_client(_list))
    reset = actions.add_parser(
        "reset", help="move a subscription: the message AT POSITION is delivered next"
    )
    reset.add_argument("stream", metavar="STREAM")
    reset.add_argument("subscription", metavar="SUB")
    reset.add_argument(
        "position", metavar="POSITION", help="earliest, latest or ledger:entry[:index]"
    )
    add_common(reset)
    reset.set_defaults(run=run_with_client(_reset))


async def _list(client: Client, args: argparse.Namespace) -> int:
    stats = await client.streams.stats(args.stream)
    subs = stats["subscriptions"]
    if args.json:
        print_json(subs)
        return 0
    print_table(
        ["subscription", "mark-delete", "backlog entries"],
        [(sub, s["mark_delete"], s["backlog_entries"]) for sub, s in sorted(subs.items())],
        title=f"{len(subs)} subscriptions on {args.stream}",
    )
    return 0


async def _reset(client: Client, args: argparse.Namespace) -> int:
    await client.streams.reset_cursor(args.stream, args.subscription, args.position)
    mark = (await client.streams.cursors(args.stream))[args.subscription]
    if args.json:
        print_json(
            {"stream": args.stream, "subscription": args.subscription, "mark_delete": str(mark)}
        )
    else:
        print(
            f"reset {args.stream!r} subscription {args.subscription!r} to {args.position} "
            f"(mark-delete now {mark})"
        )
    return 0
