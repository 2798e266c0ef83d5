"""The Pulsar front end's own decisions, one layer at a time (streamlib/broker/pulsar_server.py):
which ServerError a refusal is answered with, how an entry goes to a Pulsar consumer
(whole, or the part of it that is this consumer's, as a batch of its own), how acks name
the entry's messages, and what the last message id says. End to end with pulsar-client:
tests/integration/test_pulsar_*.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import _pulsar  # pulsar-client's C++ core: its own batch parser reads what we send
import pytest

from bookie.errors import UnauthenticatedError
from metadata.errors import InvalidNameError
from streamlib.broker.dispatcher import Handed
from streamlib.broker.ownership import NotOwnerError
from streamlib.broker.pulsar_server import (
    NONE_ID,
    _bit,
    _Consumer,
    _entry_of,
    last_index,
    message_frame,
    server_error,
)
from streamlib.broker.sessions import StreamGone
from streamlib.protocol.errors import (
    BadRequestError,
    ConsumerBusyError,
    NoSuchStreamError,
    ProducerBusyError,
    ProducerFencedError,
    TooManySessionsError,
    UnauthorizedError,
)
from streamlib.pulsar import PulsarApi_pb2 as api
from streamlib.pulsar import entries, schemas
from streamlib.stream.batch import BatchBuilder, decode_batch, metadata_of
from streamlib.stream.message import EntryMessages
from streamlib.stream.positions import EARLIEST, LATEST, MessageId


def exclusive_busy() -> ProducerBusyError:
    error = ProducerBusyError("stream 's' has an exclusive producer")
    error.exclusive = True  # type: ignore[attr-defined]
    return error


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UnauthenticatedError("no token", kind="none"), api.AuthenticationError),
        (UnauthorizedError("reader may not produce"), api.AuthorizationError),
        (ConsumerBusyError("exclusive"), api.ConsumerBusy),
        (ProducerBusyError("name in use"), api.ProducerBusy),
        (exclusive_busy(), api.ProducerFenced),
        (ProducerFencedError("fenced"), api.ProducerFenced),
        (NoSuchStreamError("none"), api.TopicNotFound),
        (InvalidNameError("bad name"), api.InvalidTopicName),
        (TooManySessionsError("limit"), api.TooManyRequests),
        (schemas.IncompatibleSchemaError("other schema"), api.IncompatibleSchema),
        (BadRequestError("bad"), api.NotAllowedError),
        (StreamGone("moved"), api.ServiceNotReady),
        (NotOwnerError("elsewhere"), api.ServiceNotReady),
        (OSError("metadata store down"), api.ServiceNotReady),
    ],
)
def test_refusals_are_answered_as_pulsar_names_them(error: Exception, code: int) -> None:
    assert server_error(error) == code


def test_message_ids_are_unsigned_on_the_wire() -> None:
    earliest = api.MessageIdData(ledgerId=NONE_ID, entryId=NONE_ID)
    assert _entry_of(earliest) == EARLIEST
    latest = api.MessageIdData(ledgerId=2**63 - 1, entryId=2**63 - 1)
    assert _entry_of(latest) == LATEST
    assert _entry_of(api.MessageIdData(ledgerId=7, entryId=3)) == MessageId(7, 3, 0)


def test_bitset_words_read_as_java_bitsets() -> None:
    words = [(1 << 63) - (1 << 64) + 0b101, 1]  # bits 0, 2, 63 and 64
    assert [i for i in range(130) if _bit(words, i)] == [0, 2, 63, 64]


def streamlib_entry(count: int, ledger_id: int = 5, entry_id: int = 9) -> EntryMessages:
    builder = BatchBuilder()
    for i in range(count):
        builder.add(
            b"m%d" % i, 1000 + i, 2000 + i, metadata_of(f"k{i % 2}", {"i": str(i)}), 0, i, "p"
        )
    raw = builder.encode()
    entry = EntryMessages(
        "s", ledger_id, entry_id, decode_batch(raw, "e", payloads=False), EARLIEST
    )
    entry.raw = raw
    return entry


def pulsar_messages(block: bytes) -> list[Any]:
    metadata, payload = entries.parse(block, "the frame")
    return list(
        _pulsar.MessageBatch().parse_from(bytes(payload), metadata.num_messages_in_batch).messages()
    )


def test_a_whole_entry_goes_as_stored_and_its_acks_name_every_message() -> None:
    entry = streamlib_entry(4)
    delivered: dict[tuple[int, int], Any] = {}
    command, block = message_frame(3, Handed(entry, [0, 1, 2, 3], 2), 1, delivered)
    assert command.message.consumer_id == 3
    assert command.message.redelivery_count == 2 and command.message.consumer_epoch == 1
    assert (command.message.message_id.ledgerId, command.message.message_id.entryId) == (5, 9)
    assert not command.message.ack_set
    assert block is entry.pulsar  # (made once per entry)
    assert delivered == {(5, 9): (4, None)}
    decoded = decode_batch(block, "the frame")
    assert decoded.payloads == [b"m0", b"m1", b"m2", b"m3"]


def test_part_of_an_entry_goes_as_a_batch_of_those_messages() -> None:
    entry = streamlib_entry(4)
    delivered: dict[tuple[int, int], Any] = {}
    _, block = message_frame(3, Handed(entry, [1, 3]), 0, delivered)
    decoded = decode_batch(block, "the frame")
    assert decoded.payloads == [b"m1", b"m3"]
    assert [m.key for m in decoded.metadata or ()] == ["k1", "k1"]
    assert delivered == {(5, 9): (2, [1, 3])}
    assert [bytes(m.data()) for m in pulsar_messages(block)] == [b"m1", b"m3"]


def consumer_with(
    delivered: dict[tuple[int, int], Any],
) -> tuple[_Consumer, list[Any], list[Any]]:
    """A consumer whose dispatcher records what it is told, and whose connection what
    it writes."""
    told: list[Any] = []
    written: list[Any] = []
    dispatcher = SimpleNamespace(
        ack=lambda cid, acks: told.append(("ack", list(acks))),
        ack_cumulative=lambda cid, upto: told.append(("cumulative", upto)),
        redeliver_now=lambda cid, entries: told.append(("redeliver", entries)),
    )
    consumer = _Consumer.__new__(_Consumer)
    consumer.session = SimpleNamespace(cid=1, outbox=asyncio.Queue())  # type: ignore[assignment]
    consumer.dispatcher = dispatcher  # type: ignore[assignment]
    consumer.connection = SimpleNamespace(  # type: ignore[assignment]
        _write=lambda command, block=None: written.append(command)
    )
    consumer.consumer_id, consumer.epoch = 3, 0
    consumer.delivered = delivered
    consumer._waiting = {}
    return consumer, told, written


def ack(ack_type: int, *ids: api.MessageIdData) -> api.CommandAck:
    command = api.CommandAck(consumer_id=1, ack_type=ack_type)  # type: ignore[arg-type]
    command.message_id.extend(ids)
    return command


def test_acks_name_the_entrys_own_indexes() -> None:
    consumer, told, _ = consumer_with({(5, 9): (2, [1, 3]), (5, 10): (4, None), (5, 11): (4, None)})
    consumer.ack(
        ack(
            api.CommandAck.Individual,
            api.MessageIdData(ledgerId=5, entryId=10, ack_set=[0b1010]),  # 0 and 2 acked
            api.MessageIdData(ledgerId=5, entryId=11, batch_index=3),
            api.MessageIdData(ledgerId=5, entryId=9),  # a part, whole: the entry's 1 and 3
        )
    )
    assert told == [("ack", [(5, 10, [0, 2]), (5, 11, [3]), (5, 9, [1, 3])])]
    assert set(consumer.delivered) == {(5, 10), (5, 11)}  # (only a whole ack ends one)


def test_acks_that_cannot_be_told_are_not_read() -> None:
    """A part's batch-index ack may be of an earlier delivery, numbered otherwise; an
    entry not out to this client now is none of its to ack; a huge ack_set is read only
    as far as the entry goes."""
    consumer, told, _ = consumer_with({(5, 9): (2, [1, 3]), (5, 10): (2, None)})
    consumer.ack(
        ack(
            api.CommandAck.Individual,
            api.MessageIdData(ledgerId=5, entryId=9, batch_index=0),
            api.MessageIdData(ledgerId=5, entryId=9, ack_set=[0]),
            api.MessageIdData(ledgerId=5, entryId=77),
            api.MessageIdData(ledgerId=5, entryId=10, ack_set=[0] * 100_000),
        )
    )
    assert told == [("ack", [(5, 10, [0, 1])])]


def test_a_part_of_an_entry_out_already_waits_for_that_ones_ack() -> None:
    consumer, told, written = consumer_with({})
    entry = streamlib_entry(4)
    consumer._send(Handed(entry, [0, 1]))
    consumer._send(Handed(entry, [3], 1))  # (a slot moved here, or a redelivery)
    assert len(written) == 1 and (5, 9) in consumer._waiting
    consumer.ack(ack(api.CommandAck.Individual, api.MessageIdData(ledgerId=5, entryId=9)))
    assert told == [("ack", [(5, 9, [0, 1])])]  # (not 3: it has not gone yet)
    assert len(written) == 2 and written[1].message.redelivery_count == 1
    assert consumer.delivered == {(5, 9): (1, [3])}


def test_cumulative_acks() -> None:
    consumer, told, _ = consumer_with({(5, 8): (1, None), (5, 9): (4, None)})
    # pulsar-client, batch-index acks off: the entry before the one it is in
    consumer.ack(ack(api.CommandAck.Cumulative, api.MessageIdData(ledgerId=5, entryId=8)))
    consumer.ack(
        ack(api.CommandAck.Cumulative, api.MessageIdData(ledgerId=5, entryId=9, batch_index=1))
    )
    consumer.ack(ack(api.CommandAck.Cumulative, api.MessageIdData(ledgerId=6, entryId=0)))
    assert told[0] == ("cumulative", MessageId(5, 8, 2**31))
    assert told[1] == ("cumulative", MessageId(5, 9, 1))
    assert told[2] == ("cumulative", MessageId(6, 0, 2**31))
    assert consumer.delivered == {}


def test_a_cumulative_ack_stops_before_a_part_that_waits() -> None:
    consumer, told, _ = consumer_with({(5, 9): (2, [0, 1])})
    consumer._waiting[(5, 9)] = [Handed(streamlib_entry(4), [3])]
    consumer.ack(ack(api.CommandAck.Cumulative, api.MessageIdData(ledgerId=5, entryId=12)))
    assert told == [("cumulative", MessageId(5, 8, 2**31))]


async def test_redelivering_everything_forgets_what_was_not_written() -> None:
    consumer, told, _ = consumer_with({(5, 9): (4, None)})
    outbox = consumer.session.outbox
    seek_done = object()
    for item in ([Handed(streamlib_entry(4, entry_id=10), [0])], seek_done):
        outbox.put_nowait(item)
    consumer.redeliver(api.CommandRedeliverUnacknowledgedMessages(consumer_id=1, consumer_epoch=2))
    assert told == [("redeliver", None)]
    assert consumer.delivered == {} and consumer.epoch == 2
    assert outbox.qsize() == 1 and outbox.get_nowait() is seek_done


def test_the_last_message_id_as_pulsar_numbers_it() -> None:
    lone = entries.headers_and_payload(
        api.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"x"
    )
    assert last_index(lone, "e") == -1  # not batched: pulsar-client's batch index -1
    metadata = api.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=3
    )
    single = api.SingleMessageMetadata(payload_size=1).SerializeToString()
    one = len(single).to_bytes(4, "big") + single + b"x"
    assert last_index(entries.headers_and_payload(metadata, one * 3), "e") == 2
    assert last_index(streamlib_entry(4).stored(), "e") == 3
