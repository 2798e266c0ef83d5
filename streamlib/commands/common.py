"""What every command shares: the --metadata default, connecting, the one-line error
convention, readable tables or JSON, progress bars, and how payloads are shown.

Payloads: a message whose data is printable UTF-8 is shown as text; any other payload
is shown as ``base64:`` followed by its base64 encoding (in tables and in JSON alike),
so output is always one line per message and nothing is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metadata.errors import MetadataError
from streamlib.protocol.errors import StreamlibError

if TYPE_CHECKING:
    from streamlib.client import Client

# argparse's subparsers object (its class is private).
Subparsers = Any
ENV_METADATA = "STREAMLIB_METADATA"


class CommandError(Exception):
    """A command cannot do what was asked (the message says what to do instead)."""


class NoMetadataStoreError(CommandError):
    """The --metadata URI names an embedded store that does not exist."""


class NoSuchBookieError(CommandError):
    """No bookie with that id is registered."""


def add_common(parser: argparse.ArgumentParser, *, json_help: str = "print JSON") -> None:
    parser.add_argument(
        "--metadata",
        metavar="URI",
        help=f"metadata store URI (sqlite:///path/meta.db, zk://host:port/chroot); "
        f"default: ${ENV_METADATA}, else the sandbox's",
    )
    parser.add_argument("--json", action="store_true", help=json_help)
    security = parser.add_argument_group(
        "TLS and authentication (default: $STREAMLIB_TLS_CA / _CERT / _KEY, $STREAMLIB_TOKEN "
        "or $STREAMLIB_TOKEN_FILE)"
    )
    security.add_argument("--tls-ca", metavar="PEM", help="dial bookies over TLS trusting this CA")
    security.add_argument("--tls-cert", metavar="PEM", help="client certificate (mutual TLS)")
    security.add_argument("--tls-key", metavar="PEM", help="the key of --tls-cert")
    security.add_argument(
        "--token",
        metavar="file:PATH|env:NAME",
        type=token_source,
        help="the token naming this client's principal, read from a file or an environment "
        "variable (never given on the command line, where every local user sees it)",
    )


def secret_source(what: str) -> Callable[[str], str]:
    """argparse type of a secret option (--token, --password): where it is, Pulsar's
    file:PATH / env:NAME forms, read -- never the secret itself, which every local user
    would see in the process list."""

    def read(text: str) -> str:
        kind, sep, where = text.partition(":")
        if not sep or kind not in ("file", "env") or not where:
            raise argparse.ArgumentTypeError(
                f"{what} takes file:PATH or env:NAME, not the token itself (a command line "
                "is visible to every local user)"
            )
        if kind == "env":
            value = os.environ.get(where, "").strip()
            if not value:
                raise argparse.ArgumentTypeError(f"{what} env:{where}: ${where} is not set")
            return value
        from streamlib.security import read_secret_file

        try:
            return read_secret_file(where.removeprefix("//"), f"{what} file")
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return read


token_source = secret_source("--token")


def metadata_uri_arg(text: str) -> str:
    """argparse type of --metadata: a URI without an inline password."""
    from metadata.uri import credentials_in_uri

    if credentials_in_uri(text):
        raise argparse.ArgumentTypeError(
            "the URI carries a password, which every local user sees in the process list: "
            f"use zk://...?auth_file=PATH, $STREAMLIB_ZK_AUTH, or put the URI in ${ENV_METADATA}"
        )
    return text


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """Client.connect's security options from add_common's flags (unset: the environment)."""
    return {
        key: getattr(args, key)
        for key in ("tls_ca", "tls_cert", "tls_key", "token")
        if getattr(args, key, None) is not None
    }


def metadata_uri(args: argparse.Namespace) -> str:
    if args.metadata:
        from metadata.uri import credentials_in_uri

        if credentials_in_uri(args.metadata):
            raise CommandError(
                "the --metadata URI carries a password, which every local user sees in the "
                "process list: use zk://...?auth_file=PATH, $STREAMLIB_ZK_AUTH, or put the "
                f"whole URI in ${ENV_METADATA}"
            )
        return str(args.metadata)
    if os.environ.get(ENV_METADATA):
        return os.environ[ENV_METADATA]
    from streamlib.sandbox import default_metadata_uri

    return default_metadata_uri()


def _check_store_exists(uri: str) -> None:
    # Connecting to a missing sqlite file would silently create an empty store, and the
    # command would then report "no such stream" instead of the real problem.
    if uri.startswith("sqlite://") and not Path(uri[len("sqlite://") :]).exists():
        raise NoMetadataStoreError(
            f"no metadata store at {uri}: start `streamlib sandbox`, or pass --metadata URI "
            f"(or set {ENV_METADATA})"
        )


def fail(message: str, code: int = 1) -> int:
    print(f"streamlib: error: {message}", file=sys.stderr, flush=True)
    return code


ERRORS = (StreamlibError, MetadataError, CommandError, ValueError, OSError, TimeoutError)


def run_with_client(
    body: Callable[[Client, argparse.Namespace], Awaitable[int | None]],
    *,
    direct_only: bool = False,
) -> Callable[[argparse.Namespace], int]:
    """The argparse `run` of a command whose body needs a connected client (direct_only:
    one of the metadata store and bookies, which a broker does not offer)."""

    def run(args: argparse.Namespace) -> int:
        from streamlib.client import Client

        async def go() -> int:
            uri = metadata_uri(args)
            if direct_only and uri.startswith("streamlib://"):
                raise CommandError(
                    f"`{' '.join(sys.argv[1:4])}` needs direct mode: --metadata must name "
                    f"the metadata store (zk://, sqlite://), not the stream service's brokers"
                )
            _check_store_exists(uri)
            client = await Client.connect(uri, **client_options(args))
            try:
                return int(await body(client, args) or 0)
            finally:
                await client.close()

        try:
            return asyncio.run(go())
        except ERRORS as exc:
            text = " ".join(str(exc).split()) or "(no detail)"
            return fail(f"{type(exc).__name__}: {text}")

    return run


# -- output ---------------------------------------------------------------------------


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output keeps whole rows: rich would otherwise wrap tables at 80 columns.
    return Console(file=stream, width=None if stream.isatty() else 200, highlight=False)


def print_json(value: Any) -> None:
    print(json.dumps(value), flush=True)


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> None:
    from rich import box
    from rich.table import Table

    table = Table(*columns, title=title or None, box=box.SIMPLE_HEAD, title_justify="left")
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    _console().print(table)


def print_fields(fields: Sequence[tuple[str, Any]]) -> None:
    """Key / value lines, aligned (the readable form of one object)."""
    width = max(len(key) for key, _ in fields)
    for key, value in fields:
        print(f"{key:<{width}}  {value}")


@contextlib.contextmanager
def progress(
    description: str, total: int | None, *, enabled: bool
) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr (none with --json, nor when stderr is not a
    terminal: a log file gets no redraw noise); yields advance(n)."""
    from rich.progress import Progress

    shown = enabled and sys.stderr.isatty()
    with Progress(console=_console(stderr=True), transient=True, disable=not shown) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def show_payload(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return text
    return "base64:" + base64.b64encode(data).decode("ascii")


def key_value(text: str) -> tuple[str, str]:
    """argparse type of `-p key=value` (a bad one is a usage error, exit 2)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def ms_to_text(ms: int) -> str:
    if not ms:
        return "-"
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def size_to_text(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
