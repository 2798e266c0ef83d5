"""Managed streams and the pub/sub API on real bookies (issue: Managed streams)."""

import asyncio
import datetime as dt
import time

import pytest

from metadata.schemas import LedgerInfo
from streamlib.errors import (
    BadRequestError,
    InvalidPositionError,
    NoSuchStreamError,
    StreamFencedError,
    StreamlibError,
    TooLargeError,
)
from streamlib.protocol import LedgerState
from streamlib.stream.batch import BatchBuilder
from streamlib.stream.positions import EARLIEST, MessageId
from tests.integration.conftest import reset_cursor_once_cursors_are_read, script_process


async def read_all(client, stream):
    """Every message now in the stream, via a non-durable reader. (Of an open ledger,
    readers see entries up to the LAC: close the producer first to see them all.)"""
    reader = await client.create_reader(stream, EARLIEST)
    messages = []
    while await reader.has_message_available():
        messages.append(await reader.read_next(timeout=30))
    await reader.close()
    return messages


async def test_two_writers_duel_without_losing_an_acknowledged_message(any_cluster):
    any_cluster.start_bookies(3)
    clients = [await any_cluster.client(), await any_cluster.client()]
    acked: dict[int, list[bytes]] = {0: [], 1: []}
    fenced_sends = 0
    producer = await clients[0].create_producer("duel", batching_max_publish_delay_ms=0)
    for round_no in range(8):
        me = round_no % 2
        # A burst in flight while the other side takes over the stream.
        futures = [await producer.send_async(b"w%d-r%d-%d" % (me, round_no, i)) for i in range(30)]
        takeover = asyncio.ensure_future(
            clients[1 - me].create_producer("duel", batching_max_publish_delay_ms=0)
        )
        for i, future in enumerate(futures):
            try:
                # Every send gets an outcome (bounded wait: a hang fails here, not in CI's
                # global timeout): acknowledged, or fenced by the other writer.
                await asyncio.wait_for(future, 60)
                acked[me].append(b"w%d-r%d-%d" % (me, round_no, i))
            except StreamFencedError:
                fenced_sends += 1
        loser, producer = producer, await asyncio.wait_for(takeover, 60)
        with pytest.raises(StreamFencedError):
            await loser.send(b"from the fenced writer")
    await producer.close()  # the last writer seals its ledger: all of it is readable
    seen = [m.data for m in await read_all(clients[0], "duel")]
    assert len(seen) == len(set(seen)), "a message appears twice"
    for writer in (0, 1):
        mine = [d for d in seen if d.startswith(b"w%d-" % writer)]
        # every acknowledged message is there, in acknowledgement order
        assert [d for d in mine if d in acked[writer]] == acked[writer]
    assert sum(len(v) for v in acked.values()) + fenced_sends == 8 * 30


async def test_takeover_while_a_roll_is_in_flight_fences_both_ledgers(cluster):
    # The old writer is still writing to L1 while L2 was already added to the list
    # (a roll between its CAS and its close). A takeover must fence L1 too.
    cluster.start_bookies(3)
    a_client, b_client = await cluster.client(), await cluster.client()
    producer_a = await a_client.create_producer("rolling", batching_max_publish_delay_ms=0)
    first = [await producer_a.send(b"a-%d" % i) for i in range(5)]
    l1 = first[0].ledger_id
    registry = a_client.streams.registry
    l2 = await a_client.ledgers.create(3, 2, 2, custom_metadata={"stream": b"rolling"})
    md, version = await registry.read("rolling")
    md.ledgers.append(LedgerInfo(ledger_id=l2.ledger_id, created_time_ms=int(time.time() * 1000)))
    await registry.write("rolling", md, version)
    more = await producer_a.send(b"a-5")  # still flowing to L1 during the "roll"
    assert more.ledger_id == l1

    await b_client.create_producer("rolling")  # takeover: fences L1 AND L2
    l1_md = await b_client.ledgers.metadata(l1)
    assert l1_md.state is LedgerState.CLOSED and l1_md.last_entry_id == more.entry_id
    with pytest.raises(StreamFencedError):
        await producer_a.send(b"a-6")
    data = [m.data for m in await read_all(b_client, "rolling")]
    assert data == [b"a-%d" % i for i in range(6)]


