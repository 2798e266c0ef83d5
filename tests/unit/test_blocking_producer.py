"""The blocking producer's own layer (streamlib/sync.py) over an appender that the test
settles by hand: send_async's futures are concurrent.futures.Futures that wait(),
as_completed() and callbacks understand, room in the queue is taken by callers and
given back as sends settle, resends of a message in flight settle with the original,
and sends of many threads all arrive, each thread's in its order."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from streamlib import sync
from streamlib.errors import ClientClosedError
from streamlib.stream.batch import decode_batch
from streamlib.stream.positions import MessageId
from streamlib.stream.producer import Producer, ProducerQueueIsFullError


class HeldAppender:
    """Entries wait until the test settles them (release)."""

    name = "held"

    def __init__(self) -> None:
        self.waiting: list[tuple[bytes, asyncio.Future[tuple[int, int]]]] = []
        self.stored: list[bytes] = []

    def append_entry(
        self, entry: bytes, first: int, last: int, messages: int
    ) -> asyncio.Future[tuple[int, int]]:
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self.waiting.append((entry, future))
        return future

    def release(self) -> int:
        """(On the loop) settle every entry waiting; how many."""
        waiting, self.waiting = self.waiting, []
        for entry, future in waiting:
            future.set_result((7, len(self.stored)))
            self.stored.append(entry)
        return len(waiting)

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.fixture
def runner() -> Iterator[sync._LoopThread]:
    runner = sync._LoopThread()
    yield runner
    runner.stop()


def producer(runner: sync._LoopThread, **options: object) -> tuple[sync.Producer, HeldAppender]:
    appender = HeldAppender()

    async def make() -> Producer:
        return Producer(appender, **options)  # type: ignore[arg-type]

    return sync.Producer(runner.run(make()), runner), appender


def release(runner: sync._LoopThread, appender: HeldAppender) -> int:
    return runner.call(appender.release)


def test_send_futures_work_with_wait_as_completed_and_callbacks(
    runner: sync._LoopThread,
) -> None:
    blocking, appender = producer(runner)
    called: list[tuple[BaseException | None, MessageId | None]] = []
    futures = [
        blocking.send_async(b"m%d" % i, callback=lambda e, m: called.append((e, m)))
        for i in range(10)
    ]
    assert isinstance(futures[0], concurrent.futures.Future)
    assert not futures[0].cancel()  # (handed over: it goes)
    with pytest.raises(concurrent.futures.TimeoutError):
        futures[0].result(timeout=0.05)
    done, not_done = concurrent.futures.wait(futures, timeout=0.05)
    assert not done and len(not_done) == 10
    seen: list[MessageId] = []
    futures[3].add_done_callback(lambda f: seen.append(f.result()))

    waiter = threading.Thread(target=lambda: concurrent.futures.wait(futures, timeout=30))
    waiter.start()
    while sum(f.done() for f in futures) < 10:
        release(runner, appender)
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    ids = [f.result() for f in concurrent.futures.as_completed(futures, timeout=30)]
    assert sorted(ids) == [f.result() for f in futures]
    assert seen == [futures[3].result()]
    assert sorted(m for _, m in called) == [f.result() for f in futures]  # type: ignore[type-var]
    assert all(e is None for e, _ in called)
    assert all(f.exception(timeout=0) is None for f in futures)


def test_room_is_taken_by_callers_and_given_back_as_sends_settle(
    runner: sync._LoopThread,
) -> None:
    refusing, appender = producer(runner, max_pending_messages=3, block_if_queue_full=False)
    first = [refusing.send_async(b"x") for _ in range(3)]
    with pytest.raises(ProducerQueueIsFullError):
        refusing.send_async(b"one too many")
    while not all(f.done() for f in first):
        release(runner, appender)
    refusing.send_async(b"room again")  # (the settled ones gave their places back)

    blocking, held = producer(runner, max_pending_messages=2)
    sent = [blocking.send_async(b"a"), blocking.send_async(b"b")]
    third: list[concurrent.futures.Future[MessageId]] = []
    sender = threading.Thread(target=lambda: third.append(blocking.send_async(b"c")))
    sender.start()
    sender.join(timeout=0.3)
    assert sender.is_alive()  # waiting for room
    while not all(f.done() for f in sent):
        release(runner, held)
    sender.join(timeout=30)
    assert not sender.is_alive() and len(third) == 1
    while not third[0].done():
        release(runner, held)
    assert third[0].result() > sent[1].result()


def test_a_resend_of_a_message_in_flight_settles_with_the_original(
    runner: sync._LoopThread,
) -> None:
    blocking, appender = producer(runner)
    original = blocking.send_async(b"once", sequence_id=5)
    again = blocking.send_async(b"once", sequence_id=5)
    assert again is not original
    while not original.done():
        release(runner, appender)
    assert again.result(timeout=30) == original.result()
    stored = [p for entry in appender.stored for p in decode_batch(entry, "test").payloads]
    assert stored == [b"once"]


def test_sends_of_many_threads_all_arrive_each_in_its_order(runner: sync._LoopThread) -> None:
    blocking, appender = producer(runner, max_pending_messages=50)
    threads = 4
    each = 500
    stop = threading.Event()

    def settle() -> None:
        while not stop.is_set():
            release(runner, appender)

    settler = threading.Thread(target=settle)
    settler.start()
    futures: dict[int, list[concurrent.futures.Future[MessageId]]] = {}

    def send(t: int) -> None:
        futures[t] = [blocking.send_async(b"%d-%d" % (t, i)) for i in range(each)]

    senders = [threading.Thread(target=send, args=(t,)) for t in range(threads)]
    for s in senders:
        s.start()
    for s in senders:
        s.join(timeout=60)
    blocking.flush()
    stop.set()
    settler.join(timeout=30)
    release(runner, appender)
    for t in range(threads):
        ids = [f.result(timeout=30) for f in futures[t]]
        assert ids == sorted(ids)  # (each thread's in its order)
    stored = [p for entry in appender.stored for p in decode_batch(entry, "test").payloads]
    assert sorted(stored) == sorted(b"%d-%d" % (t, i) for t in range(threads) for i in range(each))
    for t in range(threads):
        mine = [p for p in stored if p.startswith(b"%d-" % t)]
        assert mine == [b"%d-%d" % (t, i) for i in range(each)]


def test_a_closed_client_refuses_and_gives_the_place_back(runner: sync._LoopThread) -> None:
    blocking, _ = producer(runner, max_pending_messages=1, block_if_queue_full=False)
    runner.stop()
    with pytest.raises(ClientClosedError):
        blocking.send_async(b"late")
    assert len(blocking._free) == 1
