"""`streamlib produce | consume | read`: the everyday commands, like pulsar-client's.

    streamlib produce STREAM (-m MSG ... | --file F) [-k KEY] [-p k=v ...]
    streamlib consume STREAM -s SUB [-n N] [--initial-position earliest|latest] [--timeout S]
    streamlib read STREAM [--from earliest|latest|ID] [-n N] [--timeout S]

stdout carries the data (message ids, or one line per message); the closing summary
goes to stderr so scripts can pipe stdout. With --json every message is one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamlib.commands.common import (
    CommandError,
    Subparsers,
    add_common,
    key_value,
    non_negative_float,
    print_json,
    run_with_client,
    show_payload,
)

if TYPE_CHECKING:
    from streamlib.client import Client
    from streamlib.stream.reader import Message


def add_parsers(commands: Subparsers) -> None:
    produce = commands.add_parser("produce", help="publish messages to a stream")
    produce.add_argument("stream", metavar="STREAM")
    source = produce.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "-m", "--message", action="append", metavar="MSG", help="a message (repeatable)"
    )
    source.add_argument(
        "--file",
        type=Path,
        metavar="F",
        help="one message per line ('-' = stdin; empty lines skipped)",
    )
    produce.add_argument("-k", "--key", help="the messages' key")
    produce.add_argument(
        "-z", "--compression", choices=["none", "lz4", "zlib", "zstd", "snappy"], default="none",
        help="compress the entries (readers must know batch format 3)",
    )  # fmt: skip
    produce.add_argument(
        "-p", "--property", action="append", type=key_value, default=[], metavar="K=V",
        help="a message property (repeatable)",
    )  # fmt: skip
    add_common(produce, json_help="print each message id as a JSON line")
    produce.set_defaults(run=run_with_client(_produce))

    consume = commands.add_parser(
        "consume", help="receive and acknowledge messages on a durable subscription"
    )
    consume.add_argument("stream", metavar="STREAM")
    consume.add_argument("-s", "--subscription", required=True, metavar="SUB")
    consume.add_argument(
        "-n", "--count", type=int, default=1, metavar="N",
        help="stop after N messages (default 1; 0 = until --timeout or Ctrl-C)",
    )  # fmt: skip
    consume.add_argument(
        "--initial-position", choices=["earliest", "latest"], default="latest",
        help="where a NEW subscription starts (default latest); an existing one resumes",
    )  # fmt: skip
    consume.add_argument(
        "--timeout", type=non_negative_float, metavar="S",
        help="stop waiting when no message comes for S seconds (default: wait forever)",
    )  # fmt: skip
    consume.add_argument(
        "-t", "--subscription-type", choices=["exclusive", "failover"], default="exclusive",
        help="exclusive (default: refused while another consumer holds the subscription) "
        "or failover (wait in line as a standby)",
    )  # fmt: skip
    add_common(consume, json_help="print each message as a JSON line")
    consume.set_defaults(run=run_with_client(_consume))

    read = commands.add_parser("read", help="read a stream without a subscription")
    read.add_argument("stream", metavar="STREAM")
    read.add_argument(
        "--from", dest="start", default="earliest", metavar="earliest|latest|ID",
        help="read the messages AFTER this position (default earliest: from the first)",
    )  # fmt: skip
    read.add_argument(
        "-n", "--count", type=int, default=0, metavar="N",
        help="stop after N messages (default 0: every message published so far)",
    )  # fmt: skip
    read.add_argument(
        "--timeout", type=non_negative_float, default=10.0, metavar="S",
        help="with -n: give up when no message comes for S seconds (default 10)",
    )  # fmt: skip
    add_common(read, json_help="print each message as a JSON line")
    read.set_defaults(run=run_with_client(_read))


def _messages_from(args: argparse.Namespace) -> list[bytes]:
    if args.message is not None:
        return [m.encode("utf-8") for m in args.message]
    if str(args.file) == "-":
        raw = sys.stdin.buffer.read()
    else:
        try:
            raw = args.file.read_bytes()
        except OSError as error:
            raise CommandError(f"cannot read {args.file}: {error.strerror}") from None
    return [line for line in raw.splitlines() if line]


async def _produce(client: Client, args: argparse.Namespace) -> int:
    payloads = _messages_from(args)
    producer = await client.create_producer(args.stream, compression_type=args.compression)
    try:
        properties = dict(args.property) or None
        futures = [
            await producer.send_async(data, key=args.key, properties=properties)
            for data in payloads
        ]
        ids = await asyncio.gather(*futures)
        await producer.flush()
    finally:
        await producer.close()
    for message_id in ids:
        if args.json:
            print_json({"id": str(message_id)})
        else:
            print(message_id)
    print(f"produced {len(ids)} messages to {args.stream!r}", file=sys.stderr)
    return 0


def message_record(message: Message) -> dict[str, Any]:
    return {
        "id": str(message.message_id),
        "data": show_payload(message.data),
        "key": message.key,
        "properties": message.properties,
        "publish_time_ms": message.publish_time_ms,
        "event_time_ms": message.event_time_ms,
        "redelivery_count": message.redelivery_count,
    }


def print_message(message: Message, as_json: bool) -> None:
    if as_json:
        print_json(message_record(message))
        return
    extras = []
    if message.key is not None:
        extras.append(f"key={message.key}")
    extras.extend(f"{k}={v}" for k, v in sorted(message.properties.items()))
    tags = f"  [{' '.join(extras)}]" if extras else ""
    print(f"{message.message_id}  {show_payload(message.data)}{tags}", flush=True)


def _check_count(count: int) -> None:
    if count < 0:
        raise CommandError(f"-n must be >= 0, got {count}")


async def _consume(client: Client, args: argparse.Namespace) -> int:
    _check_count(args.count)
    consumer = await client.subscribe(
        args.stream,
        args.subscription,
        initial_position=args.initial_position,
        consumer_type=args.subscription_type,
    )
    received = 0
    try:
        while args.count == 0 or received < args.count:
            try:
                message = await consumer.receive(timeout=args.timeout)
            except TimeoutError:
                if args.count:
                    raise TimeoutError(
                        f"received {received} of {args.count} messages; none came for "
                        f"{args.timeout:g} s"
                    ) from None
                break
            print_message(message, args.json)
            consumer.acknowledge(message)
            received += 1
        await consumer.persist()
    finally:
        await consumer.close()
    print(
        f"consumed and acknowledged {received} messages on {args.stream!r} "
        f"subscription {args.subscription!r}",
        file=sys.stderr,
    )
    return 0


async def _read(client: Client, args: argparse.Namespace) -> int:
    _check_count(args.count)
    reader = await client.create_reader(args.stream, args.start)
    read = 0
    try:
        if args.count == 0:
            while await reader.has_message_available():
                print_message(await reader.read_next(timeout=args.timeout), args.json)
                read += 1
        while read < args.count:
            try:
                message = await reader.read_next(timeout=args.timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"read {read} of {args.count} messages; none came for {args.timeout:g} s"
                ) from None
            print_message(message, args.json)
            read += 1
    finally:
        await reader.close()
    print(f"read {read} messages from {args.stream!r}", file=sys.stderr)
    return 0
