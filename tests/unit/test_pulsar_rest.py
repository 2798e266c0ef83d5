"""Pulsar's admin REST conventions (streamlib/broker/pulsar_rest.py) and stats shapes
(streamlib/pulsar/stats.py), table by table."""

from __future__ import annotations

import pytest

from metadata.errors import BadVersionError, InvalidNameError, StreamExistsError
from streamlib.broker.http_server import HttpError
from streamlib.broker.pulsar_rest import as_http, match, message_id, topic_stream
from streamlib.protocol.errors import (
    BadRequestError,
    ConsumerBusyError,
    NoSuchStreamError,
    NoSuchSubscriptionError,
    UnauthorizedError,
)
from streamlib.pulsar.stats import internal_stats, partitioned_stats, position, topic_stats
from streamlib.stream.positions import EARLIEST, LATEST, MessageId

LONG_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (None, LATEST),  # (no body: the default)
        ({"ledgerId": -1, "entryId": -1}, EARLIEST),
        ({"ledgerId": LONG_MAX, "entryId": LONG_MAX, "partitionIndex": -1}, LATEST),
        ({"ledgerId": 7, "entryId": 3}, MessageId(7, 3, 0)),
        ({"ledgerId": 7, "entryId": 3, "batchIndex": -1}, MessageId(7, 3, 0)),
        ({"ledgerId": 7, "entryId": 3, "batchIndex": 2}, MessageId(7, 3, 2)),
        ({"ledgerId": 7, "entryId": 3, "isExcluded": True}, MessageId(7, 4, 0)),
        ({"ledgerId": 7, "entryId": 3, "batchIndex": 2, "isExcluded": True}, MessageId(7, 3, 3)),
    ],
)
def test_a_message_id_body_names_the_message_that_comes_next(body, expected):
    assert message_id(body, LATEST) == expected


@pytest.mark.parametrize(
    "body",
    [7, "7:3", {"ledgerId": 7}, {"ledgerId": True, "entryId": 1}, {"ledgerId": -5, "entryId": 1},
     {"ledgerId": 7, "entryId": 1, "batchIndex": "x"}],
)  # fmt: skip
def test_anything_else_is_a_bad_request(body):
    with pytest.raises(HttpError) as refused:
        message_id(body, LATEST)
    assert refused.value.status == 400


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InvalidNameError("x"), 412),
        (NoSuchStreamError("x"), 404),
        (NoSuchSubscriptionError("x"), 404),
        (StreamExistsError("x"), 409),
        (BadVersionError("x"), 409),
        (ConsumerBusyError("x"), 412),
        (UnauthorizedError("x"), 403),
        (BadRequestError("x"), 400),
        (RuntimeError("boom"), 500),
    ],
)
def test_errors_are_pulsars_status_codes_with_their_class(error, status):
    answer = as_http(error)
    assert answer.status == status
    assert answer.reason.startswith(type(error).__name__) or status == 409


def test_names_in_paths_are_streams_or_412():
    assert topic_stream("public", "default", "orders") == "orders"
    assert topic_stream("acme", "eu", "orders") == "acme:eu:orders"
    for bad in (("acme", "e:u", "t"), ("public", "default", "a b"), ("", "default", "t")):
        with pytest.raises(HttpError) as refused:
            topic_stream(*bad)
        assert refused.value.status == 412
    pattern = ("admin", "v2", "persistent", "{tenant}", "{namespace}")
    assert match(pattern, ["admin", "v2", "persistent", "a", "b"]) == {
        "tenant": "a", "namespace": "b"}  # fmt: skip
    assert match(pattern, ["admin", "v2", "persistent", "a", ""]) is None


RAW = {
    "name": "s",
    "ledgers": [
        {"ledger_id": 4, "entries": 10, "size_bytes": 100, "created_time_ms": 0},
        {"ledger_id": 9, "entries": 2, "size_bytes": 0, "created_time_ms": 1000},
    ],
    "entries": 12,
    "size_bytes": 100,
    "subscriptions": {
        "a": {"mark_delete": "4:3", "backlog_entries": 8, "backlog_messages": 8,
              "consumers": ["failover broker-1", "exclusive direct"]},
        "b": {"mark_delete": "earliest", "backlog_entries": 12, "backlog_messages": None,
              "consumers": []},
    },
}  # fmt: skip


def test_topic_stats_carry_what_streamlib_knows_and_zeros_for_rates():
    stats = topic_stats(RAW, None, "broker-1")
    assert stats["storageSize"] == 100 and stats["msgRateIn"] == 0.0
    assert stats["ownerBroker"] == "broker-1" and stats["deduplicationStatus"] == "Enabled"
    a, b = stats["subscriptions"]["a"], stats["subscriptions"]["b"]
    # (the owner's own stand-in consumer is not one of the subscription's)
    assert [c["consumerName"] for c in a["consumers"]] == ["direct"]
    assert (a["type"], a["msgBacklog"]) == ("Exclusive", 8)
    assert (b["type"], b["msgBacklog"]) == (None, 12)  # (too many to count: the entries)


def test_partitioned_stats_add_the_partitions_up():
    one = topic_stats(RAW, None, "broker-1")
    total = partitioned_stats({"s-partition-0": one, "s-partition-1": one}, True)
    assert total["metadata"] == {"partitions": 2}
    assert total["storageSize"] == 200
    assert total["subscriptions"]["a"]["msgBacklog"] == 16
    assert len(total["subscriptions"]["a"]["consumers"]) == 2
    assert set(total["partitions"]) == {
        "persistent://public/default/s-partition-0", "persistent://public/default/s-partition-1"}  # fmt: skip
    assert partitioned_stats({"s-partition-0": one}, False)["partitions"] == {}


def test_internal_stats_write_positions_as_pulsars_managed_ledger():
    assert position(4, 3) == "4:3"
    assert position(4, 3, 2**31 - 1) == "4:3"  # (a whole entry)
    assert position(4, 3, 1) == "4:2"  # (inside a batch: the entry before is the mark)
    cursors = {"a": ((4, 3, -1), [((4, 5, -1), (4, 7, -1))]), "b": (tuple(EARLIEST), [])}
    internal = internal_stats(RAW, cursors)
    assert internal["numberOfEntries"] == 12 and internal["lastConfirmedEntry"] == "9:1"
    assert [ledger["ledgerId"] for ledger in internal["ledgers"]] == [4, 9]
    assert internal["cursors"]["a"]["markDeletePosition"] == "4:3"
    assert internal["cursors"]["a"]["readPosition"] == "4:4"
    assert internal["cursors"]["a"]["individuallyDeletedMessages"] == "[(4:5..4:7]]"
    assert internal["cursors"]["b"]["readPosition"] == "4:0"
