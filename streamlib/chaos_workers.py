"""The processes `streamlib chaos` starts, kills and restarts: a producer, a durable
consumer and a reader of one stream, each an application written against the public
API (`streamlib.Client`) that logs what it saw, one JSON object a line, to its own
append-only file.

    python -m streamlib.chaos_workers producer|consumer|reader --metadata URI \\
        --stream NAME --log FILE --incarnation N [--seal] [--after L:E:B] [--scan]

A line is written with one write(2) on an O_APPEND descriptor as soon as the event
happens: the harness kills processes, not the machine, so what was written survives a
SIGKILL. Each worker goes on after any failure as an application would (recreate the
producer, resubscribe, reopen the reader after the last message read), logging it;
every call is bounded, so a call that hangs is logged as a failure instead of hanging
the worker. SIGTERM / SIGINT stop a worker cleanly (a producer closes its producer);
a worker whose parent died stops too. SIGUSR1 logs where every task and async
generator waits (a "stacks" event): the harness asks a worker that stalls.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Awaitable
from typing import Any, TypeVar

from metadata.errors import MetadataError
from streamlib.client import Client
from streamlib.ledger.bookie_client import BookieClientConfig
from streamlib.protocol.errors import StreamlibError
from streamlib.stream.positions import EARLIEST, MessageId

T = TypeVar("T")

SUBSCRIPTION = "chaos"
CALL_TIMEOUT_S = 30.0  # any one call: a takeover, a subscribe, a close
SEND_TIMEOUT_S = 20.0  # a window of sends, from the first sent to the last answered
POLL_S = 0.5  # how long one receive / read_next waits before the stop flag is checked
# Failures an application expects from a cluster under faults; anything else is logged
# as "unexpected" (with its traceback) and gone on from all the same.
EXPECTED = (StreamlibError, MetadataError, TimeoutError, ConnectionError)


class EventLog:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, **fields: Any) -> None:
        record = {"ev": event, "t": round(time.time(), 6), **fields}
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def error(self, error: BaseException, **fields: Any) -> None:
        self.write("error", error=describe(error), traceback=_traceback(error), **fields)

    def close(self) -> None:
        os.close(self._fd)


def describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _traceback(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))[-4000:]


async def bounded(call: Awaitable[T], timeout_s: float = CALL_TIMEOUT_S) -> T:
    async with asyncio.timeout(timeout_s):
        return await call


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """A retry backoff that a stop request cuts short."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


async def quietly_close(thing: Any, log: EventLog, what: str) -> bool:
    """Close with a bound; False (logged) if it failed or hung."""
    try:
        await bounded(thing.close())
        return True
    except Exception as error:
        log.write("close_failed", what=what, error=describe(error))
        return False


async def connect(args: argparse.Namespace, log: EventLog, stop: asyncio.Event) -> Client | None:
    config = BookieClientConfig(
        add_timeout_s=args.client_timeout, read_timeout_s=args.client_timeout
    )
    while not stop.is_set():
        try:
            return await bounded(Client.connect(args.metadata, bookie_config=config))
        except Exception as error:
            log.error(error, during="connect")
            await pause(stop, 0.5)
    return None


# -- the producer -------------------------------------------------------------------------


async def produce(
    args: argparse.Namespace, client: Client, log: EventLog, stop: asyncio.Event
) -> None:
    """Send windows of 1-16 messages "p<incarnation>-<seq>" (batches of up to 4), log
    each answer; after a failure, drop the producer and take the stream over again."""
    rnd = random.Random(args.incarnation)
    producer = None
    seq = 0
    try:
        while not stop.is_set():
            if producer is None:
                attempt = time.time()
                try:
                    producer = await bounded(
                        client.create_producer(args.stream, batching_max_messages=4)
                    )
                except Exception as error:
                    log.write("fail", seq=-1, sent=attempt, error=describe(error), **_extra(error))
                    await pause(stop, rnd.uniform(0.2, 0.5))
                    continue
                log.write("producer", took_s=round(time.time() - attempt, 3))
                if args.seal:
                    break
            failed = False
            sends: list[tuple[int, float, asyncio.Future[MessageId]]] = []
            for _ in range(rnd.randint(1, 16)):
                seq += 1
                sent = time.time()
                try:
                    sends.append((seq, sent, await producer.send_async(_payload(args, seq))))
                except Exception as error:
                    log.write("fail", seq=seq, sent=sent, error=describe(error), **_extra(error))
                    failed = True
                    break
            deadline = asyncio.get_running_loop().time() + SEND_TIMEOUT_S
            for number, sent, future in sends:
                try:
                    async with asyncio.timeout_at(deadline):
                        message_id = await asyncio.shield(future)
                except Exception as error:
                    if isinstance(error, TimeoutError):
                        error = TimeoutError(f"no answer within {SEND_TIMEOUT_S} s")
                    log.write("fail", seq=number, sent=sent, error=describe(error), **_extra(error))
                    failed = True
                else:
                    payload = _payload(args, number).decode()
                    log.write("ack", seq=number, payload=payload, id=str(message_id))
            if failed:
                await quietly_close(producer, log, "producer")
                producer = None
                await pause(stop, rnd.uniform(0.1, 0.5))
    finally:
        if producer is not None and await quietly_close(producer, log, "producer"):
            log.write("closed")


