"""Fault points for tests: make a named step crash the process or fail like a disk would.

A bookie calls :func:`crash_if` / :func:`fail_if` at named steps of its write paths.
Unarmed (always, outside tests) each is one truth test of a module-level dict.

Arming, in a bookie process's environment:

- ``BOOKIE_FAILPOINTS=flush-after-entrylog,journal-sync=EIO*1`` (comma-separated):
  a bare name CRASHES at that step (``os._exit``: no cleanup, no flush, nothing written
  after it -- SIGKILL at a point a signal cannot reach); ``NAME=ERRNO`` makes the step
  raise ``OSError(ERRNO)`` every time, ``NAME=ERRNO*N`` only the first N times.
- ``BOOKIE_FAILPOINTS_DIR=DIR``: a file ``DIR/NAME`` arms NAME while it exists, its
  content being the action (``EIO``, ``ENOSPC*2``, ``crash``, ``slow=0.3``); a test (or
  ``streamlib chaos --disk-faults``) arms and disarms a running bookie with a file write
  and an unlink. Write such a file whole (a rename into place): an empty one means crash.

Actions: ``crash``; an errno name (``EIO``, ``ENOSPC``), optionally ``*N``; ``slow=S``
sleeps S seconds at the step (in the thread or on the loop that runs it), then the step
goes on normally -- a slow disk (a slow fsync at ``journal-sync``).

In process (unit tests of the storage): :func:`arm` with an action or a callable (which
may block on an event to pause the step, or raise), :func:`disarm`.

Crash steps: ``flush-after-entrylog`` (entry log written, index not),
``flush-after-index`` (index written, checkpoint mark not moved).
Failure steps: ``journal-write`` and ``entrylog-write`` (the write call fails after its
bytes went out: a torn write), ``journal-sync``, ``entrylog-sync``, ``index-write`` (the
flush's index transaction), and ``flush-before-index`` (between the entry-log write and
the index transaction). A count in a ``BOOKIE_FAILPOINTS_DIR`` file is read afresh at
every step, so there it means "always": unlink the file to disarm.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

EXIT_CODE = 86

Action = Callable[[str], None]
_armed: dict[str, Action] = {}
_lock = threading.Lock()
_dir = os.environ.get("BOOKIE_FAILPOINTS_DIR")


def _parse(spec: str) -> Action:
    """``crash``, ``EIO``, ``ENOSPC*2``, ``slow=0.3`` -> what the step does."""
    spec = spec.strip()
    if spec in ("", "crash"):
        return _crash
    if spec.startswith("slow="):
        try:
            delay_s = float(spec.removeprefix("slow="))
        except ValueError:
            delay_s = -1.0
        if not delay_s >= 0:  # (also NaN)
            raise ValueError(f"bad failpoint action {spec!r}: slow=SECONDS, e.g. slow=0.3")
        return lambda step: time.sleep(delay_s)
    name, _, times = spec.partition("*")
    code = getattr(errno, name.strip().upper(), None)
    if not isinstance(code, int):
        raise ValueError(
            f"unknown failpoint action {spec!r}: use crash, EIO, ENOSPC, EIO*3, slow=0.3"
        )
    left = [int(times)] if times else None

    def fail(step: str) -> None:
        if left is not None:
            with _lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
        raise OSError(code, f"{os.strerror(code)} (failpoint {step})")

    return fail


def _crash(step: str) -> None:
    os._exit(EXIT_CODE)


def arm(name: str, action: str | Action = "crash") -> None:
    _armed[name] = _parse(action) if isinstance(action, str) else action


def disarm(name: str | None = None) -> None:
    if name is None:
        _armed.clear()
    else:
        _armed.pop(name, None)


def _from_dir(name: str) -> Action | None:
    assert _dir is not None
    try:
        return _parse(Path(_dir, name).read_text())
    except FileNotFoundError:
        return None


def fail_if(name: str) -> None:
    """Run the step's armed action (raise, pause, crash), if any."""
    if _armed:
        action = _armed.get(name)
        if action is not None:
            action(name)
    if _dir is not None:
        action = _from_dir(name)
        if action is not None:
            action(name)


crash_if = fail_if  # the crash points predate the failure points; one mechanism serves both

for _item in filter(None, os.environ.get("BOOKIE_FAILPOINTS", "").split(",")):
    _name, _, _spec = _item.partition("=")
    arm(_name.strip(), _spec or "crash")
