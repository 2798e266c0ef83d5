"""`streamlib admin ledgers list | show ID | delete ID | recover ID`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from streamlib.commands.common import (
    CommandError,
    Subparsers,
    add_common,
    ms_to_text,
    print_fields,
    print_json,
    print_table,
    progress,
    run_with_client,
    secret_source,
)
from streamlib.protocol.errors import NoSuchLedgerError, NoSuchStreamError

if TYPE_CHECKING:
    from streamlib.client import Client
    from streamlib.protocol import LedgerMetadata


class LedgerInUseError(CommandError):
    """The ledger is still in a stream's ledger list."""


def add_parsers(admin_commands: Subparsers) -> None:
    group = admin_commands.add_parser("ledgers", help="list, show, delete or recover ledgers")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every ledger, with its state and size")
    add_common(listing)
    listing.set_defaults(run=run_with_client(_list, direct_only=True))
    for name, text, body in (
        ("show", "one ledger's metadata: state, quorums, fragments", _show),
        ("delete", "delete a ledger (refused while a stream lists it)", _delete),
        ("recover", "fence and recover an OPEN ledger, then close it", _recover),
    ):
        p = actions.add_parser(name, help=text)
        p.add_argument("ledger_id", type=int, metavar="ID")
        if name == "recover":
            p.add_argument(
                "--password",
                type=secret_source("--password"),
                metavar="file:PATH|env:NAME",
                help="the ledger's password (default: its stored secret, which needs the "
                "writers' metadata identity; ledgers made before key version 1: empty)",
            )
        if name == "delete":
            p.add_argument(
                "--force", action="store_true", help="delete even if a stream lists the ledger"
            )
        add_common(p)
        p.set_defaults(run=run_with_client(body, direct_only=True))


async def all_ledgers(client: Client) -> list[LedgerMetadata]:
    """Every ledger's metadata; ledgers deleted while we list them are left out."""
    found = []
    for ledger_id in sorted(await client.ledgers.list()):
        try:
            found.append(await client.ledgers.metadata(ledger_id))
        except NoSuchLedgerError:
            continue
    return found


def ledger_record(md: LedgerMetadata) -> dict[str, Any]:
    stream = md.custom_metadata.get("stream")
    return {
        "ledger_id": md.ledger_id,
        "state": md.state.name,
        "ensemble": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "term": md.term,
        "unbounded": md.unbounded,
        "stream": stream.decode("utf-8", "replace") if stream is not None else None,
        "created_ms": md.creation_time_ms,
        "fragments": [
            {"first_entry_id": f.first_entry_id, "ensemble": list(f.ensemble)} for f in md.fragments
        ],
    }


async def _list(client: Client, args: argparse.Namespace) -> int:
    records = [ledger_record(md) for md in await all_ledgers(client)]
    if args.json:
        print_json(records)
        return 0
    print_table(
        ["ledger", "state", "E/Qw/Qa", "last entry", "bytes", "stream", "bookies"],
        [
            (
                r["ledger_id"],
                r["state"],
                f"{r['ensemble']}/{r['write_quorum']}/{r['ack_quorum']}",
                r["last_entry_id"] if r["state"] == "CLOSED" else "-",
                r["length"] if r["state"] == "CLOSED" else "-",
                r["stream"] or "-",
                " ".join(r["fragments"][-1]["ensemble"]),
            )
            for r in records
        ],
        title=f"{len(records)} ledgers",
    )
    return 0


def _print_ledger(record: dict[str, Any]) -> None:
    closed = record["state"] == "CLOSED"
    print_fields(
        [
            ("ledger", record["ledger_id"]),
            ("state", record["state"]),
            ("ensemble", record["ensemble"]),
            ("write quorum", record["write_quorum"]),
            ("ack quorum", record["ack_quorum"]),
            ("last entry", record["last_entry_id"] if closed else "- (open)"),
            ("length", f"{record['length']} bytes" if closed else "- (open)"),
            ("term", f"{record['term']}{' (unbounded)' if record['unbounded'] else ''}"),
            ("stream", record["stream"] or "-"),
            ("created", ms_to_text(record["created_ms"])),
        ]
    )
    print_table(
        ["first entry", "ensemble"],
        [(f["first_entry_id"], " ".join(f["ensemble"])) for f in record["fragments"]],
        title="fragments",
    )


async def _show(client: Client, args: argparse.Namespace) -> int:
    record = ledger_record(await client.ledgers.metadata(args.ledger_id))
    if args.json:
        print_json(record)
    else:
        _print_ledger(record)
    return 0


async def _delete(client: Client, args: argparse.Namespace) -> int:
    md = await client.ledgers.metadata(args.ledger_id)
    stream = ledger_record(md)["stream"]
    if stream is not None and not args.force:
        try:
            listed = await client.streams.read(stream)
        except NoSuchStreamError:
            listed = None
        if listed is not None and args.ledger_id in {i.ledger_id for i in listed[0].ledgers}:
            raise LedgerInUseError(
                f"ledger {args.ledger_id} holds data of stream {stream!r}: use "
                f"`streamlib admin streams trim|delete`, or --force to lose that data"
            )
    await client.ledgers.delete(args.ledger_id)
    if args.json:
        print_json({"deleted": args.ledger_id})
    else:
        print(f"deleted ledger {args.ledger_id}")
    return 0


async def _recover(client: Client, args: argparse.Namespace) -> int:
    before = await client.ledgers.metadata(args.ledger_id)
    with progress(f"recovering ledger {args.ledger_id}", None, enabled=not args.json):
        password = None if args.password is None else args.password.encode("utf-8")
        handle = await client.ledgers.open(args.ledger_id, password)
        await handle.close()
    record = ledger_record(await client.ledgers.metadata(args.ledger_id))
    record["was"] = before.state.name
    if args.json:
        print_json(record)
    else:
        print(
            f"ledger {args.ledger_id}: {before.state.name} -> {record['state']}, "
            f"last entry {record['last_entry_id']}, {record['length']} bytes"
        )
    return 0