def _payload(args: argparse.Namespace, seq: int) -> bytes:
    return f"p{args.incarnation}-{seq}".encode()


def _extra(error: BaseException) -> dict[str, str]:
    """The traceback of an error no application would expect."""
    return {} if isinstance(error, EXPECTED) else {"traceback": _traceback(error)}


# -- the consumer and the reader --------------------------------------------------------


async def consume(
    args: argparse.Namespace, client: Client, log: EventLog, stop: asyncio.Event
) -> None:
    """Receive and acknowledge each message; after an error, resubscribe (a new session:
    the cursor's position may deliver some messages again)."""
    session = 0
    while not stop.is_set():
        try:
            consumer = await bounded(
                # Failover: a restarted consumer waits in line until its killed
                # predecessor's metadata session ends, then goes on from the cursor.
                client.subscribe(
                    args.stream, SUBSCRIPTION, initial_position="earliest", consumer_type="failover"
                )
            )
        except Exception as error:
            log.error(error, during="subscribe")
            await pause(stop, 0.5)
            continue
        session += 1
        name = f"{args.incarnation}.{session}"
        log.write("subscribed", session=name)
        try:
            while not stop.is_set():
                try:
                    message = await consumer.receive(timeout=POLL_S)
                except TimeoutError:
                    continue
                log.write(
                    "msg",
                    session=name,
                    id=str(message.message_id),
                    payload=message.data.decode(errors="replace"),
                    redelivery=message.redelivery_count,
                )
                consumer.acknowledge(message)
        except Exception as error:
            log.error(error, during="receive")
            await pause(stop, 0.5)
        finally:
            await quietly_close(consumer, log, "consumer")


async def read(
    args: argparse.Namespace, client: Client, log: EventLog, stop: asyncio.Event
) -> None:
    """Read from EARLIEST (or after --after) once; after an error, reopen after the last
    message read. With --scan, stop at the end confirmed now (a final audit)."""
    last = MessageId.parse(args.after) if args.after else EARLIEST
    while not stop.is_set():
        try:
            reader = await bounded(client.create_reader(args.stream, start=last))
        except Exception as error:
            log.error(error, during="create_reader")
            await pause(stop, 0.5)
            continue
        log.write("opened", after=str(last))
        try:
            while not stop.is_set():
                if args.scan and not await bounded(reader.has_message_available()):
                    log.write("done")
                    return
                try:
                    message = await reader.read_next(
                        timeout=CALL_TIMEOUT_S if args.scan else POLL_S
                    )
                except TimeoutError:
                    if args.scan:
                        raise
                    continue
                last = message.message_id
                log.write("msg", id=str(last), payload=message.data.decode(errors="replace"))
        except Exception as error:
            log.error(error, during="read")
            await pause(stop, 0.5)
        finally:
            await quietly_close(reader, log, "reader")


# -- the process ---------------------------------------------------------------------------


def _awaiting(start: Any) -> str:
    """The chain of coroutines / generators from `start` down to what it waits for."""
    frames = []
    node = start
    while node is not None:
        frame = getattr(node, "cr_frame", None) or getattr(node, "ag_frame", None)
        frame = frame or getattr(node, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            frames.append(f"{code.co_qualname} ({code.co_filename}:{frame.f_lineno})")
        node = next(
            (
                getattr(node, a)
                for a in ("cr_await", "ag_await", "gi_yieldfrom")
                if getattr(node, a, None) is not None
            ),
            None,
        )
    return " > ".join(frames) or repr(start)


def stacks() -> str:
    """Where each task waits, and each suspended async generator (a task's chain stops
    at an `async for`: the generator it iterates is listed on its own)."""
    lines = [f"task {t.get_name()}: {_awaiting(t.get_coro())}" for t in asyncio.all_tasks()]
    lines += [
        f"async generator: {_awaiting(g)}"
        for g in gc.get_objects()
        if inspect.isasyncgen(g) and g.ag_frame is not None
    ]
    return "\n".join(lines)


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if os.getppid() != parent:  # orphaned: the harness is gone
            stop.set()
        await pause(stop, 1.0)


async def main_async(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watchdog = loop.create_task(_watch_parent(os.getppid(), stop))
    log = EventLog(args.log)
    loop.add_signal_handler(signal.SIGUSR1, lambda: log.write("stacks", stacks=stacks()))
    log.write("start", role=args.role, pid=os.getpid())
    try:
        client = await connect(args, log, stop)
        if client is None:
            return 0
        try:
            work = {"producer": produce, "consumer": consume, "reader": read}[args.role]
            await work(args, client, log, stop)
        finally:
            await quietly_close(client, log, "client")
        return 0
    except Exception as error:  # a bug of this worker: logged for the verdict
        log.write("error", error=describe(error), traceback=_traceback(error), during="worker")
        return 1
    finally:
        watchdog.cancel()
        loop.remove_signal_handler(signal.SIGUSR1)
        log.write("exit")
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamlib.chaos_workers")
    parser.add_argument("role", choices=("producer", "consumer", "reader"))
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--client-timeout", type=float, default=3.0)
    parser.add_argument("--seal", action="store_true", help="producer: take over, close, exit")
    parser.add_argument("--after", help="reader: start after this message id")
    parser.add_argument("--scan", action="store_true", help="reader: stop at the end")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
