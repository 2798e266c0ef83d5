"""The `streamlib` command line: sandbox, everyday produce/consume, admin, benchmarks,
the chaos verifier.

Errors are one line on stderr and a non-zero exit code; argparse usage errors exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamlib",
        description="BookKeeper-style replicated ledgers and streams.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from streamlib import bench, sandbox
    from streamlib import commands as everyday
    from streamlib.autorecovery import cli as autorecovery_cli
    from streamlib.broker import cli as broker_cli
    from streamlib.chaos import cli as chaos_cli

    sandbox.add_parser(commands)
    admin = commands.add_parser("admin", help="administer bookies, ledgers, streams, recovery")
    admin_commands = admin.add_subparsers(dest="admin", metavar="ADMIN", required=True)
    autorecovery_cli.add_parsers(commands, admin_commands)
    everyday.add_parsers(commands, admin_commands)
    broker_cli.add_parsers(commands, admin_commands)
    bench.add_parser(commands)
    chaos_cli.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
