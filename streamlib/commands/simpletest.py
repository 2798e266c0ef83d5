"""`streamlib admin simpletest [--entries N]`: a health check of the whole write and
read path — create a ledger, write N entries, read them back and compare, delete it."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from streamlib.commands.common import (
    CommandError,
    Subparsers,
    add_common,
    positive_int,
    print_json,
    progress,
    run_with_client,
)

if TYPE_CHECKING:
    from streamlib.client import Client

CHUNK = 100  # entries per pipelined append / read, and per progress-bar step


class SimpleTestFailedError(CommandError):
    """An entry read back differs from the one written."""


def add_parsers(admin_commands: Subparsers) -> None:
    p = admin_commands.add_parser(
        "simpletest", help="create a ledger, write and read back N entries, delete it"
    )
    p.add_argument("--entries", type=positive_int, default=100, metavar="N", help="default 100")
    p.add_argument("--ensemble", type=positive_int, default=3, help="default 3")
    p.add_argument("--write-quorum", type=positive_int, default=2, help="default 2")
    p.add_argument("--ack-quorum", type=positive_int, default=2, help="default 2")
    add_common(p)
    p.set_defaults(run=run_with_client(_simpletest, direct_only=True))


def _payload(i: int) -> bytes:
    return b"simpletest entry %08d" % i


async def _simpletest(client: Client, args: argparse.Namespace) -> int:
    start = time.perf_counter()
    writer = await client.ledgers.create(args.ensemble, args.write_quorum, args.ack_quorum)
    ledger_id = writer.ledger_id
    bookies = sorted(writer.metadata.bookies())
    try:
        with progress(f"writing ledger {ledger_id}", args.entries, enabled=not args.json) as step:
            for first in range(0, args.entries, CHUNK):
                last = min(first + CHUNK, args.entries)
                await writer.append_many([_payload(i) for i in range(first, last)])
                step(last - first)
        await writer.close()
        written_s = time.perf_counter() - start
        reader = await client.ledgers.open(ledger_id)
        try:
            with progress(
                f"reading ledger {ledger_id}", args.entries, enabled=not args.json
            ) as step:
                for first in range(0, args.entries, CHUNK):
                    last = min(first + CHUNK, args.entries)
                    got = await reader.read(first, last - 1)
                    for i, data in enumerate(got, start=first):
                        if data != _payload(i):
                            raise SimpleTestFailedError(
                                f"ledger {ledger_id} entry {i}: read {data[:40]!r}, "
                                f"wrote {_payload(i)!r}"
                            )
                    step(last - first)
        finally:
            await reader.close()
    finally:
        await client.ledgers.delete(ledger_id)
    elapsed_s = time.perf_counter() - start
    if args.json:
        print_json(
            {
                "ok": True,
                "ledger_id": ledger_id,
                "entries": args.entries,
                "bookies": bookies,
                "write_s": round(written_s, 3),
                "total_s": round(elapsed_s, 3),
            }
        )
    else:
        print(
            f"simpletest OK: wrote {args.entries} entries to ledger {ledger_id} on "
            f"{' '.join(bookies)}, read them back identical, deleted the ledger "
            f"({elapsed_s * 1000:.0f} ms)"
        )
    return 0
