"""What the long-running `streamlib` processes (autorecovery, broker) share."""

from __future__ import annotations

import asyncio
import os
import signal
import sys


def stop_event(exit_with_stdin: bool = False) -> asyncio.Event:
    """An event set on SIGTERM or SIGINT -- and, with exit_with_stdin, when stdin reaches
    its end (the parent that started this process is gone). Call on the running loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if exit_with_stdin:
        stdin = sys.stdin.fileno()

        def on_stdin() -> None:
            if not os.read(stdin, 4096):  # EOF: the parent is gone
                loop.remove_reader(stdin)
                stop.set()

        loop.add_reader(stdin, on_stdin)
    return stop
