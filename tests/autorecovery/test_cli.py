"""The command line's shape: how streamlib.cli mounts it, and its input errors."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from streamlib.autorecovery.cli import add_parsers


def lead_style_parser() -> argparse.ArgumentParser:
    """Built the way streamlib.cli builds its own: top-level and `admin` subcommands."""
    parser = argparse.ArgumentParser(prog="streamlib")
    commands = parser.add_subparsers(dest="command", required=True)
    admin = commands.add_parser("admin")
    admin_commands = admin.add_subparsers(dest="admin_command", required=True)
    add_parsers(commands, admin_commands)
    return parser


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["autorecovery", "--metadata", "sqlite:///m.db", "--grace-period", "5"],
            {"grace_period": 5.0},
        ),
        (
            ["admin", "decommission", "h:1", "--metadata", "m"],
            {"operation": "decommission", "bookie": "h:1"},
        ),
        (["admin", "recover", "h:1", "--metadata", "m"], {"operation": "recover"}),
        (["admin", "autorecovery", "audit-now", "--metadata", "m"], {"action": "audit-now"}),
    ],
)
def test_every_command_parses_and_has_a_runner(
    argv: list[str], expected: dict[str, object]
) -> None:
    args = lead_style_parser().parse_args(argv)
    assert callable(args.run)
    for key, value in expected.items():
        assert getattr(args, key) == value


def test_unknown_admin_action_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        lead_style_parser().parse_args(["admin", "autorecovery", "explode", "--metadata", "m"])
    assert exit_info.value.code == 2


def test_a_negative_delay_is_one_line_on_stderr_and_exit_1(tmp_path: object) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamlib.autorecovery",
            "--metadata",
            f"sqlite://{tmp_path}/meta.db",
            "--lost-bookie-delay",
            "-1",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.decode() == "streamlib: error: ValueError: --lost-bookie-delay must be >= 0\n"
    )


def test_bookie_autorecovery_needs_a_metadata_store(tmp_path: object) -> None:
    command = [sys.executable, "-m", "bookie", "serve", "--data-dir", f"{tmp_path}/b"]
    proc = subprocess.run(
        [*command, "--port", "0", "--autorecovery"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.decode() == "bookie: error: ValueError: --autorecovery needs --metadata\n"
