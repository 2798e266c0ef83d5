"""`streamlib admin broker load | pin STREAM BROKER_ID | unpin STREAM | pins`: the
brokers' load reports (streamlib/broker/load.py) with the load the load manager weighs
(streamlib/protocol/load.py), and the streams pinned to a broker."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from metadata.services.broker_moves import LoadManagerElection
from metadata.services.broker_pins import BrokerPins
from metadata.services.brokers import BrokerRegistry
from streamlib.broker.load import broker_load
from streamlib.protocol.load import loads

COLUMNS = ("BROKER", "STREAMS", "MSGS_IN/S", "MSGS_OUT/S", "BYTES_IN/S", "BYTES_OUT/S",
           "CPU%", "LOAD", "AGE_S", "ADDRESS")  # fmt: skip


async def run(store: Any, registry: BrokerRegistry, args: argparse.Namespace) -> int:
    pins = BrokerPins(store)
    if args.action == "pin":
        await pins.pin(args.stream, args.broker_id)
        live = await registry.registered(args.broker_id) is not None
        note = "" if live else " (not live now: lookups assign it elsewhere until it is)"
        print(f"{args.stream}: pinned to {args.broker_id}{note}")
    elif args.action == "unpin":
        was = await pins.unpin(args.stream)
        print(f"{args.stream}: {'unpinned' if was else 'was not pinned'}")
    elif args.action == "pins":
        for stream, broker_id in sorted((await pins.pins()).items()):
            print(f"{stream} {broker_id}")
    else:
        leader = await LoadManagerElection(store, "admin").leader()
        print_load(await registry.live(), leader, args.json)
    return 0


def print_load(live: list[Any], leader: str | None, as_json: bool) -> None:
    load = loads(map(broker_load, live))
    now = time.time()
    if as_json:
        for info in live:
            print(json.dumps({
                "broker_id": info.broker_id, "address": info.address, "streams": info.owned,
                "msgs_in_rate": info.msgs_in_rate, "msgs_out_rate": info.msgs_out_rate,
                "bytes_in_rate": info.bytes_in_rate, "bytes_out_rate": info.bytes_out_rate,
                "cpu_percent": info.cpu_percent, "load": round(load[info.broker_id], 4),
                "reported": info.reported, "leader": info.broker_id == leader,
                "busiest": [list(s) for s in info.stream_rates[:10]],
            }))  # fmt: skip
        return
    rows = [COLUMNS]
    for info in live:
        age = f"{now - info.reported:.1f}" if info.reported else "-"
        mark = "*" if info.broker_id == leader else ""
        rows.append((
            info.broker_id + mark, str(info.owned), f"{info.msgs_in_rate:.1f}",
            f"{info.msgs_out_rate:.1f}", f"{info.bytes_in_rate:.0f}",
            f"{info.bytes_out_rate:.0f}", f"{info.cpu_percent:.1f}",
            f"{load[info.broker_id]:.3f}", age, info.address,
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if leader:
        print("(* leads the load manager; LOAD 1.0: an average broker of a busy cluster)")
