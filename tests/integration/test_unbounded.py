"""Unbounded ledgers (term mode) on real bookies: takeover ping-pong between two writers."""

import asyncio
import time

import pytest

from streamlib.errors import BadRequestError, InvalidTermError
from streamlib.stream.positions import EARLIEST
from streamlib.stream.writer import now_ms
from tests.integration.conftest import reset_cursor_once_cursors_are_read


async def test_takeover_ping_pong_loses_and_duplicates_nothing(any_cluster):
    any_cluster.start_bookies(3)
    clients = [await any_cluster.client(), await any_cluster.client()]
    first = await clients[0].ledgers.create(3, 3, 2, password=b"pw", unbounded=True)
    ledger_id = first.ledger_id
    writers = [first, None]
    acked: list[tuple[int, bytes]] = []
    for term_round in range(8):
        me = term_round % 2
        if term_round:
            writers[me] = await clients[me].ledgers.take_over(ledger_id, password=b"pw")
        writer = writers[me]
        # A burst in flight, some of it maybe racing the next takeover.
        datas = [b"r%d-%d" % (term_round, i) for i in range(15)]
        ids = await writer.append_many(datas)
        acked += list(zip(ids, datas, strict=True))
        old = writers[1 - me]
        if old is not None:
            with pytest.raises(InvalidTermError):
                await old.append(b"from the old term")
    metadata = await clients[0].ledgers.metadata(ledger_id)
    assert metadata.term == 8 and metadata.unbounded
    reader = await clients[1].ledgers.open(ledger_id, password=b"pw", recover=False)
    last_id = acked[-1][0]
    for _ in range(20):  # the last entry's LAC comes with the writer's explicit LAC
        if reader.last_add_confirmed >= last_id:
            break
        await reader.wait_for_more(reader.last_add_confirmed + 1, 5.0)
    assert reader.last_add_confirmed >= last_id
    entries = await reader.read_entries(0, last_id)
    data = {e.entry_id: e.payload for e in entries if not e.flags & 2}
    assert {i: d for i, d in acked} == {i: data[i] for i, _ in acked}
    assert len(data) == len(acked)  # nothing else: the no-ops are not data
    payloads = await reader.read(0, last_id)
    assert payloads == [d for _, d in sorted(acked)]


async def test_unbounded_ledgers_are_taken_over_not_recovered(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 2, 2, unbounded=True)
    await writer.append(b"x")
    with pytest.raises(BadRequestError):
        await client.ledgers.open(writer.ledger_id)  # recover=True would close it
    bounded = await client.ledgers.create(3, 2, 2)
    with pytest.raises(BadRequestError):
        await client.ledgers.take_over(bounded.ledger_id)


async def test_pubsub_works_unchanged_on_an_unbounded_stream(cluster):
    cluster.start_bookies(3)
    a, b = await cluster.client(), await cluster.client()
    await a.streams.create("one-ledger", 3, 3, 2, mode="unbounded")
    consumer = await b.subscribe("one-ledger", "s", initial_position="earliest")
    sent = []
    for round_no in range(4):  # producers take the stream over from each other, by term
        producer = await (a if round_no % 2 == 0 else b).create_producer(
            "one-ledger", batching_max_messages=3
        )
        for i in range(7):
            sent.append(b"r%d-%d" % (round_no, i))
            await producer.send_async(sent[-1])
        await producer.flush()
        await producer.close()
    md, _ = await a.streams.read("one-ledger")
    assert len(md.ledgers) == 1  # one ledger, never rolled
    ledger = await a.ledgers.metadata(md.ledgers[0].ledger_id)
    assert ledger.unbounded and ledger.term == 4
    received = []
    for _ in range(len(sent)):
        message = await consumer.receive(timeout=30)
        received.append(message.data)
        consumer.acknowledge(message)
    assert received == sent  # no no-op ever shows up as a message
    reader = await a.create_reader("one-ledger")
    assert [(await reader.read_next(timeout=30)).data for _ in sent] == sent


async def test_an_unbounded_stream_rolls_fragments_not_ledgers(cluster):
    cluster.start_bookies(4)
    client = await cluster.client()
    await client.streams.create("rolling-one", 3, 2, 2, mode="unbounded",
                                rollover={"max_entries": 5})  # fmt: skip
    producer = await client.create_producer("rolling-one", batching_max_publish_delay_ms=0)
    sent = [await producer.send(b"%d" % i) for i in range(30)]
    await producer.close()
    assert len({m.ledger_id for m in sent}) == 1
    ledger = await client.ledgers.metadata(sent[0].ledger_id)
    assert len(ledger.fragments) >= 3  # rolled by size while sends kept flowing
    reader = await client.create_reader("rolling-one")
    received = [(await reader.read_next(timeout=30)).data for _ in sent]
    assert received == [b"%d" % i for i in range(30)]