async def test_rolling_by_entries_keeps_every_message_in_order(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("small", rollover={"max_entries": 4})
    producer = await client.create_producer("small", batching_max_publish_delay_ms=0)
    sent = [await producer.send(b"m-%02d" % i) for i in range(40)]
    await producer.close()
    # It rolled several times; sends kept flowing into the old ledger while each roll's
    # metadata update was in flight, so a ledger may hold a few more than 4 entries.
    assert len({m.ledger_id for m in sent}) >= 3
    assert sent == sorted(sent)
    assert [m.data for m in await read_all(client, "small")] == [b"m-%02d" % i for i in range(40)]
    stats = await client.streams.stats("small")
    assert stats["entries"] == 40 and len(stats["ledgers"]) >= 3


async def test_an_idle_stream_rolls_by_age(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("aging", rollover={"max_age_ms": 200})
    producer = await client.create_producer("aging", batching_max_publish_delay_ms=0)
    first = await producer.send(b"only one")  # then nothing: no append triggers a roll

    async def rolled() -> bool:
        md, _ = await client.streams.read("aging")
        return len(md.ledgers) >= 2 and md.ledgers[0].entries == 1

    deadline = time.monotonic() + 30
    while not await rolled():  # bounded wait for a timer-driven roll
        assert time.monotonic() < deadline, "the idle stream never rolled by age"
        await asyncio.sleep(0.05)
    md, _ = await client.streams.read("aging")
    assert md.ledgers[0].ledger_id == first.ledger_id
    closed = await client.ledgers.metadata(first.ledger_id)
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 0
    later = await producer.send(b"after the roll")
    assert later.ledger_id == md.ledgers[-1].ledger_id > first.ledger_id
    await producer.close()


async def test_retention_never_deletes_what_a_durable_cursor_needs(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("kept", rollover={"max_entries": 3}, retention={"time_ms": 1})
    slow = await client.subscribe("kept", "slow", initial_position="earliest")
    fast = await client.subscribe("kept", "fast", initial_position="earliest")
    producer = await client.create_producer("kept", batching_max_publish_delay_ms=0)
    sent = []
    while len({m.ledger_id for m in sent}) < 4 and len(sent) < 300:  # rolled 3 times
        sent.append(await producer.send(b"%d" % len(sent)))
    await producer.close()
    ledgers = sorted({m.ledger_id for m in sent})
    assert len(ledgers) >= 3
    for _ in range(len(sent)):
        fast.acknowledge(await fast.receive(timeout=30))
    await fast.persist()
    await slow.persist()  # still at EARLIEST: it needs everything
    far_future = int(time.time() * 1000) + 10**9
    assert await client.streams.trim("kept", now=far_future) == []
    # The slow consumer consumes the first two ledgers and one message of the third.
    upto = next(i for i, m in enumerate(sent) if m.ledger_id == ledgers[2])
    for _ in range(upto + 1):
        slow.acknowledge(await slow.receive(timeout=30))
    await slow.persist()
    assert (await slow_mark(client)) == sent[upto]
    # Exactly the ledgers before the slowest cursor's ledger go; never the current one.
    assert await client.streams.trim("kept", now=far_future) == ledgers[:2]
    md, _ = await client.streams.read("kept")
    assert [i.ledger_id for i in md.ledgers] == ledgers[2:]
    assert not set(ledgers[:2]) & set(await client.ledgers.list())
    kept = [m.data for m in await read_all(client, "kept")]
    assert kept == [b"%d" % i for i, m in enumerate(sent) if m.ledger_id >= ledgers[2]]


async def slow_mark(client):
    return (await client.streams.cursors("kept"))["slow"]


async def test_acknowledge_cumulative_negative_ack_and_seek(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("acks", batching_max_messages=3)
    for i in range(9):
        await producer.send_async(b"%d" % i)
    await producer.flush()
    consumer = await client.subscribe(
        "acks", "s", initial_position="earliest", negative_ack_redelivery_delay_ms=10
    )
    got = [await consumer.receive(timeout=30) for _ in range(4)]
    assert [m.data for m in got] == [b"0", b"1", b"2", b"3"]
    # Batches of at most 3 (the first message went alone: nothing was in flight).
    assert all(m.message_id.batch_index < 3 for m in got)
    assert got[2].message_id < got[3].message_id
    consumer.acknowledge_cumulative(got[2])
    assert consumer.mark_delete_position == got[2].message_id
    consumer.negative_acknowledge(got[3])
    # It comes back after its delay (messages already queued may come first).
    later = [await consumer.receive(timeout=30) for _ in range(6)]
    again = [m for m in later if m.data == b"3"]
    assert len(again) == 1 and again[0].redelivery_count == 1
    assert [m.data for m in later if m.data != b"3"] == [b"%d" % i for i in range(4, 9)]
    # seek by id: message 1 comes next
    await consumer.seek(got[1].message_id)
    assert (await consumer.receive(timeout=30)).data == b"1"
    # seek by time: everything was published after t0
    await consumer.seek(0)
    assert (await consumer.receive(timeout=30)).data == b"0"


async def test_a_redelivery_acknowledged_meanwhile_and_a_receive_across_a_seek(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("again", batching_max_messages=1)
    for i in range(3):
        await producer.send(b"%d" % i)
    consumer = await client.subscribe("again", "s", initial_position="earliest", ack_timeout_ms=20)
    first = await consumer.receive(timeout=30)
    # Left unacknowledged, it times out and is queued for redelivery ...
    for _ in range(3000):  # bounded: the ack-timeout task runs every 10 ms
        if consumer._source._redeliver:
            break
        await asyncio.sleep(0.01)
    assert [m.data for m in consumer._source._redeliver] == [b"0"]
    # ... but acknowledged before it comes again: it does not come again.
    consumer.acknowledge(first)
    assert (await consumer.receive(timeout=30)).data == b"1"
    await consumer.close()

    # A receive waiting at the end of the stream gets the first message of a seek made
    # meanwhile (the seek restarts the reading for it).
    tail = await client.subscribe("again", "t", initial_position="latest")
    waiting = asyncio.ensure_future(tail.receive(timeout=30))
    await asyncio.sleep(0)  # it is waiting now
    assert not waiting.done()
    await tail.seek(MessageId(0, 0, 0))
    assert (await waiting).data == b"0"
    await tail.close()


async def test_tailing_consumer_waits_on_the_long_poll(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("tail", batching_max_publish_delay_ms=0)
    consumer = await client.subscribe("tail", "t", initial_position="latest")
    received = []

    async def consume() -> None:
        for _ in range(5):
            message = await consumer.receive(timeout=30)
            received.append(message.data)
            consumer.acknowledge(message)

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0)  # let the consumer start waiting before anything is sent
    for i in range(5):
        await producer.send(b"live-%d" % i)
    await asyncio.wait_for(task, 30)
    assert received == [b"live-%d" % i for i in range(5)]
    # It waited on the bookies' long poll: a handful of polls for five sends one by
    # one, not a spin (each poll returns as soon as the LAC moves).
    assert 1 <= consumer._source._scanner.long_polls <= 15


async def test_bad_input_gets_typed_errors(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    with pytest.raises(NoSuchStreamError):
        await client.subscribe("no-such-stream", "s")
    with pytest.raises(NoSuchStreamError):
        await client.create_reader("no-such-stream")
    with pytest.raises(InvalidPositionError):
        await client.create_reader("no-such-stream", b"garbage")
    producer = await client.create_producer("errors")
    with pytest.raises(TooLargeError):
        await producer.send(b"x" * (6 * 1024 * 1024))
    with pytest.raises(TooLargeError):  # the key and properties count too
        await producer.send(b"x" * (5 * 1024 * 1024 - 100), properties={"p": "v" * 200})
    for event_time in (2**63, float("inf"), float("nan"), -1, dt.datetime(1960, 1, 1)):
        with pytest.raises(BadRequestError):  # refused at the send, not in its batch
            await producer.send_async(b"x", event_time=event_time)
    kept = await producer.send_async(b"sent alone")
    # A bad option is refused before the new producer takes the stream over.
    with pytest.raises(BadRequestError):
        await client.create_producer("errors", batch_format=7)
    assert (await kept).ledger_id > 0
    assert (await producer.send(b"fine")).ledger_id > 0  # the producer still works


@pytest.mark.parametrize("batch_format", [2, 1])
async def test_keys_properties_and_times_reach_readers_and_consumers(cluster, batch_format):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer(
        "fields", batching_max_publish_delay_ms=50, batch_format=batch_format
    )
    sent = [
        (b"first", None, {}, 0),  # goes at once (nothing in flight); the rest gather
        (b"plain", None, {}, 0),
        (b"keyed", "k1", {}, 0),
        (b"empty key", "", {"a": "1", "b": "2"}, 1_700_000_000_123),
        (b"", None, {}, 0),  # an empty payload is a message too
    ]
    futures = [
        await producer.send_async(data, key=key, properties=props, event_time=event or None)
        for data, key, props, event in sent
    ]
    ids = [await f for f in futures]
    assert len({(i.ledger_id, i.entry_id) for i in ids[1:]}) == 1  # one batch, one entry
    await producer.close()

    def seen(messages):
        return [(m.data, m.key, m.properties, m.event_time_ms) for m in messages]

    messages = await read_all(client, "fields")
    assert seen(messages) == sent
    assert [m.message_id for m in messages] == ids
    assert all(m.publish_time_ms > 0 for m in messages)
    consumer = await client.subscribe("fields", "sub", initial_position="earliest")
    received = [await consumer.receive(timeout=30) for _ in sent]
    assert seen(received) == sent
    await consumer.close()


CONSUMER_SCRIPT = r"""
import sys, streamlib
client = streamlib.connect(sys.argv[1], session_timeout_s=2)
consumer = client.subscribe("crash", "sub", initial_position="earliest", consumer_type="failover")
for i in range(10):
    message = consumer.receive(timeout=30)
    if i % 2 == 0:
        consumer.acknowledge(message)
consumer.persist()
print("persisted", flush=True)
sys.stdin.readline()  # wait to be killed
"""


async def test_consumer_sigkill_and_restart_redelivers_only_unacknowledged(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("crash", batching_max_messages=4)
    for i in range(10):
        await producer.send_async(b"%d" % i)
    await producer.flush()
    async with script_process(CONSUMER_SCRIPT, cluster.metadata_uri, ready="persisted") as proc:
        proc.kill()
        proc.wait(timeout=30)
    # A failover standby: active once the killed consumer's session ends (2 s).
    consumer = await client.subscribe("crash", "sub", consumer_type="failover")
    again = [(await consumer.receive(timeout=30)).data for _ in range(5)]
    assert again == [b"1", b"3", b"5", b"7", b"9"]
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.5)  # nothing else: the acknowledged stay gone


async def test_message_ids_serialise_and_the_reader_starts_after_one(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    producer = await client.create_producer("ids", batching_max_publish_delay_ms=0)
    ids = [await producer.send(b"%d" % i) for i in range(4)]
    start = MessageId.from_bytes(ids[1].to_bytes())
    reader = await client.create_reader("ids", start)
    assert (await reader.read_next(timeout=30)).data == b"2"
    reader2 = await client.create_reader("ids", str(ids[2]))
    assert (await reader2.read_next(timeout=30)).data == b"3"


async def test_a_cursor_moved_back_while_retention_plans_is_respected(cluster, monkeypatch):
    cluster.start_bookies(3)
    client = await cluster.client()
    # Retention after about 11 days: the trims a roll starts in the background delete
    # nothing (the consumer could be done before one of them reads the cursors); only
    # the trim below, dated far ahead, finds ledgers old enough.
    await client.streams.create("racy", rollover={"max_entries": 2}, retention={"time_ms": 10**9})
    consumer = await client.subscribe("racy", "s", initial_position="earliest")
    producer = await client.create_producer("racy", batching_max_publish_delay_ms=0)
    # Rolls run beside the sends: how many ledgers 9 sends make depends on the machine's
    # load. Send until there are at least three (bounded).
    sent = []
    while len(sent) < 9 or (
        len(sent) < 200 and len((await client.streams.read("racy"))[0].ledgers) < 3
    ):
        sent.append(await producer.send(b"%d" % len(sent)))
    await producer.close()
    for _ in sent:
        consumer.acknowledge(await consumer.receive(timeout=30))
    await consumer.close()  # persists: everything consumed, all but the current deletable
    md, _ = await client.streams.read("racy")
    before = [info.ledger_id for info in md.ledgers]
    assert len(before) >= 3
    # The interleaving under test: retention reads the cursors (all at the end), then an
    # admin moves the cursor back to EARLIEST before retention's CAS.
    manager = client.streams
    reset_cursor_once_cursors_are_read(monkeypatch, manager, "s")
    far_future = int(time.time() * 1000) + 10**10
    assert await manager.trim("racy", now=far_future) == []  # planned again: nothing goes
    md, _ = await client.streams.read("racy")
    assert [info.ledger_id for info in md.ledgers] == before
    again = await client.subscribe("racy", "s")
    assert [(await again.receive(timeout=30)).data for _ in sent] == [
        b"%d" % i for i in range(len(sent))
    ]


async def test_readers_catching_up_during_a_roll_never_fence_the_producer(cluster):
    # A roll between its CAS and its close: the list already names the next ledger while
    # the producer still writes the old one. Readers must wait for the writer's own
    # close, never recover (fence) the old ledger.
    cluster.start_bookies(3)
    client, other = await cluster.client(), await cluster.client()
    producer = await client.create_producer("rolling", batching_max_publish_delay_ms=0)
    sent = [b"before-%d" % i for i in range(5)]
    for data in sent:
        await producer.send(data)
    md, version = await client.streams.read("rolling")
    next_ledger = await client.ledgers.create(3, 2, 2, password=b"")
    md.ledgers.append(LedgerInfo(ledger_id=next_ledger.ledger_id, created_time_ms=1))
    await client.streams.registry.write("rolling", md, version)  # the roll's CAS, no close yet
    reader = await other.create_reader("rolling", EARLIEST)
    consumer = await other.subscribe("rolling", "s", initial_position="earliest")
    got = [(await reader.read_next(timeout=30)).data for _ in range(5)]
    got_c = [(await consumer.receive(timeout=30)).data for _ in range(5)]
    assert got == got_c == sent
    for i in range(5):  # the old ledger is not fenced: its writer goes on
        sent.append(b"during-%d" % i)
        await producer.send(sent[-1])
    first_ledger = md.ledgers[-2].ledger_id
    assert (await client.ledgers.metadata(first_ledger)).state is LedgerState.OPEN
    got += [(await reader.read_next(timeout=30)).data for _ in range(5)]
    assert got == sent
    await producer.close()  # the writer's own close: readers move on past it
    batch = BatchBuilder()
    batch.add(b"after", 1)
    await next_ledger.append(batch.encode())
    assert (await reader.read_next(timeout=30)).data == b"after"
    assert (await consumer.receive(timeout=30)).data == b"during-0"


async def test_a_producer_stays_live_after_its_ledger_ran_out_of_bookies(cluster):
    # E = Qw = Qa = 3 on three bookies: one SIGKILL leaves the ledger's writer no
    # replacement (it fails). Once the bookie is back, the next sends must go through
    # (the stream writer closes that ledger at its LAC and rolls to a new one), without
    # recreating the producer.
    bookies = cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("live", 3, 3, 3)
    producer = await client.create_producer("live", batching_max_publish_delay_ms=0)
    acked = [b"before-%d" % i for i in range(3)]
    for data in acked:
        await producer.send(data)
    bookies[0].kill()
    with pytest.raises(StreamlibError):
        await asyncio.wait_for(producer.send(b"while down"), 60)
    bookies[0].start()
    for i in range(5):
        acked.append(b"after-%d" % i)
        await asyncio.wait_for(producer.send(acked[-1]), 60)
    await producer.close()
    assert [m.data for m in await read_all(client, "live")] == acked
    md, _ = await client.streams.read("live")
    assert len(md.ledgers) >= 2  # the failed ledger was closed and a new one added
