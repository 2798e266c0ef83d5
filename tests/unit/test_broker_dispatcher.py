"""The broker's SubscriptionDispatcher against a stand-in for its direct consumer (this
layer alone): entries handed out whole, acknowledged by message (batch-index acks) into
cursor ranges, negative acks and a consumer leaving hand out only what is not
acknowledged, key_shared splits an entry by key, and what it passes on to the cursor
around a seek."""

from __future__ import annotations

import asyncio

from streamlib.broker.dispatcher import Handed, SubscriptionDispatcher
from streamlib.broker.sessions import ConsumerSession
from streamlib.protocol.dispatch import Kind
from streamlib.stream.batch import BatchBuilder, metadata_of
from streamlib.stream.message import EntryMessages, entry_messages
from streamlib.stream.positions import MessageId


def entry(entry_id: int, keys: list[str | None] | None = None) -> EntryMessages:
    """An entry of len(keys) messages (one without keys)."""
    builder = BatchBuilder()
    for i, key in enumerate(keys or [None]):
        builder.add(b"m%d" % i, 1, metadata=metadata_of(key, None))
    made = entry_messages("s", 1, entry_id, builder.encode(), MessageId(1, entry_id - 1, -1))
    assert made is not None
    return made


class Source:
    """What the dispatcher takes entries from (a DirectSubscription's part)."""

    def __init__(self, entries: list[EntryMessages]) -> None:
        self.ready = list(entries)
        self.wake = asyncio.Event()
        self.ranges: list[tuple[MessageId, MessageId]] = []

    def take_entry(self) -> tuple[EntryMessages, list[int]] | None:
        if not self.ready:
            return None
        taken = self.ready.pop(0)
        return taken, list(range(len(taken.payloads)))

    async def prepare(self) -> None:
        pass

    def acknowledge_range(self, lower: MessageId, upper: MessageId) -> None:
        self.ranges.append((lower, upper))


class Inner:
    """What the dispatcher uses of a direct consumer; its seek waits to be let go."""

    subscription = "s"

    def __init__(self, entries: list[EntryMessages]) -> None:
        self.source = Source(entries)
        self.seeking = asyncio.Event()
        self.release = asyncio.Event()
        self.closed = asyncio.Event()

    async def seek(self, target: MessageId) -> None:
        self.seeking.set()
        await self.release.wait()

    async def close(self) -> None:
        self.closed.set()


def dispatcher_of(entries: list[EntryMessages], kind: Kind = Kind.SHARED) -> SubscriptionDispatcher:
    return SubscriptionDispatcher(Inner(entries), kind, 0.0)  # type: ignore[arg-type]


def consumer(dispatcher: SubscriptionDispatcher, cid: int, permits: int = 100) -> ConsumerSession:
    session = ConsumerSession(cid, f"c{cid}", dispatcher.dispatch.kind)
    dispatcher.add(session)
    dispatcher.flow(cid, permits)
    return session


async def handed(session: ConsumerSession) -> list[Handed]:
    item = await asyncio.wait_for(session.outbox.get(), 5)
    assert isinstance(item, list)
    return item


def ranges(dispatcher: SubscriptionDispatcher) -> list[tuple[MessageId, MessageId]]:
    return dispatcher.inner.source.ranges  # type: ignore[attr-defined,no-any-return]


async def test_an_ack_that_arrives_while_the_cursor_moves_is_not_applied_after_it() -> None:
    """An ack of a message delivered before a seek, arriving while the seek runs, must
    not reach the moved cursor: that message comes again after the seek (an ack applied
    there would skip it for good)."""
    dispatcher = dispatcher_of([entry(i) for i in range(3)])
    inner: Inner = dispatcher.inner  # type: ignore[assignment]
    session = consumer(dispatcher, 1, 10)
    delivered = await handed(session)
    assert [h.entry.entry_id for h in delivered] == [0, 1, 2]
    seek = asyncio.get_running_loop().create_task(dispatcher.seek(MessageId(1, 0, 0)))
    await asyncio.wait_for(inner.seeking.wait(), 5)
    dispatcher.ack(1, [(1, 2, [0])])  # late, from before
    inner.release.set()
    await asyncio.wait_for(seek, 5)
    assert ranges(dispatcher) == []
    await dispatcher.close()


