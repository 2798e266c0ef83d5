"""`streamlib admin ...` against a real sandbox: tables by default, --json for
scripts, one-line errors."""

from __future__ import annotations

import json
import re

import streamlib
from metadata.services.underreplication import UnderReplicationManager
from streamlib.client import Client
from tests.cli.conftest import assert_one_line_error, run_cli


def test_bookies_list_and_info(uri: str) -> None:
    table = run_cli("admin", "bookies", "list", metadata=uri)
    assert table.code == 0, table
    assert "3 bookies" in table.out
    for i in range(3):
        assert f"sandbox-bookie-{i}" in table.out
    assert table.out.count("writable") == 3

    records = json.loads(run_cli("admin", "bookies", "list", "--json", metadata=uri).out)
    assert [r["id"] for r in records] == [f"sandbox-bookie-{i}" for i in range(3)]
    assert all(r["address"].startswith("127.0.0.1:") for r in records)

    run_cli("produce", "on-bookies", "-m", "x", metadata=uri)
    info = json.loads(
        run_cli("admin", "bookies", "info", "sandbox-bookie-1", "--json", metadata=uri).out
    )
    assert info["id"] == "sandbox-bookie-1" and info["ledgers"]  # 3 bookies, ensemble 3
    readable = run_cli("admin", "bookies", "info", "sandbox-bookie-1", metadata=uri)
    assert readable.lines[0].split() == ["id", "sandbox-bookie-1"]
    assert_one_line_error(
        run_cli("admin", "bookies", "info", "no-such-bookie", metadata=uri), "NoSuchBookieError"
    )


async def test_ledgers_list_show_recover_delete(uri: str) -> None:
    run_cli("produce", "ledgered", "-m", "a", "-m", "b", metadata=uri)
    listed = json.loads(run_cli("admin", "ledgers", "list", "--json", metadata=uri).out)
    stream_ledger = next(r for r in listed if r["stream"] == "ledgered")
    # Two messages, one or two entries (the first goes alone when nothing is in flight).
    assert stream_ledger["state"] == "CLOSED" and stream_ledger["last_entry_id"] in (0, 1)
    table = run_cli("admin", "ledgers", "list", metadata=uri)
    assert "ledgered" in table.out and "3/2/2" in table.out

    shown = run_cli("admin", "ledgers", "show", str(stream_ledger["ledger_id"]), metadata=uri)
    assert shown.code == 0, shown
    assert shown.lines[1].split() == ["state", "CLOSED"]
    assert "fragments" in shown.out
    assert_one_line_error(
        run_cli("admin", "ledgers", "delete", str(stream_ledger["ledger_id"]), metadata=uri),
        "LedgerInUseError",
        "ledgered",
    )

    async with await Client.connect(uri) as client:
        writer = await client.ledgers.create(3, 2, 2)
        for i in range(3):
            await writer.append(b"entry %d" % i)
        ledger_id = writer.ledger_id  # left OPEN, as a crashed writer leaves it
        recovered = run_cli("admin", "ledgers", "recover", str(ledger_id), metadata=uri)
        assert recovered.code == 0, recovered
        assert (
            recovered.out.strip() == f"ledger {ledger_id}: OPEN -> CLOSED, last entry 2, 21 bytes"
        )
        assert (await client.ledgers.metadata(ledger_id)).is_closed

        # A stream's ledger has a random password: recover uses its stored secret.
        producer = await client.create_producer("crashed-producer")
        stream_ledger_id = (await producer.send(b"kept")).ledger_id
        recovered = run_cli("admin", "ledgers", "recover", str(stream_ledger_id), metadata=uri)
        assert recovered.code == 0, recovered
        assert (await client.ledgers.metadata(stream_ledger_id)).is_closed
        literal = run_cli("admin", "ledgers", "recover", "1", "--password", "pw", metadata=uri)
        assert literal.code == 2 and "file:PATH or env:NAME" in literal.err

    deleted = run_cli("admin", "ledgers", "delete", str(ledger_id), metadata=uri)
    assert deleted.out.strip() == f"deleted ledger {ledger_id}"
    assert_one_line_error(
        run_cli("admin", "ledgers", "show", str(ledger_id), metadata=uri), "NoSuchLedgerError"
    )