async def test_a_stream_whose_fragments_retention_dropped_is_read_and_described(cluster):
    """Its writer gone and every fragment but the last dropped: a client that opens the
    ledger now reads its LAC from the last fragment alone (before, it also asked the
    holders of the entry before that fragment, which no fragment lists any more:
    BadRequestError "entry 9 precedes ledger 1's first fragment", and `admin streams
    list` failed on every stream)."""
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("trimmed", mode="unbounded", rollover={"max_entries": 2},
                                retention={"size_bytes": 1})  # fmt: skip
    producer = await client.create_producer("trimmed", batching_max_publish_delay_ms=0)
    sent = [await producer.send(b"m%d" % i) for i in range(12)]
    await producer.close()
    await client.streams.trim("trimmed")
    ledger = await client.ledgers.metadata(sent[0].ledger_id)
    assert len(ledger.fragments) == 1 and ledger.fragments[0].first_entry_id > 0
    fresh = await cluster.client()
    stats = await fresh.streams.stats("trimmed", count_messages=False)
    assert stats["ledgers"][0]["entries"] == sent[-1].entry_id + 1
    reader = await fresh.create_reader("trimmed", sent[-2])
    assert (await reader.read_next(timeout=30)).data == b"m11"


async def test_retention_bounds_the_fragment_list_of_a_long_running_unbounded_stream(cluster):
    bookies = cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("long-lived", 3, 2, 2, mode="unbounded",
                                rollover={"max_entries": 4}, retention={"time_ms": 1})  # fmt: skip
    consumer = await client.subscribe("long-lived", "s", initial_position="earliest")
    producer = await client.create_producer("long-lived", batching_max_publish_delay_ms=0)
    ledger_id = None
    sent: list[bytes] = []
    received: list[bytes] = []
    most_fragments = 0
    for cycle in range(12):
        for i in range(10):
            sent.append(b"c%d-%d" % (cycle, i))
            ledger_id = (await producer.send(sent[-1])).ledger_id
        for _ in range(10):  # the durable cursor consumes everything sent so far
            message = await consumer.receive(timeout=30)
            received.append(message.data)
            consumer.acknowledge(message)
        await consumer.persist()
        # (Also runs on every fragment roll.) Dated a second ahead: a fragment rolled in
        # the millisecond of the trim is past the 1 ms retention too, however the
        # machine's load spreads the sends and rolls.
        await client.streams.trim("long-lived", now=now_ms() + 1000)
        ledger = await client.ledgers.metadata(ledger_id)
        most_fragments = max(most_fragments, len(ledger.fragments))
        # Only fragments the cursor consumed went; the one it is in is still there.
        mark = (await client.streams.cursors("long-lived"))["s"]
        assert ledger.first_entry_id <= mark.entry_id
        assert ledger.fragments[0].first_entry_id == ledger.first_entry_id
    assert received == sent
    ledger = await client.ledgers.metadata(ledger_id)
    # 120 entries in fragments of about 4: without retention ~30 fragments would be listed.
    assert most_fragments <= 6, most_fragments
    assert ledger.first_entry_id >= 100
    # The bookies delete what the metadata no longer lists, and keep the rest.
    trimmed = [b.admin("POST", "/admin/gc")["trimmed"] for b in bookies]
    assert sum(t.get(str(ledger_id), 0) for t in trimmed) > 0
    # A non-durable reader from EARLIEST starts at the first retained entry. (Releasing
    # the stream publishes the LAC to every bookie: the reader sees up to the last send.)
    await producer.close()
    reader = await client.create_reader("long-lived")
    tail = []
    while await reader.has_message_available():
        tail.append((await reader.read_next(timeout=30)).data)
    assert tail and tail == sent[-len(tail) :]


async def test_a_cursor_moved_back_while_fragment_retention_plans_is_respected(
    cluster, monkeypatch
):
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("racy-one", 3, 2, 2, mode="unbounded",
                                rollover={"max_entries": 2}, retention={"time_ms": 1})  # fmt: skip
    consumer = await client.subscribe("racy-one", "s", initial_position="earliest")
    sent = []
    for _ in range(4):  # takeovers between rounds: fragments roll from an advanced LAC
        producer = await client.create_producer("racy-one", batching_max_publish_delay_ms=0)
        sent += [await producer.send(b"%d" % len(sent)) for _ in range(3)]
        await producer.close()
    for _ in sent:
        consumer.acknowledge(await consumer.receive(timeout=30))
    await consumer.close()
    ledger_id = sent[0].ledger_id
    fragments = (await client.ledgers.metadata(ledger_id)).fragments
    assert len(fragments) >= 3
    manager = client.streams
    reset_cursor_once_cursors_are_read(monkeypatch, manager, "s")
    far_future = int(time.time() * 1000) + 10**9
    assert await manager.trim_fragments("racy-one", now=far_future) == []
    assert (await client.ledgers.metadata(ledger_id)).fragments == fragments


