"""The blocking API as a pulsar-client user meets it, against real bookie processes:
real classes with signatures and docstrings, iteration and context managers,
send_async with a callback and a future that resolves by itself, ClientClosedError
after close, Ctrl-C interrupting a blocking receive, and types mypy --strict sees."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import threading
from importlib import resources
from pathlib import Path

import pytest

import streamlib
import streamlib.errors as errors
from streamlib.stream.positions import MessageId
from tests.integration.conftest import script_process

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def uri(cluster) -> str:
    cluster.start_bookies(3)
    return cluster.metadata_uri


def test_the_classes_show_what_they_offer(uri: str) -> None:
    with streamlib.connect(uri) as client:
        for name in ("create_producer", "subscribe", "create_reader", "close"):
            assert name in dir(client)
        params = inspect.signature(client.subscribe).parameters
        assert {"consumer_type", "receiver_queue_size", "ack_timeout_ms"} <= set(params)
        assert (
            "batching_max_publish_delay_ms" in inspect.signature(client.create_producer).parameters
        )
        with client.create_producer("shown") as producer:
            assert "send_async" in dir(producer)
            assert "callback" in inspect.signature(producer.send_async).parameters
        for cls in (type(client), type(producer), streamlib.sync.Consumer, streamlib.sync.Reader):
            assert cls.__doc__ and len(cls.__doc__) > 40, cls
            assert cls.__module__ == "streamlib.sync"
        assert {"create", "open"} <= set(dir(client.ledgers))  # (the proxy lists its target's)


def test_send_async_resolves_without_flush_and_calls_back(uri: str) -> None:
    with streamlib.connect(uri) as client:
        producer = client.create_producer("cb", batching_max_publish_delay_ms=600_000)
        called: list[tuple[BaseException | None, MessageId | None]] = []
        done = threading.Event()

        def callback(error: BaseException | None, message_id: MessageId | None) -> None:
            called.append((error, message_id))
            if len(called) == 200:
                done.set()

        futures = [producer.send_async(b"m%d" % i, callback=callback) for i in range(200)]
        # No flush: the futures resolve as the entries become durable.
        ids = [f.result(timeout=30) for f in futures]
        assert done.wait(30)
        assert ids == sorted(ids) and len(set(ids)) == 200
        assert sorted(m for _, m in called) == ids and all(e is None for e, _ in called)
        assert len({(i.ledger_id, i.entry_id) for i in ids}) < 200  # batched, not one each

        # A producer taken over: its sends fail, through the future and the callback.
        client.create_producer("cb")  # fences the first
        failed: list[BaseException | None] = []
        future = producer.send_async(b"late", callback=lambda e, _: failed.append(e))
        with pytest.raises(errors.StreamFencedError):
            future.result(timeout=30)
        assert isinstance(failed[0], errors.StreamFencedError)

        with pytest.raises(errors.BadRequestError):  # bad input: at once, in this thread
            producer.send_async("not bytes")  # type: ignore[arg-type]


def test_iteration_context_managers_and_timeouts(uri: str) -> None:
    with streamlib.connect(uri) as client:
        with client.create_producer("iter") as producer:
            for i in range(5):
                producer.send(b"%d" % i)
        with client.subscribe("iter", "sub", "earliest") as consumer:
            got = []
            for message in consumer:
                consumer.acknowledge(message.message_id)
                got.append(message.data)
                if len(got) == 3:
                    break
            assert got == [b"0", b"1", b"2"]
            assert [consumer.receive(timeout=30).data for _ in range(2)] == [b"3", b"4"]
            with pytest.raises(TimeoutError):  # the builtin catches streamlib's
                consumer.receive(timeout=0.3)
        with client.create_reader("iter") as reader:
            assert [m.data for _, m in zip(range(5), reader, strict=False)] == [
                b"%d" % i for i in range(5)
            ]
            assert not reader.has_message_available()
            with pytest.raises(errors.TimeoutError):
                reader.read_next(timeout=0.3)


def test_acknowledging_does_not_wait_for_the_clients_loop_and_keeps_its_order(uri: str) -> None:
    """pulsar-client's acknowledge hands the ack over and returns; ours is queued for the
    client's loop (one hop for however many gather), so a loop busy elsewhere does not
    hold the caller up, and what the caller does next (close, here) comes after it. (It
    was a round trip to the loop per ack: two thirds of a receive-and-acknowledge loop.)"""
    with streamlib.connect(uri) as client:
        producer = client.create_producer("acks")
        for i in range(10):
            producer.send(b"%d" % i)
        consumer = client.subscribe("acks", "sub", "earliest")
        messages = [consumer.receive(timeout=30) for _ in range(10)]
        held, release = threading.Event(), threading.Event()

        def hold_the_loop(*_: object) -> None:  # (a callback runs on the client's loop)
            held.set()
            release.wait(60)

        producer.send_async(b"more", callback=hold_the_loop)
        assert held.wait(30)

        def acknowledge() -> None:
            for message in messages[:4]:
                consumer.acknowledge(message)
            consumer.negative_acknowledge(messages[4])
            consumer.acknowledge(messages[5])

        acking = threading.Thread(target=acknowledge)
        try:
            acking.start()
            acking.join(timeout=10)  # bounded: on a loop that waits, it would not return
            assert not acking.is_alive(), "acknowledge waited for the client's loop"
        finally:
            release.set()
        acking.join(timeout=30)
        consumer.close()  # after the acks: the cursor it persists has them
        again = client.subscribe("acks", "sub")
        got = sorted(again.receive(timeout=30).data for _ in range(5))
        assert got == [b"4", b"6", b"7", b"8", b"9"]  # 4: negatively acknowledged
        with pytest.raises(errors.BadRequestError):  # bad input: at once, as before
            again.acknowledge("not a message")  # type: ignore[arg-type]


def test_receive_takes_a_burst_per_hop_and_drops_it_when_the_consumer_forgets(
    uri: str,
) -> None:
    """One hop to the loop takes every message there; the next receives take them in
    the caller's thread. What waits there is dropped as the consumer's own queue is: a
    seek delivers from the new position, a close leaves them unacknowledged (the next
    consumer gets them), a consumer with an ack timeout takes one per hop (its clock
    starts when the application receives), and a burst is at most half the receiver
    queue."""
    with streamlib.connect(uri) as client:
        producer = client.create_producer("bursts")
        for i in range(50):
            producer.send_async(b"%d" % i)
        producer.flush()
        consumer = client.subscribe("bursts", "sub", "earliest")
        first = consumer.receive(timeout=30)
        assert first.data == b"0"
        hops = 0
        real_submit = consumer._runner.submit

        def counting_submit(coro):  # type: ignore[no-untyped-def]
            nonlocal hops
            hops += 1
            return real_submit(coro)

        consumer._runner.submit = counting_submit  # type: ignore[method-assign]
        got = [first] + [consumer.receive(timeout=30) for _ in range(49)]
        consumer._runner.submit = real_submit  # type: ignore[method-assign]
        assert [m.data for m in got] == [b"%d" % i for i in range(50)]
        assert hops < 10, hops  # (a hop per message: 49)

        consumer.seek(first.message_id)  # (that message first again)
        assert consumer.receive(timeout=30).data == b"0"
        consumer.acknowledge_cumulative(got[9])
        consumer.close()  # what the burst holds: unacknowledged, delivered again
        again = client.subscribe("bursts", "sub")
        assert again.receive(timeout=30).data == b"10"
        again.close()

        timed = client.subscribe("bursts", "timed", "earliest", ack_timeout_ms=60_000)
        assert timed.receive(timeout=30).data == b"0"
        assert len(timed._received) == 0
        timed.close()
        # A small receiver queue (a shared subscription's fair share): bursts of half
        # of it at most; of one message, none.
        small = client.subscribe("bursts", "small", "earliest", receiver_queue_size=8)
        assert small.receive(timeout=30).data == b"0"
        assert len(small._received) <= 3
        small.close()
        one = client.subscribe("bursts", "one", "earliest", receiver_queue_size=1)
        assert one.receive(timeout=30).data == b"0"
        assert len(one._received) == 0 and one._next_burst is None
        one.close()


def test_acknowledgements_handed_over_come_before_a_close_or_a_seek(uri: str) -> None:
    """Acknowledgements are gathered on the loop every few ms; what was handed over still
    comes before the client's close (the cursor it persists has them) and before a seek
    of a part of a consumer of several streams (the moved cursor does not take them)."""
    with streamlib.connect(uri) as client:
        for stream in ("ack-a", "ack-b"):
            with client.create_producer(stream) as producer:
                for i in range(20):
                    producer.send_async(b"%d" % i)
    with streamlib.connect(uri) as client:
        consumer = client.subscribe("ack-a", "sub", "earliest")
        for _ in range(20):
            consumer.acknowledge(consumer.receive(timeout=30))
    # (closed with the client, at once)
    with streamlib.connect(uri) as client:
        again = client.subscribe("ack-a", "sub")
        with pytest.raises(TimeoutError):
            again.receive(timeout=0.5)

        both = client.subscribe(["ack-a", "ack-b"], "both", "earliest")
        of_a = [m for m in (both.receive(timeout=30) for _ in range(40)) if m.stream == "ack-a"]
        assert len(of_a) == 20
        for message in of_a:
            both.acknowledge(message)
        assert both.consumer("ack-a") is both.consumer("ack-a")
        both.consumer("ack-a").seek(of_a[0].message_id)  # (after the acks: all come again)
        again_a = [both.receive(timeout=30) for _ in range(20)]
        assert sorted(m.data for m in again_a) == sorted(m.data for m in of_a)


def test_a_closed_client_says_so(uri: str) -> None:
    client = streamlib.connect(uri)
    producer = client.create_producer("closed")
    consumer = client.subscribe("closed", "sub")
    client.close()
    client.close()  # idempotent
    for call in (
        lambda: client.create_producer("closed"),
        lambda: producer.send(b"x"),
        lambda: producer.send_async(b"x"),
        lambda: consumer.receive(timeout=1),
    ):
        with pytest.raises(errors.ClientClosedError):
            call()
    producer.close()  # closing again after the client is quiet
    consumer.close()


CTRL_C_SCRIPT = r"""
import sys, streamlib
client = streamlib.connect(sys.argv[1])
consumer = client.subscribe("quiet", "sub")
try:
    print("waiting", flush=True)
    consumer.receive()  # nothing will come
