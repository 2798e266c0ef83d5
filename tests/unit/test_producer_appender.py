"""The producer over an Appender (streamlib/stream/producer.py), with a fake appender:
what it answers each send with -- in particular a resend, and an entry its transport
says was stored before where nobody remembers (EARLIEST)."""

from __future__ import annotations

import asyncio

from streamlib.stream.batch import decode_batch
from streamlib.stream.positions import EARLIEST, MessageId
from streamlib.stream.producer import Producer


class Appender:
    """Stores entries in a list; `answer` overrides the position it gives back."""

    name = "s"

    def __init__(self) -> None:
        self.entries: list[tuple[bytes, int, int, int]] = []
        self.answer: tuple[int, int] | None = None

    def append_entry(
        self, entry: bytes, first: int, last: int, messages: int
    ) -> asyncio.Future[tuple[int, int]]:
        self.entries.append((entry, first, last, messages))
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        future.set_result(self.answer or (7, len(self.entries) - 1))
        return future

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_each_entry_carries_its_sequence_ids_and_a_resend_stores_nothing() -> None:
    appender = Appender()
    producer = Producer(appender, producer_name="p")
    first = [await producer.send_async(b"%d" % i) for i in range(3)]
    await producer.flush()
    ids = [f.result() for f in first]
    assert [(a, b, n) for _, a, b, n in appender.entries] == [(0, 0, 1), (1, 2, 2)]
    assert decode_batch(appender.entries[1][0], "x").producers == ["p", "p"]
    stored = len(appender.entries)
    assert await producer.send(b"again", sequence_id=1) == ids[1]
    assert len(appender.entries) == stored  # (answered from what it remembers)
    assert producer.duplicates == 1


async def test_an_entry_answered_as_stored_where_nobody_remembers_is_at_earliest() -> None:
    """A broker answers a resend whose original it no longer remembers with EARLIEST's
    ledger and entry: each of its messages is then at EARLIEST, not at (-1, -1, index) --
    an id no stream holds, which the chaos verdict took for a misplaced message."""
    appender = Appender()
    appender.answer = (EARLIEST.ledger_id, EARLIEST.entry_id)
    producer = Producer(appender, producer_name="p", batching_max_publish_delay_ms=50)
    futures = [await producer.send_async(b"%d" % i) for i in range(3)]
    await producer.flush()
    assert {f.result() for f in futures} == {EARLIEST}
    assert MessageId(-1, -1, 1) not in {f.result() for f in futures}
