"""The workers' event logs: one JSON object a line, {"ev": what, "t": wall clock, ...},
in an append-only file of each worker's own. The workers write them (EventLog), the
harness follows them while the run goes on (LogTail) and the verdict reads them.

A line is written with one write(2) on an O_APPEND descriptor as soon as the event
happens: the harness kills processes, not the machine, so what was written survives a
SIGKILL, and a writer's threads never interleave their lines.

The events, by who logs them:
- every worker: "start" (role, pid), "error" (error, traceback, during), "close_failed"
  (what, error), "stacks" (on SIGUSR1), "exit".
- a producer: "producer" (a producer was created), "ack" (seq, payload, id), "fail"
  (seq, sent, error; seq -1 for a takeover that failed), "closed", "stopped" (last).
- a consumer or reader: "subscribed" / "opened", "msg" (id, payload; a consumer's also
  session), "done" (a scan reached the end).

A message's payload names its producer and that producer's sequence number:
"<producer>-<seq>".
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Any


def payload(producer: str, seq: int) -> str:
    return f"{producer}-{seq}"


def producer_and_seq(text: str) -> tuple[str, int] | None:
    """Who sent a payload and its sequence number (None: not one of ours)."""
    producer, _, seq = text.rpartition("-")
    return (producer, int(seq)) if producer and seq.isdigit() else None


def describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def traceback_of(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))[-4000:]


class EventLog:
    """A worker's side: appends events."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, **fields: Any) -> None:
        record = {"ev": event, "t": round(time.time(), 6), **fields}
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def error(self, error: BaseException, **fields: Any) -> None:
        self.write("error", error=describe(error), traceback=traceback_of(error), **fields)

    def close(self) -> None:
        os.close(self._fd)


class LogTail:
    """The harness's side: the events of one worker's log, read incrementally (a torn
    last line waits for the rest of it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0

    def poll(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self.events
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        self.events += [json.loads(line) for line in data[:complete].splitlines() if line]
        return self.events
