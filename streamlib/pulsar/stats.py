"""A stream's statistics in the JSON shapes of Pulsar's admin REST API: TopicStats,
PartitionedTopicStats and PersistentTopicInternalStats (pulsar-common's
TopicStatsImpl, SubscriptionStatsImpl, PublisherStatsImpl, ConsumerStatsImpl and
PersistentTopicInternalStats), made from what streamlib knows: StreamManager.stats
(ledgers, sizes, each subscription's mark-delete position, backlog and the consumers
that hold its lock) and, on the broker that owns the stream, its connected producers
and consumers (Live).

streamlib measures no rates nor per-client counters: msgRateIn/Out, msgThroughputIn/Out,
bytes/msg In/Out counters, averageMsgSize, backlogSize, msgRateRedeliver, per-consumer
permits and unacked counts, and every timestamp are 0. Pulsar's clients and tools read
them as numbers, so they are there, as zeros, rather than missing.

No I/O here: the broker's admin port (streamlib/broker/pulsar_admin.py) gathers, this
shapes.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from streamlib.pulsar.topics import topic_of

# Subscription types and producer access modes as Pulsar spells them.
SUBSCRIPTION_TYPES = {
    "exclusive": "Exclusive",
    "failover": "Failover",
    "shared": "Shared",
    "key_shared": "Key_Shared",
}
ACCESS_MODES = {
    "shared": "Shared",
    "exclusive": "Exclusive",
    "wait_for_exclusive": "WaitForExclusive",
    "exclusive_with_fencing": "ExclusiveWithFencing",
}
_LATEST_BATCH = 2**31 - 1  # (streamlib.stream.positions.LATEST's batch index)


@dataclass
class Live:
    """What the owning broker holds of a stream now: producers (name, access mode) and,
    by subscription, its type and connected consumers' names."""

    producers: list[tuple[str, str]] = field(default_factory=list)
    subscriptions: dict[str, tuple[str, list[str]]] = field(default_factory=dict)


def _publisher(index: int, name: str, access_mode: str) -> dict[str, Any]:
    return {
        "accessMode": ACCESS_MODES.get(access_mode, access_mode),
        "msgRateIn": 0.0,
        "msgThroughputIn": 0.0,
        "averageMsgSize": 0.0,
        "chunkedMessageRate": 0.0,
        "producerId": index,
        "supportsPartialProducer": False,
        "producerName": name,
        "address": "",
        "connectedSince": "",
        "clientVersion": "",
        "metadata": {},
    }


def _consumer(name: str) -> dict[str, Any]:
    return {
        "consumerName": name,
        "msgRateOut": 0.0,
        "msgThroughputOut": 0.0,
        "bytesOutCounter": 0,
        "msgOutCounter": 0,
        "msgRateRedeliver": 0.0,
        "chunkedMessageRate": 0.0,
        "availablePermits": 0,
        "unackedMessages": 0,
        "avgMessagesPerEntry": 0,
        "blockedConsumerOnUnackedMsgs": False,
        "lastAckedTimestamp": 0,
        "lastConsumedTimestamp": 0,
        "address": "",
        "connectedSince": "",
        "clientVersion": "",
        "metadata": {},
    }


def _subscription(raw: dict[str, Any], kind: str | None, consumers: list[str]) -> dict[str, Any]:
    backlog = raw["backlog_messages"]
    if backlog is None:  # (too many to count: its entries, as Pulsar's estimate counts)
        backlog = raw["backlog_entries"]
    return {
        "msgRateOut": 0.0,
        "msgThroughputOut": 0.0,
        "bytesOutCounter": 0,
        "msgOutCounter": 0,
        "msgRateRedeliver": 0.0,
        "messageAckRate": 0.0,
        "chunkedMessageRate": 0,
        "msgBacklog": backlog,
        "backlogSize": 0,
        "earliestMsgPublishTimeInBacklog": 0,
        "msgBacklogNoDelayed": backlog,
        "blockedSubscriptionOnUnackedMsgs": False,
        "msgDelayed": 0,
        "unackedMessages": 0,
        "type": SUBSCRIPTION_TYPES.get(kind, kind) if kind else None,
        "activeConsumerName": consumers[0] if consumers else None,
        "msgRateExpired": 0.0,
        "totalMsgExpired": 0,
        "lastExpireTimestamp": 0,
        "lastConsumedFlowTimestamp": 0,
        "lastConsumedTimestamp": 0,
        "lastAckedTimestamp": 0,
        "lastMarkDeleteAdvancedTimestamp": 0,
        "consumers": [_consumer(name) for name in consumers],
        "isDurable": True,
        "isReplicated": False,
        "allowOutOfOrderDelivery": False,
        "consumersAfterMarkDeletePosition": {},
        "nonContiguousDeletedMessagesRanges": 0,
        "nonContiguousDeletedMessagesRangesSerializedSize": 0,
        "subscriptionProperties": {},
    }


