"""pulsar-client's own objects -- its MessageId, InitialPosition -- taken wherever
streamlib takes its equivalents (streamlib/stream/positions.py), against the real
package (the test extra installs it; streamlib does not depend on it)."""

import pulsar
import pytest

import streamlib
from streamlib.protocol.errors import BadRequestError, InvalidPositionError
from streamlib.stream.positions import (
    EARLIEST,
    LATEST,
    InitialPosition,
    MessageId,
    as_message_id,
    parse_initial_position,
    parse_start,
)


def test_pulsar_earliest_and_latest_are_ours():
    # Both the class attributes (the C extension's ids) and a default-made MessageId.
    assert as_message_id(pulsar.MessageId.earliest) is EARLIEST
    assert as_message_id(pulsar.MessageId.latest) is LATEST
    assert as_message_id(pulsar.MessageId()) is EARLIEST
    assert parse_start(pulsar.MessageId.earliest) is EARLIEST
    assert parse_start(pulsar.MessageId.latest) is LATEST


def test_a_pulsar_message_id_names_the_same_ledger_entry_and_index():
    batched = pulsar.MessageId(partition=-1, ledger_id=12, entry_id=34, batch_index=5)
    assert as_message_id(batched) == MessageId(12, 34, 5)
    assert parse_start(batched) == MessageId(12, 34, 5)
    # Pulsar's batch index -1: the entry's only message, index 0 here.
    assert as_message_id(pulsar.MessageId(ledger_id=12, entry_id=34)) == MessageId(12, 34, 0)
    # Its partition is not needed: the ledger id names the stream's ledger.
    assert as_message_id(pulsar.MessageId(3, 12, 34, 0)) == MessageId(12, 34, 0)
    # The C extension's own id (what pulsar's Message.message_id() returns) too.
    deserialized = pulsar.MessageId.deserialize(batched.serialize())
    assert as_message_id(deserialized) == MessageId(12, 34, 5)


def test_our_ids_and_tuples_pass_checked():
    assert as_message_id(MessageId(1, 2, 3)) == MessageId(1, 2, 3)
    assert as_message_id((1, 2)) == MessageId(1, 2, 0)
    assert as_message_id(EARLIEST) is EARLIEST


@pytest.mark.parametrize("bad", [None, 7, True, "1:2", b"x" * 20, (1,), (1, 2, 3, 4), (-5, 0, 0)])
def test_anything_else_is_a_typed_error(bad):
    with pytest.raises(InvalidPositionError):
        as_message_id(bad)


def test_parse_start_keeps_reading_our_forms():
    assert parse_start("earliest") is EARLIEST and parse_start("LATEST") is LATEST
    assert parse_start("4:5:6") == MessageId(4, 5, 6)
    assert parse_start(MessageId(4, 5, 6).to_bytes()) == MessageId(4, 5, 6)
    with pytest.raises(InvalidPositionError, match="pulsar-client's"):
        parse_start(object())


def test_initial_positions_as_pulsar_spells_them():
    assert parse_initial_position(pulsar.InitialPosition.Earliest) == "earliest"
    assert parse_initial_position(pulsar.InitialPosition.Latest) == "latest"
    assert parse_initial_position(streamlib.InitialPosition.Earliest) == "earliest"
    assert streamlib.InitialPosition is InitialPosition
    for text in ("earliest", "Latest", "LATEST"):
        assert parse_initial_position(text) == text.lower()


@pytest.mark.parametrize("bad", ["first", "", None, 0, pulsar.ConsumerType.Shared, EARLIEST])
def test_other_initial_positions_are_refused_naming_the_accepted_ones(bad):
    with pytest.raises(BadRequestError, match="'latest' or 'earliest'"):
        parse_initial_position(bad)