async def test_streams_list_show_trim_delete(uri: str) -> None:
    async with await Client.connect(uri) as client:
        # Any closed ledger is over a 1-byte size limit, so retention may drop all but the last.
        await client.streams.create("retained", retention={"size_bytes": 1})
    for i in range(3):  # each producer takes over: a new ledger per command
        run_cli("produce", "retained", "-m", f"batch {i}", metadata=uri)

    listed = json.loads(run_cli("admin", "streams", "list", "--json", metadata=uri).out)
    retained = next(r for r in listed if r["name"] == "retained")
    assert len(retained["ledgers"]) == 3 and retained["entries"] == 3
    assert "retained" in run_cli("admin", "streams", "list", metadata=uri).out

    shown = run_cli("admin", "streams", "show", "retained", metadata=uri)
    assert shown.code == 0, shown
    assert re.search(r"retention +time unlimited, size 1 B\n", shown.out), shown.out
    assert "ensemble 3, write quorum 2, ack quorum 2" in shown.out
    ledger_ids = [r["ledger_id"] for r in retained["ledgers"]]

    trimmed = run_cli("admin", "streams", "trim", "retained", metadata=uri)
    assert trimmed.out.strip() == (
        f"trimmed 'retained': deleted ledgers {ledger_ids[0]} {ledger_ids[1]}"
    )
    again = json.loads(run_cli("admin", "streams", "trim", "retained", "--json", metadata=uri).out)
    assert again == {"stream": "retained", "deleted_ledgers": []}
    read = run_cli("read", "retained", metadata=uri)
    assert [line.split("  ")[1] for line in read.lines] == ["batch 2"]

    deleted = run_cli("admin", "streams", "delete", "retained", metadata=uri)
    assert deleted.out.strip() == "deleted stream 'retained' and its 1 ledgers"
    assert_one_line_error(
        run_cli("admin", "streams", "show", "retained", metadata=uri), "NoSuchStreamError"
    )


async def test_streams_compact_and_set_policies(uri: str) -> None:
    async with await Client.connect(uri) as client:
        producer = await client.create_producer("settings")
        for i in range(30):
            await producer.send(b"%d" % i, key=f"k{i % 3}")
        await producer.close()
        await client.streams.create("parted", partitions=2)
    compacted = run_cli("admin", "streams", "compact", "settings", metadata=uri)
    assert compacted.code == 0, compacted
    assert compacted.out.startswith("compacted 'settings' up to ") and "3 keys from 30" in (
        compacted.out
    )
    parts = json.loads(run_cli("admin", "streams", "compact", "parted", "--json",
                               metadata=uri).out)  # fmt: skip
    assert [p["stream"] for p in parts] == ["parted-partition-0", "parted-partition-1"]
    shown = run_cli("admin", "streams", "show", "settings", metadata=uri).out
    assert re.search(r"compacted view +3 keys up to \d+:\d+ in ledger", shown), shown
    assert re.search(r"compaction threshold +none \(only when asked\)", shown), shown
    changed = run_cli("admin", "streams", "set-policies", "settings", "--retention-compacted",
                      "--compaction-threshold-bytes", "4096", metadata=uri)  # fmt: skip
    assert changed.code == 0, changed
    assert "compacted" in changed.out and "4096 B" in changed.out
    async with await Client.connect(uri) as client:
        md, _ = await client.streams.read("settings")
        assert md.retention.compacted and md.compaction_threshold_bytes == 4096
    assert run_cli("admin", "streams", "set-policies", "settings", metadata=uri).code == 2
    assert_one_line_error(
        run_cli("admin", "streams", "compact", "nothing-here", metadata=uri), "NoSuchStreamError"
    )


def test_cursors_list_and_reset(uri: str) -> None:
    run_cli("produce", "cursored", "-m", "one", "-m", "two", metadata=uri)
    consumed = run_cli("consume", "cursored", "-s", "billing", "--initial-position", "earliest",
                       "-n", "2", metadata=uri)  # fmt: skip
    last_id = consumed.lines[-1].split()[0]
    subs = json.loads(run_cli("admin", "cursors", "list", "cursored", "--json", metadata=uri).out)
    assert subs == {
        "billing": {
            "mark_delete": last_id, "backlog_entries": 0, "backlog_messages": 0, "consumers": []
        }
    }  # fmt: skip
    table = run_cli("admin", "cursors", "list", "cursored", metadata=uri)
    assert "billing" in table.out and last_id in table.out

    reset = run_cli("admin", "cursors", "reset", "cursored", "billing", "earliest", metadata=uri)
    assert (
        reset.out.strip()
        == "'cursored' subscription 'billing': reset to earliest (mark-delete now earliest)"
    )
    replay = run_cli("consume", "cursored", "-s", "billing", "-n", "2", metadata=uri)
    assert [line.split("  ")[1] for line in replay.lines] == ["one", "two"]
    assert_one_line_error(
        run_cli("admin", "cursors", "reset", "cursored", "billing", "x:y", metadata=uri),
        "InvalidPositionError",
    )
    # A typo is an error, never a new subscription pinning the stream's retention.
    assert_one_line_error(
        run_cli("admin", "cursors", "reset", "cursored", "biling", "earliest", metadata=uri),
        "NoSuchSubscriptionError", "no subscription 'biling'",
    )  # fmt: skip
    listed = run_cli("admin", "cursors", "list", "cursored", "--json", metadata=uri)
    assert list(json.loads(listed.out)) == ["billing"]