async def test_a_close_cancelled_while_reading_stops_still_closes_the_direct_consumer() -> None:
    """The broker closes a subscription's dispatcher when its last consumer leaves, in
    the finally of that consumer's RPC, which grpc cancels when the client goes: the
    cancellation must not cut the close off before the direct consumer is closed (it
    would hold the subscription, and the next dispatcher would wait behind it)."""
    dispatcher = dispatcher_of([])
    inner: Inner = dispatcher.inner  # type: ignore[assignment]
    closing = asyncio.get_running_loop().create_task(dispatcher.close())
    await asyncio.sleep(0)  # (one turn of the loop: the close has begun, and waits)
    assert not closing.done()
    closing.cancel()
    try:
        await closing
    except asyncio.CancelledError:
        pass
    await asyncio.wait_for(inner.closed.wait(), 5)  # the close went on to its end
    await asyncio.wait_for(dispatcher.close(), 5)  # (again: waits for the same close)


async def test_an_entry_goes_whole_and_leaves_its_consumer_when_all_its_messages_are_acked() -> (
    None
):
    dispatcher = dispatcher_of([entry(5, [None, None, None])])
    session = consumer(dispatcher, 1)
    [one] = await handed(session)
    assert one.whole and one.indexes == [0, 1, 2]
    assert dispatcher.dispatch._consumers[1].permits == 97  # (three messages' permits)
    dispatcher.ack(1, [(1, 5, [0, 2])])
    assert ranges(dispatcher) == [
        (MessageId(1, 4, -1), MessageId(1, 5, 0)),
        (MessageId(1, 5, 1), MessageId(1, 5, 2)),
    ]
    assert len(dispatcher.dispatch.unacked_of(1)) == 1  # (message 1 is still out)
    dispatcher.ack(1, [(1, 5, [1]), (1, 5, [1]), (1, 9, [0])])  # (again, and unknown: no-ops)
    assert ranges(dispatcher)[2:] == [(MessageId(1, 5, 0), MessageId(1, 5, 1))]
    assert dispatcher.dispatch.unacked_of(1) == []
    await dispatcher.close()


async def test_negative_acks_and_a_leaving_consumer_hand_out_only_what_is_not_acked() -> None:
    dispatcher = dispatcher_of([entry(1, [None] * 4)])
    first = consumer(dispatcher, 1)
    await handed(first)
    dispatcher.ack(1, [(1, 1, [0])])
    dispatcher.nack(1, [(1, 1, [1])])
    [again] = await handed(first)  # (the delay is 0 here)
    assert again.indexes == [1] and again.redeliveries == 1 and not again.whole
    second = consumer(dispatcher, 2, permits=3)
    dispatcher.remove(1)  # holds 1 (again) and 2, 3 (the first time)
    got = await handed(second)
    assert sorted((h.indexes, h.redeliveries) for h in got) == [([1], 2), ([2, 3], 1)]
    # Charged what it got (3 messages), not what the entry held (4): no permit owed.
    assert dispatcher.dispatch._consumers[2].permits == 0
    assert dispatcher.dispatch._consumers[2].unacked_count == 3
    dispatcher.ack_cumulative(2, MessageId(1, 1, 2))  # (its own, up to 2)
    assert [p.ref.indexes for p in dispatcher.dispatch.unacked_of(2)] == [[3]]
    await dispatcher.close()


async def test_key_shared_splits_an_entry_by_key_and_never_a_key() -> None:
    keys = [f"k{i % 7}" for i in range(40)]
    dispatcher = dispatcher_of([entry(1, keys), entry(2, keys)], Kind.KEY_SHARED)
    sessions = [consumer(dispatcher, cid, 1000) for cid in (1, 2, 3)]
    holders: dict[str, set[int]] = {}
    total = 0
    for _ in range(1000):  # (bounded: turns of the loop, not time)
        if total == 80:
            break
        for cid, session in enumerate(sessions, 1):
            while not session.outbox.empty():
                got = await handed(session)
                # (an entry once per consumer, however many of its slots are that one's)
                assert len({(h.entry.entry_id, h.redeliveries) for h in got}) == len(got)
                for one in got:
                    assert not one.whole  # (mixed keys: split)
                    for index in one.indexes:
                        holders.setdefault(keys[index], set()).add(cid)
                        total += 1
        await asyncio.sleep(0)  # (a turn of the loop: the dispatcher delivers)
    assert total == 80 and all(len(cids) == 1 for cids in holders.values())
    assert len({cid for cids in holders.values() for cid in cids}) > 1
    await dispatcher.close()
