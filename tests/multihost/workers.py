"""Client processes for the multi-host tests, each run inside a host namespace.

    python -m tests.multihost.workers producer --metadata URI --stream S
    python -m tests.multihost.workers consume --metadata URI --stream S --subscription SUB -n N
    python -m tests.multihost.workers read --metadata URI --stream S
    python -m tests.multihost.workers observer --metadata URI

Every line on stdout is one JSON event with "event" and "t" (time.monotonic(): one
clock for every process of the machine, so the test compares times across hosts).
The producer and the observer take JSON requests on stdin, {"op": ..., "rid": N, ...},
and answer each with an event carrying the same rid ("failed" with the error if it
raised); they stop when stdin closes. They use the public client API only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import streamlib
from metadata.errors import MetadataError
from metadata.services.ledgers import LedgerMetadataManager
from metadata.services.underreplication import UnderReplicationManager
from streamlib.client import Client
from streamlib.errors import StreamlibError
from streamlib.ledger.bookie_client import BookieClientConfig

# A bookie that stops answering is given up on after 3 s (the default 10 s would make
# every partition cost 10 s of stalled writes).
FAST = BookieClientConfig(add_timeout_s=3.0, read_timeout_s=3.0)
POLL_S = 0.05
CLOSE_TIMEOUT_S = 15.0  # how often the observer looks at the bookie registry


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


def error_fields(e: BaseException) -> dict[str, str]:
    return {"error": type(e).__name__, "message": str(e)[:500]}


async def connect(uri: str) -> Client:
    return await Client.connect(uri, bookie_config=FAST)


async def serve_requests(handlers: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]]) -> None:
    """Answer stdin's requests, each in its own task (a long send does not hold up a
    question about the ensemble), until stdin closes or a handler returns "stop"."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    stop = asyncio.Event()

    async def answer(request: dict[str, Any]) -> None:
        rid = request.get("rid")
        try:
            result = await handlers[request["op"]](request)
        except (StreamlibError, MetadataError, KeyError, TimeoutError) as e:
            emit("failed", rid=rid, op=request.get("op"), **error_fields(e))
            return
        if result == "stop":
            stop.set()

    async def read_stdin() -> None:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            task = loop.create_task(answer(json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        stop.set()

    reader = loop.create_task(read_stdin())
    await stop.wait()
    reader.cancel()
    for task in list(tasks):
        task.cancel()


async def ledgers_of(client: Client, stream: str) -> list[dict[str, Any]]:
    md, _ = await client.streams.read(stream)
    manager = LedgerMetadataManager(client.store)
    found = []
    for info in md.ledgers:
        ledger, _ = await manager.read(info.ledger_id)
        found.append(
            {
                "ledger": info.ledger_id,
                "state": int(ledger.state),
                "last_entry": ledger.last_entry_id,
                "fragments": [
                    {"first": f.first_entry_id, "bookies": list(f.bookies)}
                    for f in ledger.fragments
                ],
            }
        )
    return found


# -- producer ---------------------------------------------------------------------------


async def producer_main(args: argparse.Namespace) -> int:
    client = await connect(args.metadata)
    started = time.monotonic()
    try:
        producer = await client.create_producer(args.stream)
    except (StreamlibError, MetadataError) as e:
        emit("takeover_failed", **error_fields(e))
        await client.close()
        return 1
    emit("ready", takeover_s=time.monotonic() - started, started=started)
    sending = asyncio.Lock()  # sends of two requests never interleave

    async def send(request: dict[str, Any]) -> None:
        """count messages "PREFIX-i", one at a time (each waits for its ack), every
        interval_s; each outcome is an "ack" or an "error" event."""
        async with sending:
            acked = failed = 0
            for i in range(request["count"]):
                data = f"{request['prefix']}-{i}"
                try:
                    message_id = await producer.send(data.encode())
                except (StreamlibError, MetadataError) as e:
                    failed += 1
                    emit("error", data=data, **error_fields(e))
                else:
                    acked += 1
                    emit("ack", data=data, id=str(message_id))
                if request.get("interval_s"):
                    await asyncio.sleep(request["interval_s"])  # pacing, not synchronisation
            emit("sent", rid=request["rid"], acked=acked, failed=failed)

    async def ensemble(request: dict[str, Any]) -> None:
        current = (await ledgers_of(client, args.stream))[-1]
        emit("ensemble", rid=request["rid"], **current)

    async def close(request: dict[str, Any]) -> str:
        await producer.close()
        emit("closed", rid=request["rid"])
        return "stop"

    try:
        await serve_requests({"send": send, "ensemble": ensemble, "close": close})
    finally:
        await client.close()
    return 0


# -- consumer and reader ----------------------------------------------------------------


async def closed_within(thing: Any, timeout_s: float) -> None:
    """Close a consumer or reader; if that hangs, say so (with every task's stack on
    stderr, for the post-mortem) instead of hanging the test."""
    closing = asyncio.ensure_future(thing.close())
    done, _ = await asyncio.wait({closing}, timeout=timeout_s)
    if closing in done:
        closing.result()
        return
    emit("close_hung", seconds=timeout_s)
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()
    os._exit(3)  # the hung task might hang the loop's shutdown too


async def consume_main(args: argparse.Namespace) -> int:
    """Receive and acknowledge n messages (or until none comes for --timeout s)."""
    async with await connect(args.metadata) as client:
        consumer = await client.subscribe(args.stream, args.subscription, "earliest")
        received = 0
        try:
            while received < args.n:
                message = await consumer.receive(timeout=args.timeout)
                emit("message", id=str(message.message_id), data=message.data.decode())
                consumer.acknowledge(message)
                received += 1
        except TimeoutError:
            pass
        await closed_within(consumer, CLOSE_TIMEOUT_S)
        emit("end", received=received)
    return 0


async def read_main(args: argparse.Namespace) -> int:
    """Read everything confirmed in the stream, from the start, without a cursor."""
    async with await connect(args.metadata) as client:
        reader = await client.create_reader(args.stream, streamlib.EARLIEST)
        received = 0
        try:
            while await reader.has_message_available():
                message = await reader.read_next(timeout=args.timeout)
                emit("message", id=str(message.message_id), data=message.data.decode())
                received += 1
        except (StreamlibError, TimeoutError) as e:
            emit("read_failed", received=received, **error_fields(e))
            return 1
        await closed_within(reader, CLOSE_TIMEOUT_S)
        emit("end", received=received)
    return 0


# -- observer ---------------------------------------------------------------------------


async def observer_main(args: argparse.Namespace) -> int:
    """Report every change of the set of registered bookies ("bookies" events) and
    answer questions about streams, ledgers and under-replication."""
    client = await connect(args.metadata)
    marks = UnderReplicationManager(client.store)

    async def watch_registrations() -> None:
        seen: list[str] | None = None
        while True:
            try:
                now = sorted(b.bookie_id for b in await client.registry.list())
            except MetadataError as e:
                emit("observer_error", **error_fields(e))
            else:
                if now != seen:
                    emit("bookies", present=now)
                    seen = now
            await asyncio.sleep(POLL_S)  # polling the registry, bounded by the test

    async def create_stream(request: dict[str, Any]) -> None:
        await client.streams.create(
            request["name"], request["ensemble"], request["write_quorum"], request["ack_quorum"]
        )
        emit("created", rid=request["rid"])

    async def stream(request: dict[str, Any]) -> None:
        emit("stream", rid=request["rid"], ledgers=await ledgers_of(client, request["name"]))

    async def under_replicated(request: dict[str, Any]) -> None:
        found = [
            {"ledger": m.ledger_id, "missing": list(m.missing_bookies)} for m in await marks.list()
        ]
        emit("under_replicated", rid=request["rid"], ledgers=found)

    async def bookies(request: dict[str, Any]) -> None:
        infos = await client.registry.list()
        emit("registered", rid=request["rid"], bookies={b.bookie_id: b.address for b in infos})

    watcher = asyncio.get_running_loop().create_task(watch_registrations())
    try:
        await serve_requests(
            {
                "create_stream": create_stream,
                "stream": stream,
                "under_replicated": under_replicated,
                "bookies": bookies,
            }
        )
    finally:
        watcher.cancel()
        await client.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.multihost.workers")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("producer", "consume", "read", "observer"):
        p = sub.add_parser(name)
        p.add_argument("--metadata", required=True)
        if name != "observer":
            p.add_argument("--stream", required=True)
        if name == "consume":
            p.add_argument("--subscription", required=True)
            p.add_argument("-n", type=int, required=True)
        p.add_argument("--timeout", type=float, default=30.0, help="per message, s")
    args = parser.parse_args(argv)
    mains = {
        "producer": producer_main,
        "consume": consume_main,
        "read": read_main,
        "observer": observer_main,
    }
    return asyncio.run(mains[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