async def test_a_pipelined_burst_rolls_fragments_as_the_lac_moves(cluster):
    cluster.start_bookies(3)
    client = await cluster.client()
    await client.streams.create("burst-one", 3, 2, 2, mode="unbounded",
                                rollover={"max_entries": 3})  # fmt: skip
    producer = await client.create_producer("burst-one", batching_max_messages=1)
    futures = [await producer.send_async(b"%d" % i) for i in range(12)]  # all in flight
    ids = await asyncio.gather(*futures)
    ledger_id = ids[0].ledger_id
    deadline = time.monotonic() + 30
    while True:  # the roll runs once acknowledgements pass the fragment's first entries
        fragments = (await client.ledgers.metadata(ledger_id)).fragments
        if len(fragments) >= 2:
            break
        assert time.monotonic() < deadline, f"no fragment rolled: {fragments}"
        await asyncio.sleep(0.05)
    assert fragments[1].first_entry_id > 0  # a new fragment, not the first one replaced
    await producer.close()


async def test_back_to_back_takeovers_never_turn_a_no_op_into_data(cluster):
    # The second takeover's recovery reads the first one's TRUNCATE no-op past the LAC
    # and writes it back: it must stay a no-op (and truncate nothing), never b"".
    cluster.start_bookies(3)
    client = await cluster.client()
    writer = await client.ledgers.create(3, 3, 2, password=b"pw", unbounded=True)
    await writer.append(b"A")
    await client.ledgers.take_over(writer.ledger_id, password=b"pw")
    last = await client.ledgers.take_over(writer.ledger_id, password=b"pw")
    entry_c = await last.append(b"C")
    await last.release()
    reader = await client.ledgers.open(writer.ledger_id, password=b"pw", recover=False)
    assert reader.last_add_confirmed >= entry_c
    assert await reader.read(0, entry_c) == [b"A", b"C"]
    noops = [e for e in await reader.read_entries(0, entry_c) if e.payload == b""]
    assert len(noops) == 2 and all(e.flags for e in noops)


async def test_tailing_consumers_follow_fragment_rolls_with_striped_write_sets(cluster):
    # Qw < E: each fragment roll moves the write sets. A consumer tailing the stream
    # learns the LAC from a long poll; it must read the new fragment's entries from the
    # new write sets (fresh metadata), not get NoSuchEntry from the old ones.
    cluster.start_bookies(5)
    client, other = await cluster.client(), await cluster.client()
    await client.streams.create("striped", 3, 2, 2, mode="unbounded",
                                rollover={"max_entries": 3})  # fmt: skip
    consumer = await other.subscribe("striped", "s", initial_position="earliest")
    reader = await other.create_reader("striped", EARLIEST)
    producer = await client.create_producer("striped", batching_max_publish_delay_ms=0)
    for i in range(40):
        await producer.send(b"m%d" % i)
        assert (await consumer.receive(timeout=30)).data == b"m%d" % i
        assert (await reader.read_next(timeout=30)).data == b"m%d" % i
    md, _ = await client.streams.read("striped")
    assert len((await client.ledgers.metadata(md.ledgers[0].ledger_id)).fragments) >= 5


async def test_a_reader_with_metadata_from_before_fragment_rolls_reads_the_new_fragments(cluster):
    cluster.start_bookies(5)
    client, other = await cluster.client(), await cluster.client()
    writer = await client.ledgers.create(3, 2, 2, unbounded=True)
    await writer.append_many([b"a%d" % i for i in range(3)])
    reader = await other.ledgers.open(writer.ledger_id, recover=False)
    expected = [b"a%d" % i for i in range(3)]
    for roll in range(4):  # fragments on bookies the reader's metadata does not name
        before = writer.metadata.last_fragment
        writer.roll_fragment()
        datas = [b"r%d-%d" % (roll, i) for i in range(6)]
        await writer.append_many(datas)  # held until the roll's CAS: in the new fragment
        assert writer.metadata.last_fragment.first_entry_id > before.first_entry_id
        expected += datas
    await writer.release()  # publishes the LAC
    for _ in range(10):
        if reader.last_add_confirmed >= len(expected) - 1:
            break
        await reader.wait_for_more(reader.last_add_confirmed + 1, 2.0)
    assert reader.last_add_confirmed == len(expected) - 1
    assert await reader.read(0, len(expected) - 1) == expected
