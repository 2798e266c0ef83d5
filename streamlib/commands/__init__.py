"""The everyday and admin commands of the `streamlib` command line.

One module per command group: `pubsub` (produce / consume / read), and under `admin`:
`bookies`, `ledgers`, `streams`, `cursors`, `underreplicated`, `simpletest`, and
`security` (`admin principals` and `token`). Each
module's `add_parsers` adds its parsers; each parser sets `run(args) -> exit code`.
`common` holds what they share: the --metadata default, the one-line error
convention, tables / JSON output and progress bars.

These modules are clients like any user program: they import streamlib's public
client API and metadata services, and must never import the bookie server
(bookie.server, bookie.storage) nor the sandbox's processes.
"""

from __future__ import annotations

from typing import Any


def add_parsers(commands: Any, admin_commands: Any) -> None:
    """Add produce/consume/read to `commands` and the admin groups to `admin_commands`."""
    from streamlib.commands import (
        bookies,
        cursors,
        ledgers,
        pubsub,
        security,
        simpletest,
        streams,
        underreplicated,
    )

    pubsub.add_parsers(commands)
    security.add_parsers(commands, admin_commands)
    for module in (bookies, ledgers, streams, cursors, underreplicated, simpletest):
        module.add_parsers(admin_commands)
    streams.add_parsers(commands)  # `streamlib streams ...` too, as pulsar-admin users type it
