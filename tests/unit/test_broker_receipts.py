"""The broker's answers to a producer (this layer alone): receipts that queued up while
the broker was busy go out in one gRPC message, in order, and what follows them (a
failed send, the end of the session) is answered after them, never lost or reordered."""

from __future__ import annotations

import asyncio

from streamlib.broker import server
from streamlib.broker.server import _merged_receipts
from streamlib.wire import broker_pb2 as pb


def receipts(*sequence_ids: int) -> pb.ProduceResponse:
    batch = pb.ReceiptBatch()
    for sequence_id in sequence_ids:
        batch.receipts.add(sequence_id=sequence_id)
    return pb.ProduceResponse(receipts=batch)


def failed(*sequence_ids: int) -> pb.ProduceResponse:
    return pb.ProduceResponse(failed=pb.SendFailed(sequence_ids=list(sequence_ids)))


def ids(response: pb.ProduceResponse | None) -> tuple[str, list[int]] | None:
    if response is None:
        return None
    which = response.WhichOneof("kind")
    if which == "receipts":
        return which, [r.sequence_id for r in response.receipts.receipts]
    return which, list(response.failed.sequence_ids)


def answers(queue: asyncio.Queue[pb.ProduceResponse | None]) -> list[object]:
    """What the Produce loop answers for what is queued now, in order."""
    out: list[object] = []
    held: list[pb.ProduceResponse | None] = []
    while held or not queue.empty():
        response = held.pop() if held else queue.get_nowait()
        if response is None:
            out.append(None)
            break
        out.append(ids(_merged_receipts(response, queue, held)))
    return out


async def test_queued_receipts_go_out_together_in_order_and_what_follows_after_them() -> None:
    queue: asyncio.Queue[pb.ProduceResponse | None] = asyncio.Queue()
    for response in (receipts(1, 2), receipts(3), failed(4), receipts(5), receipts(6), None):
        queue.put_nowait(response)
    assert answers(queue) == [
        ("receipts", [1, 2, 3]),
        ("failed", [4]),
        ("receipts", [5, 6]),
        None,
    ]


async def test_one_answer_holds_at_most_its_bound(monkeypatch) -> None:
    monkeypatch.setattr(server, "MAX_RECEIPTS_PER_RESPONSE", 3)
    queue: asyncio.Queue[pb.ProduceResponse | None] = asyncio.Queue()
    for sequence_id in range(5):
        queue.put_nowait(receipts(sequence_id))
    assert answers(queue) == [("receipts", [0, 1, 2]), ("receipts", [3, 4])]