def test_cursor_operations_peek_skip_clear_and_unsubscribe(uri: str) -> None:
    run_cli("produce", "ops", *[a for i in range(6) for a in ("-m", f"m{i}")], metadata=uri)
    run_cli("consume", "ops", "-s", "s", "--initial-position", "earliest", "-n", "1",
            metadata=uri)  # fmt: skip
    listed = json.loads(run_cli("admin", "cursors", "list", "ops", "--json", metadata=uri).out)
    assert listed["s"]["backlog_messages"] == 5  # messages, not entries
    # Listing every stream does not read every backlog to count it.
    every = json.loads(run_cli("admin", "streams", "list", "--json", metadata=uri).out)
    (ops,) = [r for r in every if r["name"] == "ops"]
    assert ops["subscriptions"]["s"]["backlog_messages"] is None
    table = run_cli("admin", "cursors", "list", "ops", metadata=uri).out
    assert "5 messages" in table and "2147483647" not in table and "-1:-1" not in table

    peeked = run_cli("admin", "cursors", "peek", "ops", "s", "-n", "2", metadata=uri)
    assert [line.split("  ")[1] for line in peeked.lines] == ["m1", "m2"]
    again = run_cli("admin", "cursors", "peek", "ops", "s", metadata=uri)  # peeking acks nothing
    assert again.lines[0].split("  ")[1] == "m1"

    skipped = run_cli("admin", "cursors", "skip", "ops", "s", "2", metadata=uri)
    assert skipped.code == 0 and "skipped 2 messages" in skipped.out, skipped
    rest = run_cli("consume", "ops", "-s", "s", "-n", "1", metadata=uri)
    assert rest.lines[0].split("  ")[1] == "m3"
    cleared = run_cli("admin", "cursors", "clear-backlog", "ops", "s", metadata=uri)
    assert cleared.code == 0, cleared
    listed = json.loads(run_cli("admin", "cursors", "list", "ops", "--json", metadata=uri).out)
    assert listed["s"]["backlog_messages"] == 0

    client = streamlib.connect(uri)
    try:
        client.subscribe("ops", "s", consumer_name="worker")
        busy = run_cli("admin", "cursors", "unsubscribe", "ops", "s", metadata=uri)
        assert_one_line_error(busy, "ConsumerBusyError", "exclusive worker")
        shown = json.loads(run_cli("admin", "cursors", "list", "ops", "--json", metadata=uri).out)
        assert shown["s"]["consumers"] == ["exclusive worker"]
    finally:
        client.close()
    gone = run_cli("admin", "cursors", "unsubscribe", "ops", "s", metadata=uri)
    assert gone.code == 0, gone
    assert json.loads(run_cli("admin", "cursors", "list", "ops", "--json", metadata=uri).out) == {}
    assert_one_line_error(
        run_cli("admin", "cursors", "skip", "ops", "s", "1", metadata=uri),
        "NoSuchSubscriptionError",
    )


async def test_under_replicated_list(uri: str) -> None:
    empty = run_cli("admin", "under-replicated", "list", metadata=uri)
    assert empty.out.strip() == "no ledger is under-replicated"
    async with await Client.connect(uri) as client:
        marks = UnderReplicationManager(client.store)
        await marks.mark(123, ["lost-bookie:3181"])
        try:
            table = run_cli("admin", "under-replicated", "list", metadata=uri)
            assert "123" in table.out and "lost-bookie:3181" in table.out
            records = json.loads(
                run_cli("admin", "under-replicated", "list", "--json", metadata=uri).out
            )
            assert records[0]["ledger_id"] == 123 and records[0]["being_repaired"] is False
            assert records[0]["missing_bookies"] == ["lost-bookie:3181"]
        finally:
            await marks.done(123)


