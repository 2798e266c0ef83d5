"""One Session call carrying many producers and consumers (broker.proto's Session, served
by streamlib/broker/mux.py; the client's side is streamlib/service/connection.py's Mux),
on real processes: handles answered by number, a bad handle failing alone, a handle's
half-close ending it alone, the cap on handles per call, and the client library holding
one call per broker for all its producers and consumers."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from streamlib.wire import broker_pb2 as pb
from streamlib.wire import broker_pb2_grpc as pb_grpc
from tests.integration.test_broker import raw_entries

pytestmark = pytest.mark.timeout(120)


class RawSession:
    """A Session call driven by hand: parts out, answers gathered by handle."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.call = pb_grpc.BrokerStub(self.channel).Session()
        self.answers: dict[int, list[tuple[str, object]]] = {}
        self.responses: list[pb.SessionResponse] = []

    async def send(self, *parts: pb.SessionPart) -> None:
        await self.call.write(pb.SessionRequest(parts=parts))

    async def until(self, handle: int, kind: str, count: int = 1) -> list[object]:
        """Read (bounded) until `handle` has `count` answers of `kind` (produce,
        consume, end); those answers."""

        def have() -> list[object]:
            return [a for k, a in self.answers.get(handle, []) if k == kind]

        async with asyncio.timeout(30):
            while len(have()) < count:
                response = await self.call.read()
                assert response is not grpc.aio.EOF, "the broker ended the session call"
                self.responses.append(response)
                for part in response.parts:
                    which = part.WhichOneof("kind")
                    self.answers.setdefault(part.handle, []).append((which, getattr(part, which)))
        return have()

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


def produce_open(handle: int, stream: str, name: str) -> pb.SessionPart:
    opened = pb.ProducerOpen(stream=stream, producer_name=name)
    return pb.SessionPart(handle=handle, produce=pb.ProduceRequest(open=opened))


def consume_open(handle: int, stream: str, subscription: str) -> pb.SessionPart:
    opened = pb.ConsumerOpen(stream=stream, subscription=subscription, consumer_type="shared",
                             initial_position="earliest", protocol_version=2)  # fmt: skip
    return pb.SessionPart(handle=handle, consume=pb.ConsumeRequest(open=opened))


