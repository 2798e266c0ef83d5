"""`streamlib admin streams list | create | defaults | show NAME | delete NAME | trim NAME |
compact NAME | set-policies NAME`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from metadata.schemas import StreamMode
from streamlib.commands.common import (
    Subparsers,
    add_common,
    ms_to_text,
    non_negative_int,
    print_fields,
    print_json,
    print_table,
    progress,
    run_with_client,
    size_to_text,
)
from streamlib.commands.cursors import backlog_text
from streamlib.protocol.errors import NoSuchStreamError
from streamlib.stream.admin import partition_name
from streamlib.stream.positions import MessageId, describe

if TYPE_CHECKING:
    from streamlib.client import Client


def add_parsers(admin_commands: Subparsers) -> None:
    group = admin_commands.add_parser(
        "streams", help="list, create, show, delete, trim or compact streams"
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every stream, with its size and subscriptions")
    add_common(listing)
    listing.set_defaults(run=run_with_client(_list))
    create = actions.add_parser(
        "create", help="create a stream (what is not given: the cluster's defaults)"
    )
    create.add_argument("stream", metavar="NAME")
    _policy_arguments(create)
    create.add_argument("--mode", choices=["managed", "unbounded"], default="managed")
    create.add_argument(
        "--partitions", type=non_negative_int, default=0, metavar="N",
        help="N partition streams NAME-partition-0..N-1 behind NAME (0: not partitioned)",
    )  # fmt: skip
    _compaction_threshold_argument(create)
    add_common(create)
    create.set_defaults(run=run_with_client(_create))
    defaults = actions.add_parser(
        "defaults", help="show, or with options set, the cluster's defaults for new streams"
    )
    _policy_arguments(defaults)
    add_common(defaults)
    defaults.set_defaults(run=run_with_client(_defaults))
    policies = actions.add_parser(
        "set-policies", help="change a stream's retention or compaction threshold"
    )
    policies.add_argument("stream", metavar="NAME")
    for flag, what in (
        ("--retention-ms", "keep consumed ledgers N ms (0: no time limit)"),
        ("--retention-bytes", "keep at most N bytes of consumed ledgers (0: no limit)"),
    ):
        policies.add_argument(flag, type=non_negative_int, metavar="N", help=what)
    _retention_compacted_argument(policies)
    _compaction_threshold_argument(policies)
    add_common(policies)
    policies.set_defaults(run=run_with_client(_set_policies))
    for name, text, body in (
        ("show", "a stream's policies, ledgers and subscriptions", _show),
        ("delete", "delete a stream, its cursors and its ledgers", _delete),
        ("trim", "apply the stream's retention now (delete consumed, expired ledgers)", _trim),
        ("compact", "write the stream's compacted view now (the latest message per key)", _compact),
    ):
        p = actions.add_parser(name, help=text)
        p.add_argument("stream", metavar="NAME")
        add_common(p)
        p.set_defaults(run=run_with_client(body))


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, what in (
        ("--ensemble", "bookies per ledger fragment (E)"),
        ("--write-quorum", "copies of each entry (Qw)"),
        ("--ack-quorum", "acknowledgements before an entry is confirmed (Qa)"),
        ("--rollover-entries", "roll to a new ledger after N entries (0: no limit)"),
        ("--rollover-bytes", "... after N bytes"),
        ("--rollover-age-ms", "... after N ms"),
        ("--retention-ms", "keep consumed ledgers N ms (0: no time limit)"),
        ("--retention-bytes", "keep at most N bytes of consumed ledgers (0: no limit)"),
    ):
        parser.add_argument(flag, type=non_negative_int, metavar="N", help=what)
    _retention_compacted_argument(parser)


def _retention_compacted_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retention-compacted", action=argparse.BooleanOptionalAction, default=None,
        help="delete what the compaction horizon has passed, whatever its age (a changelog's "
        "retention: its keys live on in the compacted view)",
    )  # fmt: skip


def _compaction_threshold_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compaction-threshold-bytes", type=non_negative_int, metavar="N",
        help="the auditor compacts the stream when its rolled ledgers past the compaction "
        "horizon hold more than N bytes (0: only `compact` does)",
    )  # fmt: skip


def _policies(args: argparse.Namespace) -> dict[str, Any]:
    """The create / set_defaults keyword arguments the options give (only those given)."""
    given: dict[str, Any] = {}
    for key, flag in (("ensemble", "ensemble"), ("write_quorum", "write_quorum"),
                      ("ack_quorum", "ack_quorum")):  # fmt: skip
        if getattr(args, flag, None) is not None:
            given[key] = getattr(args, flag)
    roll = {k: getattr(args, f"rollover_{a}", None) for k, a in
            (("max_entries", "entries"), ("max_bytes", "bytes"), ("max_age_ms", "age_ms"))}  # fmt: skip
    if any(v is not None for v in roll.values()):
        given["rollover"] = {k: v or 0 for k, v in roll.items()}
    keep = {"time_ms": args.retention_ms, "size_bytes": args.retention_bytes}
    if any(v is not None for v in keep.values()) or args.retention_compacted is not None:
        given["retention"] = {k: v or 0 for k, v in keep.items()}
        given["retention"]["compacted"] = bool(args.retention_compacted)
    if getattr(args, "compaction_threshold_bytes", None) is not None:
        given["compaction_threshold_bytes"] = args.compaction_threshold_bytes
    return given


def _config_record(md: Any) -> dict[str, Any]:
    config = md.ledger_config
    return {
        "ensemble": config.ensemble_size,
        "write_quorum": config.write_quorum,
        "ack_quorum": config.ack_quorum,
        "rollover": {
            "max_entries": md.rollover.max_entries,
            "max_bytes": md.rollover.max_bytes,
            "max_age_ms": md.rollover.max_age_ms,
        },
        "retention": {
            "time_ms": md.retention.time_ms,
            "size_bytes": md.retention.size_bytes,
            "compacted": md.retention.compacted,
        },
        "compaction_threshold_bytes": md.compaction_threshold_bytes,
    }


async def _create(client: Client, args: argparse.Namespace) -> int:
    md = await client.streams.create(
        args.stream, mode=args.mode, partitions=args.partitions, **_policies(args)
    )
    record = {"name": md.name, "mode": args.mode, "partitions": args.partitions,
              **_config_record(md)}  # fmt: skip
    if args.json:
        print_json(record)
    else:
        parts = f" in {args.partitions} partitions" if args.partitions else ""
        print(
            f"created stream {md.name!r}{parts}: ensemble {record['ensemble']}, write quorum "
            f"{record['write_quorum']}, ack quorum {record['ack_quorum']}"
        )
    return 0


async def _defaults(client: Client, args: argparse.Namespace) -> int:
    given = _policies(args)
    md = await (client.streams.set_defaults(**given) if given else client.streams.defaults())
    record = _config_record(md)
    if args.json:
        print_json(record)
        return 0
    print_fields(policy_fields(record))
    return 0


def policy_fields(config: dict[str, Any]) -> list[tuple[str, str]]:
    """A stream's (or the defaults') quorums, rollover and retention, as printed."""
    roll, keep = config["rollover"], config["retention"]
    return [
        (
            "quorums",
            f"ensemble {config['ensemble']}, write quorum {config['write_quorum']}, "
            f"ack quorum {config['ack_quorum']}",
        ),
        (
            "rollover",
            f"entries {_limit(roll['max_entries'])}, bytes {_limit(roll['max_bytes'])}, "
            f"age {_limit(roll['max_age_ms'], ' ms')}",
        ),
        (
            "retention",
            f"time {_limit(keep['time_ms'], ' ms')}, size {_limit(keep['size_bytes'], ' B')}"
            + (", compacted" if keep.get("compacted") else ""),
        ),
        (
            "compaction threshold",
            _limit(config.get("compaction_threshold_bytes", 0), " B").replace(
                "unlimited", "none (only when asked)"
            ),
        ),
    ]


async def stream_record(client: Client, name: str) -> dict[str, Any]:
    md, _ = await client.streams.read(name)
    stats = await client.streams.stats(name)
    stats["config"] = {**_config_record(md), "created_ms": md.created_time_ms}
    view = md.compaction if md.HasField("compaction") else None
    stats["compaction"] = None if view is None else {
        "ledger_id": view.ledger_id,
        "horizon": describe(MessageId(view.horizon.ledger_id, view.horizon.entry_id,
                                      view.horizon.batch_index)),
        "keys": view.keys, "entries": view.entries, "size_bytes": view.size_bytes,
        "compacted_ms": view.compacted_time_ms,
    }  # fmt: skip
    return stats


async def _list(client: Client, args: argparse.Namespace) -> int:
    records = []
    for name in sorted(await client.streams.list()):
        try:
            # (A list shows no backlog: counting it would read every subscription's.)
            records.append(await client.streams.stats(name, count_messages=False))
        except NoSuchStreamError:
            continue  # deleted while we listed
    if args.json:
        print_json(records)
        return 0
    print_table(
        ["stream", "ledgers", "entries", "size", "subscriptions"],
        [
            (
                r["name"],
                len(r["ledgers"]),
                r["entries"],
                size_to_text(r["size_bytes"]),
                " ".join(sorted(r["subscriptions"])) or "-",
            )
            for r in records
        ],
        title=f"{len(records)} streams",
    )
    return 0


def _view_text(view: dict[str, Any] | None) -> str:
    if view is None:
        return "none"
    return (
        f"{view['keys']} keys up to {view['horizon']} in ledger {view['ledger_id']} "
        f"({size_to_text(view['size_bytes'])}, {ms_to_text(view['compacted_ms'])})"
    )


def _limit(value: int, unit: str = "") -> str:
    return f"{value}{unit}" if value else "unlimited"


async def _show(client: Client, args: argparse.Namespace) -> int:
    record = await stream_record(client, args.stream)
    if args.json:
        print_json(record)
        return 0
    config = record["config"]
    print_fields(
        [
            ("stream", record["name"]),
            ("created", ms_to_text(config["created_ms"])),
            *policy_fields(config),
            ("entries", record["entries"]),
            ("size", size_to_text(record["size_bytes"])),
            ("compacted view", _view_text(record["compaction"])),
        ]
    )
    print_table(
        ["ledger", "entries", "bytes", "created"],
        [
            (i["ledger_id"], i["entries"], i["size_bytes"], ms_to_text(i["created_time_ms"]))
            for i in record["ledgers"]
        ],
        title="ledgers",
    )
    print_table(
        ["subscription", "mark-delete", "backlog", "consumers"],
        [
            (sub, s["mark_delete"], backlog_text(s), ", ".join(s["consumers"]) or "-")
            for sub, s in sorted(record["subscriptions"].items())
        ],
        title="subscriptions",
    )
    return 0


async def _delete(client: Client, args: argparse.Namespace) -> int:
    md, _ = await client.streams.read(args.stream)
    with progress(f"deleting {args.stream}", None, enabled=not args.json):
        await client.streams.delete(args.stream)
    ledgers = [i.ledger_id for i in md.ledgers]
    if args.json:
        print_json({"deleted": args.stream, "ledgers": ledgers})
    else:
        print(f"deleted stream {args.stream!r} and its {len(ledgers)} ledgers")
    return 0


async def _trim(client: Client, args: argparse.Namespace) -> int:
    md, _ = await client.streams.read(args.stream)
    # An unbounded stream is one ledger: its retention drops fragments, not ledgers.
    unbounded = md.mode == StreamMode.UNBOUNDED
    trim = client.streams.trim_fragments if unbounded else client.streams.trim
    with progress(f"trimming {args.stream}", None, enabled=not args.json):
        gone = await trim(args.stream)
    if args.json:
        key = "dropped_fragments_starting_at" if unbounded else "deleted_ledgers"
        print_json({"stream": args.stream, key: gone})
    elif not gone:
        what = "drop" if unbounded else "delete"
        print(f"trimmed {args.stream!r}: nothing to {what} under its retention policy")
    elif unbounded:
        print(f"trimmed {args.stream!r}: dropped {len(gone)} fragments of its ledger")
    else:
        print(f"trimmed {args.stream!r}: deleted ledgers {' '.join(map(str, gone))}")
    return 0


async def _compact(client: Client, args: argparse.Namespace) -> int:
    """The stream, or each partition of a partitioned one (as pulsar-admin does)."""
    count = await client.streams.partitions(args.stream)
    names = [partition_name(args.stream, i) for i in range(count)] if count else [args.stream]
    results = []
    for name in names:
        with progress(f"compacting {name}", None, enabled=not args.json):
            result = await client.streams.compact(name)
        results.append(result.as_dict())
        if args.json:
            continue
        if not result.compacted:
            print(f"compacted {name!r}: nothing new since the view up to {result.horizon}")
        else:
            print(
                f"compacted {name!r} up to {result.horizon}: {result.keys} keys from "
                f"{result.read_messages} messages, in ledger {result.ledger_id} "
                f"({result.entries} entries, {size_to_text(result.size_bytes)})"
            )
    if args.json:
        print_json(results if count else results[0])
    return 0


async def _set_policies(client: Client, args: argparse.Namespace) -> int:
    given = _policies(args)
    if "retention" in given:
        md, _ = await client.streams.read(args.stream)
        current = {"time_ms": md.retention.time_ms, "size_bytes": md.retention.size_bytes,
                   "compacted": md.retention.compacted}  # fmt: skip
        for key, value in (("time_ms", args.retention_ms), ("size_bytes", args.retention_bytes),
                           ("compacted", args.retention_compacted)):  # fmt: skip
            if value is not None:
                current[key] = value
        given["retention"] = current
    if not given:
        print("set-policies: give at least one policy (see --help)")
        return 2
    md = await client.streams.set_policies(args.stream, **given)
    record = _config_record(md)
    if args.json:
        print_json(record)
    else:
        print_fields(policy_fields(record))
    return 0