def test_simpletest_writes_reads_back_and_deletes(uri: str) -> None:
    before = json.loads(run_cli("admin", "ledgers", "list", "--json", metadata=uri).out)
    ok = run_cli("admin", "simpletest", "--entries", "300", metadata=uri)
    assert ok.code == 0, ok
    assert ok.out.startswith("simpletest OK: wrote 300 entries to ledger ")
    report = json.loads(
        run_cli("admin", "simpletest", "--entries", "5", "--json", metadata=uri).out
    )
    assert report["ok"] is True and report["entries"] == 5 and len(report["bookies"]) == 3
    after = json.loads(run_cli("admin", "ledgers", "list", "--json", metadata=uri).out)
    assert after == before  # the test ledgers are gone
    assert_one_line_error(
        run_cli("admin", "simpletest", "--ensemble", "5", metadata=uri), "NotEnoughBookiesError"
    )


async def test_trimming_an_unbounded_stream_drops_fragments(uri: str) -> None:
    async with await Client.connect(uri) as client:
        await client.streams.create("one-ledger-cli", mode="unbounded",
                                    rollover={"max_entries": 2}, retention={"size_bytes": 1})  # fmt: skip
        # Fragments roll on sends; the writer's own trims (on roll) are raced by this
        # command's: retention is idempotent, so just ask until nothing is left to drop.
        producer = await client.create_producer("one-ledger-cli", batching_max_publish_delay_ms=0)
        sent = [await producer.send(b"m%d" % i) for i in range(12)]
        await producer.close()
        ledger_id = sent[0].ledger_id
    trimmed = json.loads(
        run_cli("admin", "streams", "trim", "one-ledger-cli", "--json", metadata=uri).out
    )
    assert set(trimmed) == {"stream", "dropped_fragments_starting_at"}
    again = run_cli("admin", "streams", "trim", "one-ledger-cli", metadata=uri)
    assert (
        again.out.strip() == "trimmed 'one-ledger-cli': nothing to drop under its retention policy"
    )
    async with await Client.connect(uri) as client:
        ledger = await client.ledgers.metadata(ledger_id)
    # Only the last fragment is left (no cursor, 1-byte size limit), and it starts past 0.
    assert len(ledger.fragments) == 1 and ledger.first_entry_id > 0


def test_streams_administration_through_a_broker_and_what_needs_direct_mode(sandbox) -> None:
    """`admin streams` and `admin cursors` work given a broker's URL (a broker runs them
    for the caller); what only the metadata store and bookies have is refused in one line
    that says so."""
    url = sandbox.service_url
    created = run_cli("admin", "streams", "create", "via-broker", "--partitions", "2", metadata=url)
    assert created.code == 0, created
    listed = run_cli("admin", "streams", "list", "--json", metadata=url)
    assert listed.code == 0, listed
    names = {record["name"] for record in json.loads(listed.out)}
    assert {"via-broker-partition-0", "via-broker-partition-1"} <= names
    run_cli("produce", "via-broker-partition-0", "-m", "a", "-m", "b", metadata=url)
    consumed = run_cli("consume", "via-broker-partition-0", "-s", "s", "--initial-position",
                       "earliest", "-n", "2", metadata=url)  # fmt: skip
    assert consumed.code == 0, consumed
    reset = run_cli("admin", "cursors", "reset", "via-broker-partition-0", "s", "earliest",
                    metadata=url)  # fmt: skip
    assert reset.code == 0 and "reset to earliest" in reset.out, reset
    for command in (("admin", "ledgers", "list"), ("admin", "bookies", "list"),
                    ("admin", "cursors", "peek", "via-broker-partition-0", "s")):  # fmt: skip
        refused = run_cli(*command, metadata=url)
        assert_one_line_error(refused, "needs direct mode", "not the stream service's brokers")


def test_broker_load_and_pins(uri: str) -> None:
    table = run_cli("admin", "broker", "load", metadata=uri)
    assert table.code == 0, table
    assert table.lines[0].split()[:3] == ["BROKER", "STREAMS", "MSGS_IN/S"]
    reports = [json.loads(line) for line in run_cli(
        "admin", "broker", "load", "--json", metadata=uri).lines]  # fmt: skip
    assert len(reports) == len(table.lines) - 2  # (the header, and the leader's note)
    assert all({"broker_id", "streams", "cpu_percent", "load"} <= set(r) for r in reports)

    pinned = run_cli("admin", "broker", "pin", "orders", "no-such-broker", metadata=uri)
    assert pinned.code == 0 and "not live now" in pinned.out, pinned
    assert "orders no-such-broker" in run_cli("admin", "broker", "pins", metadata=uri).lines
    assert "unpinned" in run_cli("admin", "broker", "unpin", "orders", metadata=uri).out
    assert run_cli("admin", "broker", "pins", metadata=uri).lines == []
    assert_one_line_error(run_cli("admin", "broker", "pin", "orders", metadata=uri), "BROKER_ID")