async def test_handles_of_one_call_publish_and_consume_side_by_side(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    session = RawSession(broker.address)
    try:
        await session.send(produce_open(1, "s-a", "pa"), produce_open(2, "s-b", "pb"))
        [ready_a] = await session.until(1, "produce")
        [ready_b] = await session.until(2, "produce")
        assert ready_a.WhichOneof("kind") == ready_b.WhichOneof("kind") == "ready"
        # Both handles' entries in one gRPC message, each answered on its own handle.
        await session.send(
            pb.SessionPart(handle=1, produce=raw_entries("pa", (0, b"a0"), (1, b"a1"))),
            pb.SessionPart(handle=2, produce=raw_entries("pb", (0, b"b0"))),
        )
        receipts_a = await session.until(1, "produce", 2)
        receipts_b = await session.until(2, "produce", 2)
        assert [r.sequence_id for r in receipts_a[1].receipts.receipts] == [0, 1]
        assert [r.sequence_id for r in receipts_b[1].receipts.receipts] == [0]
        await session.send(consume_open(3, "s-a", "sub"))
        [ready] = await session.until(3, "consume")
        assert ready.WhichOneof("kind") == "ready"
        await session.send(
            pb.SessionPart(handle=3, consume=pb.ConsumeRequest(flow=pb.Flow(permits=10)))
        )
        delivered = await session.until(3, "consume", 2)
        assert delivered[1].WhichOneof("kind") == "entries"
        assert len(delivered[1].entries.entries) >= 1
    finally:
        await session.close()


async def test_a_bad_handle_fails_alone_and_a_half_closed_one_ends_alone(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1)
    session = RawSession(broker.address)
    try:
        await session.send(produce_open(1, "s-bad", "p1"), produce_open(2, "s-bad", "p2"))
        await session.until(1, "produce")
        await session.until(2, "produce")
        # A consumer's request on a producer's handle: that handle is refused and ends.
        flow = pb.ConsumeRequest(flow=pb.Flow(permits=1))
        await session.send(pb.SessionPart(handle=1, consume=flow))
        answers = await session.until(1, "produce", 2)
        assert answers[1].error.code == "BadRequestError"
        await session.until(1, "end")
        # An open that is not one: refused on its handle.
        await session.send(pb.SessionPart(handle=4, produce=raw_entries("p4", (0, b"x"))))
        [refused] = await session.until(4, "produce")
        assert refused.error.code == "BadRequestError"
        # Handle 2 goes on, then half-closes: it ends, and the call goes on.
        await session.send(pb.SessionPart(handle=2, produce=raw_entries("p2", (0, b"y"))))
        receipts = await session.until(2, "produce", 2)
        assert [r.sequence_id for r in receipts[1].receipts.receipts] == [0]
        await session.send(pb.SessionPart(handle=2, end=True))
        await session.until(2, "end")
        await session.send(produce_open(5, "s-bad", "p5"))
        [ready] = await session.until(5, "produce")
        assert ready.WhichOneof("kind") == "ready"
    finally:
        await session.close()


async def test_a_call_holds_at_most_its_principals_sessions(cluster):
    cluster.start_bookies(3)
    [broker] = cluster.start_brokers(1, extra=["--max-sessions-per-principal", "2"])
    session = RawSession(broker.address)
    try:
        await session.send(*(produce_open(h, f"s-cap-{h}", f"p{h}") for h in (1, 2, 3)))
        kinds = {}
        for handle in (1, 2, 3):
            [first] = await session.until(handle, "produce")
            kinds[handle] = first.WhichOneof("kind")
        assert sorted(kinds.values()) == ["error", "ready", "ready"]
        [refused] = [h for h, k in kinds.items() if k == "error"]
        await session.until(refused, "end")
        # A handle given back makes room on the same call.
        [held, _] = [h for h in (1, 2, 3) if h != refused]
        await session.send(pb.SessionPart(handle=held, cancel=True))
        await session.until(held, "end")
        async with asyncio.timeout(30):
            while True:  # (the broker gives the session back as the handle's end runs)
                await session.send(produce_open(9, "s-cap-9", "p9"))
                [first, *_] = await session.until(9, "produce")
                if first.WhichOneof("kind") == "ready":
                    break
                assert first.error.code == "TooManySessionsError"
                await session.until(9, "end")
                session.answers.pop(9)
    finally:
        await session.close()


async def test_the_client_carries_its_producers_and_consumers_to_a_broker_on_one_call(cluster):
    cluster.start_bookies(3)
    cluster.start_brokers(1)
    client = await cluster.service_client()
    names = [f"one-call-{i}" for i in range(6)]
    producers = [await client.create_producer(name) for name in names]
    consumers = [await client.subscribe(name, "s", "earliest") for name in names]
    brokers = client.brokers
    assert len(brokers._muxes) == 1  # one broker: one Session call for all twelve
    [mux] = brokers._muxes.values()
    assert len(mux._calls) == 12
    await asyncio.gather(
        *(p.send(b"to %s" % n.encode()) for p, n in zip(producers, names, strict=True))
    )
    for consumer, name in zip(consumers, names, strict=True):
        message = await consumer.receive(timeout=30)
        assert message.data == b"to %s" % name.encode()
        consumer.acknowledge(message)
    for one in (*producers, *consumers):
        await one.close()
    assert mux._calls == {}  # each closed handle ended; the call stays for the next
    again = await client.create_producer(names[0])
    assert brokers._muxes[next(iter(brokers._muxes))] is mux
    await again.close()
