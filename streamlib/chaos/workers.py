"""The processes `streamlib chaos` starts, kills and restarts, in either mode: a
producer, a consumer and a reader of one stream, each an application written against
the public API (`streamlib.client.Client`, which reaches the stream service for a
streamlib:// URI) that logs what it saw to its own event log (streamlib.chaos.events).

    python -m streamlib.chaos.workers producer|consumer|reader --url URI --stream NAME \\
        --log FILE --incarnation N [--client-timeout S] [--name NAME] \\
        [--subscription NAME] [--type failover|shared] [--seal] [--after L:E:B] [--scan]

The producer of direct mode is the stream's writer: it sends windows of messages and,
after a failure, takes the stream over again. With --name (broker mode) it is a named
producer deduplicated by its broker: it numbers its messages itself, a restarted one
going on after the last its name published, and sends at a steady rate. The consumer
acknowledges what it receives, on a failover subscription (direct mode) or a shared one
(broker mode). The reader reads from EARLIEST; with --scan it stops at the end.

Each worker goes on after any failure as an application would (recreate the producer,
resubscribe, reopen the reader after the last message read), logging it; every call is
bounded, so a call that hangs is logged as a failure instead of hanging the worker.
SIGTERM / SIGINT stop a worker cleanly (a producer closes its producer); a worker whose
parent died stops too. SIGUSR1 logs where every task and async generator waits (a
"stacks" event): the harness asks a worker that stalls.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import inspect
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from metadata.errors import MetadataError
from streamlib.chaos.events import EventLog, describe, payload, traceback_of
from streamlib.client import Client
from streamlib.ledger.bookie_client import BookieClientConfig
from streamlib.protocol.errors import StreamlibError
from streamlib.stream.positions import EARLIEST, MessageId

T = TypeVar("T")

CALL_TIMEOUT_S = 30.0  # any one call: a takeover, a subscribe, a close
SEND_TIMEOUT_S = 20.0  # a window of sends, from the first sent to the last answered
POLL_S = 0.5  # how long one receive / read_next waits before the stop flag is checked
# Failures an application expects from a cluster under faults; anything else is logged
# as "unexpected" (with its traceback) and gone on from all the same.
EXPECTED = (StreamlibError, MetadataError, TimeoutError, ConnectionError)
PUBLISH_BURST = 20  # a named producer's messages per PUBLISH_GAP_S: about 2,000 a second
PUBLISH_GAP_S = 0.01
PUBLISH_PENDING = 500  # its sends in flight at most (send_async waits for room)


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
    options: dict[str, Any] = {}
    if args.client_timeout is not None:  # (a direct client's: the service's has no bookies)
        timeout_s = args.client_timeout
        options["bookie_config"] = BookieClientConfig(
            add_timeout_s=timeout_s, read_timeout_s=timeout_s
        )
    while not stop.is_set():
        try:
            return await bounded(Client.connect(args.url, **options))
        except Exception as error:
            log.error(error, during="connect")
            await pause(stop, 0.5)
    return None


# -- the producers ------------------------------------------------------------------------


def producer_name(args: argparse.Namespace) -> str:
    """What its payloads name it by: its --name, else its incarnation."""
    return args.name or f"p{args.incarnation}"


def log_ack(log: EventLog, args: argparse.Namespace, seq: int, message_id: MessageId) -> None:
    log.write("ack", seq=seq, payload=payload(producer_name(args), seq), id=str(message_id))


def log_failure(log: EventLog, seq: int, sent: float, error: BaseException) -> None:
    """A send (seq -1: a takeover) that failed; with the traceback of an error no
    application would expect."""
    extra = {} if isinstance(error, EXPECTED) else {"traceback": traceback_of(error)}
    log.write("fail", seq=seq, sent=sent, error=describe(error), **extra)


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
                    log_failure(log, -1, attempt, error)
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
                data = payload(producer_name(args), seq).encode()
                try:
                    sends.append((seq, sent, await producer.send_async(data)))
                except Exception as error:
                    log_failure(log, seq, sent, error)
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
                    log_failure(log, number, sent, error)
                    failed = True
                else:
                    log_ack(log, args, number, message_id)
            if failed:
                await quietly_close(producer, log, "producer")
                producer = None
                await pause(stop, rnd.uniform(0.1, 0.5))
    finally:
        if producer is not None and await quietly_close(producer, log, "producer"):
            log.write("closed")


async def publish(
    args: argparse.Namespace, client: Client, log: EventLog, stop: asyncio.Event
) -> None:
    """A named producer through the stream service: sends "<name>-<seq>" with its own
    sequence ids, going on after the last one its name published (the broker tells
    it), PUBLISH_BURST every PUBLISH_GAP_S, and logs each answer as it comes; the client
    rides over broker failovers itself. On stop it flushes, logs "stopped" and closes."""
    producer = await bounded(
        client.create_producer(
            args.stream, producer_name=args.name, max_pending_messages=PUBLISH_PENDING
        )
    )
    seq = producer.last_sequence_id
    log.write("producer", seq=seq + 1)

    def answered(number: int, sent: float, future: asyncio.Future[MessageId]) -> None:
        if future.cancelled():
            log_failure(log, number, sent, asyncio.CancelledError())
        elif (error := future.exception()) is not None:
            log_failure(log, number, sent, error)
        else:
            log_ack(log, args, number, future.result())

    try:
        while not stop.is_set():
            for _ in range(PUBLISH_BURST):
                seq += 1
                data = payload(args.name, seq).encode()
                sent = time.time()
                future = await producer.send_async(data, key=f"k{seq % 11}", sequence_id=seq)
                future.add_done_callback(functools.partial(answered, seq, sent))
            await pause(stop, PUBLISH_GAP_S)  # the rate's pacing
        await bounded(producer.flush())
        log.write("stopped", last=seq)
    finally:
        await quietly_close(producer, log, "producer")


# -- the consumer and the reader --------------------------------------------------------


async def consume(
    args: argparse.Namespace, client: Client, log: EventLog, stop: asyncio.Event
) -> None:
    """Receive and acknowledge each message; after an error, resubscribe (a new session:
    the cursor's position may deliver some messages again). On a failover subscription
    a restarted consumer waits in line until its killed predecessor's metadata session
    ends, then goes on from the cursor; on a shared one the consumers split the stream."""
    session = 0
    while not stop.is_set():
        try:
            consumer = await bounded(
                client.subscribe(
                    args.stream,
                    args.subscription,
                    initial_position="earliest",
                    consumer_type=args.type,
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
            producer = publish if args.name else produce
            work = {"producer": producer, "consumer": consume, "reader": read}[args.role]
            await work(args, client, log, stop)
        finally:
            await quietly_close(client, log, "client")
        return 0
    except Exception as error:  # a bug of this worker: logged for the verdict
        log.error(error, during="worker")
        return 1
    finally:
        watchdog.cancel()
        loop.remove_signal_handler(signal.SIGUSR1)
        log.write("exit")
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamlib.chaos.workers")
    parser.add_argument("role", choices=("producer", "consumer", "reader"))
    parser.add_argument("--url", required=True, help="a metadata store's, or streamlib://...")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--client-timeout", type=float, help="bookie add / read timeout, s")
    parser.add_argument("--name", help="producer: a named one, deduplicated by the broker")
    parser.add_argument("--subscription", default="chaos", help="consumer: its subscription")
    parser.add_argument("--type", default="failover", choices=("failover", "shared"))
    parser.add_argument("--seal", action="store_true", help="producer: take over, close, exit")
    parser.add_argument("--after", help="reader: start after this message id")
    parser.add_argument("--scan", action="store_true", help="reader: stop at the end")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