def _locked_by(raw: dict[str, Any], skip: str) -> tuple[str | None, list[str]]:
    """A subscription's type and consumers from the consumers holding its lock ("TYPE
    NAME", streamlib/stream/subscription.py): direct-mode consumers, and a broker's own
    stand-in consumer -- named after the broker, skipped."""
    kind, names = None, []
    for holder in raw["consumers"]:
        holder_kind, _, name = holder.partition(" ")
        if name != skip:
            kind = kind or holder_kind
            names.append(name)
    return kind, names


def topic_stats(raw: dict[str, Any], live: Live | None, owner: str) -> dict[str, Any]:
    """TopicStats of a stream: raw is StreamManager.stats(name); live what the owning
    broker holds (None: this broker does not own it); owner the owner's broker id."""
    subscriptions = {}
    for name, sub in raw["subscriptions"].items():
        kind: str | None
        if live is not None and name in live.subscriptions:
            kind, consumers = live.subscriptions[name]
        else:
            kind, consumers = _locked_by(sub, owner)
        subscriptions[name] = _subscription(sub, kind, consumers)
    producers = live.producers if live is not None else []
    return {
        "msgRateIn": 0.0,
        "msgThroughputIn": 0.0,
        "msgRateOut": 0.0,
        "msgThroughputOut": 0.0,
        "bytesInCounter": 0,
        "msgInCounter": 0,
        "bytesOutCounter": 0,
        "msgOutCounter": 0,
        "averageMsgSize": 0.0,
        "msgChunkPublished": False,
        "storageSize": raw["size_bytes"],
        "backlogSize": 0,
        "publishRateLimitedTimes": 0,
        "earliestMsgPublishTimeInBacklogs": 0,
        "offloadedStorageSize": 0,
        "lastOffloadLedgerId": 0,
        "lastOffloadSuccessTimeStamp": 0,
        "lastOffloadFailureTimeStamp": 0,
        "ongoingTxnCount": 0,
        "abortedTxnCount": 0,
        "committedTxnCount": 0,
        "publishers": [_publisher(i, n, mode) for i, (n, mode) in enumerate(producers)],
        "waitingPublishers": 0,
        "subscriptions": subscriptions,
        "replication": {},
        "deduplicationStatus": "Enabled",
        "nonContiguousDeletedMessagesRanges": 0,
        "nonContiguousDeletedMessagesRangesSerializedSize": 0,
        "delayedMessageIndexSizeInBytes": 0,
        "compaction": {
            "lastCompactionRemovedEventCount": 0,
            "lastCompactionSucceedTimestamp": 0,
            "lastCompactionFailedTimestamp": 0,
            "lastCompactionDurationTimeInMills": 0,
        },
        "ownerBroker": owner or None,
    }


_SUMMED = ("storageSize",)