except KeyboardInterrupt:
    print("interrupted", flush=True)
consumer.close()
client.close()
print("closed", flush=True)
"""


async def test_ctrl_c_interrupts_a_blocking_receive(cluster) -> None:
    cluster.start_bookies(3)
    setup = await cluster.client()
    await setup.streams.create("quiet", 3, 3, 2)
    async with script_process(CTRL_C_SCRIPT, cluster.metadata_uri, ready="waiting") as proc:
        proc.send_signal(signal.SIGINT)
        out, _ = await asyncio.to_thread(proc.communicate, None, 60)
        assert out.split() == ["interrupted", "closed"], out
        assert proc.returncode == 0


SAMPLE = """
import streamlib
from streamlib.stream.positions import MessageId

def run(uri: str) -> list[bytes]:
    with streamlib.connect(uri) as client:
        producer = client.create_producer("typed")
        ids: list[MessageId] = [producer.send(b"x")]
        future = producer.send_async(b"y", callback=lambda error, msg_id: None)
        ids.append(future.result())
        consumer = client.subscribe("typed", "sub", consumer_type="failover")
        return [consumer.receive(timeout=1.0).data for _ in ids]
"""

WRONG = """
import streamlib

def run(uri: str) -> int:
    client = streamlib.connect(uri)
    producer = client.create_producer("typed")
    return producer.send(b"x")
"""


def test_mypy_strict_sees_the_real_types(tmp_path: Path) -> None:
    assert resources.files("streamlib").joinpath("py.typed").is_file()
    (tmp_path / "good.py").write_text(SAMPLE)
    (tmp_path / "wrong.py").write_text(WRONG)

    def mypy(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
             "--cache-dir", str(tmp_path / "cache"), str(tmp_path / name)],
            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "MYPYPATH": str(ROOT)},
            timeout=300, check=False,
        )  # fmt: skip

    good = mypy("good.py")
    assert good.returncode == 0, good.stdout
    wrong = mypy("wrong.py")
    assert wrong.returncode == 1
    assert 'Incompatible return value type (got "MessageId", expected "int")' in wrong.stdout
