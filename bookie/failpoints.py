"""Crash points for tests: kill the process at a named step, the way a power cut would.

``BOOKIE_FAILPOINTS=flush-after-entrylog`` (comma-separated names) in a bookie's
environment makes :func:`crash_if` end the process with ``os._exit`` at that step:
no cleanup, no flush, nothing written after it, exactly like SIGKILL, but at a
deterministic point a test cannot reach with a signal. Unset (always, outside
tests), it is one set lookup.

Names: ``flush-after-entrylog`` (entry log written, index not), ``flush-after-index``
(index written, checkpoint mark not moved).
"""

from __future__ import annotations

import os

EXIT_CODE = 86
_ACTIVE = frozenset(filter(None, os.environ.get("BOOKIE_FAILPOINTS", "").split(",")))


def crash_if(name: str) -> None:
    if name in _ACTIVE:
        os._exit(EXIT_CODE)