def partitioned_stats(
    by_partition: dict[str, dict[str, Any]], per_partition: bool
) -> dict[str, Any]:
    """PartitionedTopicStats: the partitions' TopicStats added up (publishers and
    consumers listed together, backlogs summed), the partition count, and each
    partition's own when per_partition. by_partition: stream name -> TopicStats."""
    partitions = list(by_partition.values())
    total = topic_stats({"subscriptions": {}, "size_bytes": 0}, None, "")
    total["ownerBroker"] = None
    for stats in partitions:
        for key in _SUMMED:
            total[key] += stats[key]
        total["publishers"].extend(stats["publishers"])
        for name, sub in stats["subscriptions"].items():
            merged = total["subscriptions"].get(name)
            if merged is None:
                total["subscriptions"][name] = {**sub, "consumers": list(sub["consumers"])}
                continue
            for key in ("msgBacklog", "msgBacklogNoDelayed"):
                merged[key] += sub[key]
            merged["consumers"].extend(sub["consumers"])
            merged["type"] = merged["type"] or sub["type"]
            merged["activeConsumerName"] = merged["activeConsumerName"] or sub["activeConsumerName"]
    total["metadata"] = {"partitions": len(by_partition)}
    total["partitions"] = (
        {topic_of(name): stats for name, stats in by_partition.items()} if per_partition else {}
    )
    return total


def position(ledger_id: int, entry_id: int, batch_index: int = -1) -> str:
    """A position as Pulsar's managed ledger writes it (LEDGER:ENTRY): a mark-delete
    position inside an entry's batch is the entry before (Pulsar's marks are whole
    entries)."""
    if batch_index not in (-1, _LATEST_BATCH):
        entry_id -= 1
    return f"{ledger_id}:{entry_id}"


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds"
    )


def internal_stats(
    raw: dict[str, Any],
    cursors: dict[str, tuple[tuple[int, int, int], list[tuple[Any, Any]]]],
) -> dict[str, Any]:
    """PersistentTopicInternalStats: the stream's ledgers and each cursor. cursors: by
    subscription, (mark-delete position, the ranges acknowledged above it)."""
    ledgers = raw["ledgers"]
    last = ledgers[-1] if ledgers else None
    entries = raw["entries"]
    out_cursors = {}
    for name, (mark, ranges) in cursors.items():
        read = f"{mark[0]}:{mark[1] + 1}" if mark[0] >= 0 else (
            f"{ledgers[0]['ledger_id']}:0" if ledgers else "-1:-1"
        )  # fmt: skip
        deleted = ", ".join(
            f"({position(*lower)}..{position(*upper)}]" for lower, upper in ranges
        )  # fmt: skip
        consumers = raw["subscriptions"].get(name, {}).get("consumers", [])
        out_cursors[name] = {
            "markDeletePosition": position(*mark),
            "readPosition": read,
            "waitingReadOp": False,
            "pendingReadOps": 0,
            "messagesConsumedCounter": 0,
            "cursorLedger": -1,
            "cursorLedgerLastEntry": -1,
            "individuallyDeletedMessages": f"[{deleted}]",
            "lastLedgerSwitchTimestamp": "",
            "state": "NoLedger",  # (a cursor is a node of the metadata store, no ledger)
            "active": bool(consumers),
            "numberOfEntriesSinceFirstNotAckedMessage": 0,
            "totalNonContiguousDeletedMessagesRange": len(ranges),
            "subscriptionHavePendingRead": False,
            "subscriptionHavePendingReplayRead": False,
            "properties": {},
        }
    return {
        "entriesAddedCounter": entries,
        "numberOfEntries": entries,
        "totalSize": raw["size_bytes"],
        "currentLedgerEntries": last["entries"] if last else 0,
        "currentLedgerSize": last["size_bytes"] if last else 0,
        "lastLedgerCreatedTimestamp": _utc(last["created_time_ms"]) if last else "",
        "lastLedgerCreationFailureTimestamp": None,
        "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0,
        "lastConfirmedEntry": f"{last['ledger_id']}:{last['entries'] - 1}" if last else "-1:-1",
        "state": "LedgerOpened" if last else "None",
        "ledgers": [
            {
                "ledgerId": ledger["ledger_id"],
                "entries": ledger["entries"],
                "size": ledger["size_bytes"],
                "offloaded": False,
                "underReplicated": False,
            }
            for ledger in ledgers
        ],
        "cursors": out_cursors,
        "schemaLedgers": [],
        "compactedLedger": {
            "ledgerId": -1,
            "entries": -1,
            "size": -1,
            "offloaded": False,
            "underReplicated": False,
        },
    }
