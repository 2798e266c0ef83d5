"""`streamlib admin cursors list STREAM | reset STREAM SUB POSITION | skip STREAM SUB N |
clear-backlog STREAM SUB | peek STREAM SUB [-n N] | unsubscribe STREAM SUB`: subscriptions'
durable cursors (their mark-delete positions) and what they have left."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from streamlib.commands.common import (
    Subparsers,
    add_common,
    positive_int,
    print_json,
    print_table,
    run_with_client,
)
from streamlib.commands.pubsub import print_message
from streamlib.stream.admin import BACKLOG_COUNT_LIMIT
from streamlib.stream.positions import describe

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
    skip = actions.add_parser("skip", help="acknowledge a subscription's next N messages")
    skip.add_argument("stream", metavar="STREAM")
    skip.add_argument("subscription", metavar="SUB")
    skip.add_argument("count", metavar="N", type=positive_int)
    add_common(skip)
    skip.set_defaults(run=run_with_client(_skip))
    clear = actions.add_parser("clear-backlog", help="acknowledge everything: move to latest")
    clear.add_argument("stream", metavar="STREAM")
    clear.add_argument("subscription", metavar="SUB")
    add_common(clear)
    clear.set_defaults(run=run_with_client(_clear))
    peek = actions.add_parser("peek", help="show a subscription's next messages (no ack)")
    peek.add_argument("stream", metavar="STREAM")
    peek.add_argument("subscription", metavar="SUB")
    peek.add_argument("-n", "--count", type=positive_int, default=1, metavar="N")
    add_common(peek, json_help="print each message as a JSON line")
    peek.set_defaults(run=run_with_client(_peek, direct_only=True))
    unsubscribe = actions.add_parser(
        "unsubscribe", help="delete a subscription (refused while a consumer is connected)"
    )
    unsubscribe.add_argument("stream", metavar="STREAM")
    unsubscribe.add_argument("subscription", metavar="SUB")
    add_common(unsubscribe)
    unsubscribe.set_defaults(run=run_with_client(_unsubscribe))


async def _list(client: Client, args: argparse.Namespace) -> int:
    stats = await client.streams.stats(args.stream)
    subs = stats["subscriptions"]
    if args.json:
        print_json(subs)
        return 0
    print_table(
        ["subscription", "mark-delete", "backlog", "consumers"],
        [
            (sub, s["mark_delete"], backlog_text(s), ", ".join(s["consumers"]) or "-")
            for sub, s in sorted(subs.items())
        ],
        title=f"{len(subs)} subscriptions on {args.stream}",
    )
    return 0


def backlog_text(sub: dict[str, Any]) -> str:
    messages = sub["backlog_messages"]
    counted = f"{BACKLOG_COUNT_LIMIT}+" if messages is None else str(messages)
    return f"{counted} messages ({sub['backlog_entries']} entries)"


async def _skip(client: Client, args: argparse.Namespace) -> int:
    mark = await client.streams.skip(args.stream, args.subscription, args.count)
    return _moved(args, mark, f"skipped {args.count} messages")


async def _clear(client: Client, args: argparse.Namespace) -> int:
    await client.streams.reset_cursor(args.stream, args.subscription, "latest")
    mark = (await client.streams.cursors(args.stream))[args.subscription]
    return _moved(args, mark, "cleared the backlog")


def _moved(args: argparse.Namespace, mark: Any, what: str) -> int:
    if args.json:
        print_json(
            {
                "stream": args.stream,
                "subscription": args.subscription,
                "mark_delete": describe(mark),
            }
        )
    else:
        print(
            f"{args.stream!r} subscription {args.subscription!r}: {what} "
            f"(mark-delete now {describe(mark)})"
        )
    return 0


async def _peek(client: Client, args: argparse.Namespace) -> int:
    for message in await client.streams.peek(args.stream, args.subscription, args.count):
        print_message(message, args.json)
    return 0


async def _unsubscribe(client: Client, args: argparse.Namespace) -> int:
    await client.streams.unsubscribe(args.stream, args.subscription)
    print(f"deleted {args.stream!r} subscription {args.subscription!r}")
    return 0


async def _reset(client: Client, args: argparse.Namespace) -> int:
    await client.streams.reset_cursor(args.stream, args.subscription, args.position)
    mark = (await client.streams.cursors(args.stream))[args.subscription]
    return _moved(args, mark, f"reset to {args.position}")
