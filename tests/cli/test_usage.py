"""Bad arguments are usage errors: exit code 2 and a usage message, before any
connection is made (so no cluster is needed)."""

from __future__ import annotations

import pytest

from tests.cli.conftest import run_cli


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["produce", "s"],  # neither -m nor --file
        ["produce", "s", "-m", "x", "--file", "f"],  # both
        ["produce", "s", "-m", "x", "-p", "no-equals-sign"],
        ["consume", "s"],  # no -s
        ["consume", "s", "-s", "sub", "--initial-position", "middle"],
        ["read", "s", "-n", "many"],
        ["read", "s", "--timeout", "-1"],
        ["admin"],
        ["admin", "bookies"],
        ["admin", "ledgers", "show", "not-a-number"],
        ["admin", "streams", "frobnicate"],
        ["admin", "cursors", "reset", "stream", "sub"],
        ["admin", "under-replicated"],
        ["admin", "simpletest", "--entries", "0"],
        ["broker", "--metadata", "memory://x", "--gc-thresholds", "700,10"],
        ["broker", "--metadata", "memory://x", "--gc-thresholds", "700,0,10"],
        ["broker", "--metadata", "memory://x", "--gc-thresholds", "a,b,c"],
        ["broker", "--metadata", "memory://x", "--quiet-lac-ms", "-1"],
        ["broker", "--metadata", "memory://x", "--quiet-lac-ms", "soon"],
    ],
)
def test_bad_arguments_exit_2_with_usage(argv: list[str]) -> None:
    result = run_cli(*argv)
    assert result.code == 2, result
    assert result.out == ""
    assert "usage: streamlib" in result.err
