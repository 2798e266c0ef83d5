"""Each protocol machine takes its inputs through one step(event): every event type goes
to the handler of that answer, and an event the machine does not take is a TypeError
(a bug of whoever carries the machine's I/O, never silently dropped)."""

from typing import Any

import pytest

from streamlib.protocol import DigestManager, Fragment, LedgerMetadata
from streamlib.protocol.actions import CompleteAdds, EntryData, FailAdds
from streamlib.protocol.digest import master_key, password_hash
from streamlib.protocol.errors import NotEnoughBookiesError, StatusCode, StreamlibError
from streamlib.protocol.events import (
    AddOk,
    AddResults,
    BookiesChosen,
    BookiesUnavailable,
    LacResult,
    MetadataConflict,
    MetadataFailed,
    MetadataRead,
    MetadataWritten,
    ReadResult,
)
from streamlib.protocol.recovery import LedgerRecovery
from streamlib.protocol.stream_rules import LedgerSpan
from streamlib.protocol.stream_writer import (
    LedgerClosed,
    LedgerCloseFailed,
    LedgerCreated,
    LedgerCreateFailed,
    LedgerFailed,
    LedgerRecovered,
    LedgerRecoveryFailed,
    LedgerTakenOver,
    ListConflict,
    ListFailed,
    ListRead,
    ListWritten,
    StreamWriterMachine,
)
from streamlib.protocol.term_recovery import TermRecovery
from streamlib.protocol.writer import LedgerWriter

PW = password_hash(b"")
MD = LedgerMetadata(5, 3, 2, 2, (Fragment(0, ("a", "b", "c")),), password_hash=PW)
ENTRY = EntryData(0, -1, 1, b"x", b"digest")
ERROR = NotEnoughBookiesError("two bookies for three slots")
OK = StatusCode.OK


def ledger_writer() -> LedgerWriter:
    return LedgerWriter(MD, 1, master_key=master_key(PW), digest=DigestManager(5, "crc32c", PW))


def ledger_recovery() -> LedgerRecovery:
    return LedgerRecovery(MD, 1, master_key=master_key(PW), digest=DigestManager(5, "crc32c", PW))


def term_recovery() -> TermRecovery:
    md = LedgerMetadata(
        5, 3, 2, 2, (Fragment(0, ("a", "b", "c")),), password_hash=PW, unbounded=True
    )
    return TermRecovery(md, 1, master_key=master_key(PW), digest=DigestManager(5, "crc32c", PW))


# (event, the handler it goes to, the arguments the handler gets)
LEDGER_ANSWERS: list[tuple[Any, str, tuple[Any, ...]]] = [
    (AddResults("a", [(0, OK), (1, None)]), "on_add_results", ("a", [(0, OK), (1, None)])),
    (BookiesChosen(["d"], 2000), "on_bookies_chosen", (["d"], 2000)),
    (BookiesUnavailable(ERROR), "on_bookies_unavailable", (ERROR,)),
    (MetadataWritten(MD, 2), "on_metadata_written", (MD, 2)),
    (MetadataConflict(), "on_metadata_conflict", ()),
    (MetadataRead(MD, 3), "on_metadata_read", (MD, 3)),
    (MetadataFailed(ERROR), "on_metadata_error", (ERROR,)),
]
WRITER_ANSWERS = [*LEDGER_ANSWERS, (AddOk("a", [0, 1]), "on_add_ok", ("a", [0, 1]))]
RECOVERY_ANSWERS = [
    *LEDGER_ANSWERS,
    # Recovery has no fast path for durable OKs: they are add results, all OK.
    (AddOk("a", [0, 1]), "on_add_results", ("a", [(0, OK), (1, OK)])),
    (LacResult("a", OK, 7), "on_lac_result", ("a", OK, 7)),
    (LacResult("a", None), "on_lac_result", ("a", None, -1)),
    (ReadResult("b", 3, OK, ENTRY), "on_read_result", ("b", 3, OK, ENTRY)),
    (ReadResult("b", 3, None), "on_read_result", ("b", 3, None, None)),
]
SPANS = [LedgerSpan(1, 10, 100)]
STREAM_INPUTS: list[tuple[Any, str, tuple[Any, ...]]] = [
    (ListRead(SPANS, 4, False), "on_list_read", (SPANS, 4, False)),
    (ListWritten(5), "on_list_written", (5,)),
    (ListConflict(), "on_list_conflict", ()),
    (ListFailed(ERROR), "on_list_failed", (ERROR,)),
    (LedgerRecovered(1, 10, 100), "on_recovered", (1, 10, 100)),
    (LedgerRecoveryFailed(1, ERROR), "on_recovery_failed", (1, ERROR)),
    (LedgerTakenOver(1), "on_taken_over", (1,)),
    (LedgerCreated(2), "on_created", (2,)),
    (LedgerCreateFailed(ERROR), "on_create_failed", (ERROR,)),
    (LedgerClosed(1, 10, 100), "on_closed", (1, 10, 100)),
    (LedgerCloseFailed(1, ERROR, True), "on_close_failed", (1, ERROR, True)),
    (LedgerFailed(2, ERROR, False), "on_ledger_failed", (2, ERROR, False)),
]

CASES = [
    *[(ledger_writer, *case) for case in WRITER_ANSWERS],
    *[(ledger_recovery, *case) for case in RECOVERY_ANSWERS],
    *[(term_recovery, *case) for case in RECOVERY_ANSWERS],
    *[(lambda: StreamWriterMachine("s"), *case) for case in STREAM_INPUTS],
]


@pytest.mark.parametrize(
    ("make", "event", "handler", "args"),
    CASES,
    ids=[f"{make().__class__.__name__}-{type(event).__name__}" for make, event, *_ in CASES],
)
def test_step_hands_each_event_to_its_handler(make, event, handler, args):
    machine = make()
    calls = []
    decided = [object()]  # what the handler decides is what step returns

    def record(*got: Any) -> list[object]:
        calls.append(got)
        return decided

    setattr(machine, handler, record)
    assert machine.step(event) is decided
    assert calls == [args]


NOT_TAKEN = [
    (ledger_writer, LacResult("a", OK, 7)),  # a writer reads no LAC ...
    (ledger_writer, ReadResult("a", 0, OK, ENTRY)),  # ... and no entry
    (ledger_writer, ListConflict()),  # a stream writer's input
    (ledger_recovery, LedgerCreated(2)),
    (lambda: StreamWriterMachine("s"), MetadataConflict()),  # a ledger machine's input
    (ledger_writer, "on_add_ok"),  # no method names
    (ledger_recovery, None),
    (lambda: StreamWriterMachine("s"), ("on_list_read", [], 1, False)),
]


@pytest.mark.parametrize(("make", "event"), NOT_TAKEN)
def test_step_refuses_an_event_the_machine_does_not_take(make, event):
    machine = make()
    with pytest.raises(TypeError, match="takes no"):
        machine.step(event)


def test_durable_oks_from_an_ack_quorum_complete_an_append_through_step():
    writer = ledger_writer()
    first, _ = writer.append([b"x"])  # write set a, b (E=3, Qw=2, Qa=2)
    assert writer.step(AddOk("a", [first])) == []
    (complete,) = writer.step(AddOk("b", [first]))
    assert complete == CompleteAdds(first, first)
    assert writer.last_add_confirmed == first


def test_a_metadata_failure_through_step_ends_the_writer():
    writer = ledger_writer()
    writer.append([b"x"])
    (failed,) = writer.step(MetadataFailed(StreamlibError("the store is down")))
    assert isinstance(failed, FailAdds) and failed.entry_ids == (0,)
