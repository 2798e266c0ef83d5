"""`streamlib sandbox`: a local cluster in one command (like `pulsar standalone`).

N `bookie serve` processes over the embedded sqlite metadata store (or --metadata URI),
with stable bookie ids (sandbox-bookie-0, ...) and ports (--port-base + i), so a restart
on the same data directory finds all its data again. It waits until every bookie is
registered, prints where everything is, and runs until Ctrl-C / SIGTERM, then stops the
bookies cleanly. `--demo` runs an end-to-end demo against the cluster and exits.

`--secure` turns TLS and authentication on: a throwaway CA, a bookie certificate for
127.0.0.1/localhost and an HS256 token key are made in DATA_DIR/security (kept across
restarts, so tokens stay valid), tokens for the principals admin, writer and reader are
granted the roles of the same names (and "bookie", the bookies' certificate, the bookie
role), and every bookie serves TLS only and authenticates every request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bookie.launcher import BookieProcess
from streamlib.broker.launcher import BrokerProcess

DEFAULT_HOME = Path(os.environ.get("STREAMLIB_HOME", Path.home() / ".streamlib"))
DEFAULT_DATA_DIR = DEFAULT_HOME / "sandbox"
DEFAULT_PORT_BASE = 3181  # BookKeeper's bookie port
DEFAULT_BROKER_PORT = 6650  # Pulsar's broker port (the gRPC front end's)
# Pulsar's binary protocol, beside it (6650 is taken by the gRPC port: pulsar-client is
# given the pulsar_url the sandbox prints).
DEFAULT_PULSAR_PORT = 6660
DEFAULT_PULSAR_ADMIN_PORT = 8080  # Pulsar's admin REST port


def make_private_dir(path: Path) -> Path:
    """path as a directory only its owner may enter (0700), made if absent. Its parents,
    made if absent, get the default mode (they may be shared, as the home directory is);
    an existing directory keeps its mode (it may be the user's own, given by --data-dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def default_metadata_uri(data_dir: Path = DEFAULT_DATA_DIR) -> str:
    return f"sqlite://{data_dir.resolve() / 'meta.db'}"


async def wait_for_bookies(
    metadata_uri: str, enough: Callable[[set[str]], bool], timeout_s: float
) -> None:
    """Until the ids of the registered bookies are `enough` (TimeoutError after
    timeout_s; a watch on the registrations, not a poll)."""
    import metadata
    from metadata.services.bookies import BookieRegistry

    store = await metadata.connect(metadata_uri)
    try:
        registry = BookieRegistry(store)
        deadline = time.monotonic() + timeout_s
        watch = store.watch(registry.path("bookies", "available"), children=True)
        try:
            while not enough({b.bookie_id for b in await registry.list()}):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the bookies did not register in {timeout_s}s")
                try:
                    await watch.next(min(remaining, 1.0))
                except TimeoutError:
                    pass  # re-check: the directory may not have existed yet
        finally:
            await watch.close()
    finally:
        await store.close()


class SandboxError(RuntimeError):
    """The sandbox could not start (a bookie failed, or never registered)."""


class Sandbox:
    def __init__(
        self,
        data_dir: Path,
        *,
        bookies: int = 3,
        metadata_uri: str | None = None,
        port_base: int = DEFAULT_PORT_BASE,
        extra_bookie_args: list[str] | None = None,
        secure: bool = False,
        brokers: int = 1,
        broker_port: int | None = None,
    ) -> None:
        if bookies < 1:
            raise ValueError("a sandbox needs at least one bookie")
        if brokers < 0:
            raise ValueError("--brokers must be >= 0")
        self.data_dir = data_dir.resolve()
        self.metadata_uri = metadata_uri or default_metadata_uri(self.data_dir)
        self.port_base = port_base
        self.security: SecureSetup | None = None
        if secure:  # (its credentials are made now, inside a private data directory)
            self.security = SecureSetup(make_private_dir(self.data_dir) / "security")
        if self.security is not None:
            extra_bookie_args = [*self.security.bookie_args(), *(extra_bookie_args or [])]
        self.processes = [
            BookieProcess(
                self.data_dir / f"bookie-{i}",
                metadata_uri=self.metadata_uri,
                extra=["--bookie-id", f"sandbox-bookie-{i}", *(extra_bookie_args or [])],
            )
            for i in range(bookies)
        ]
        if broker_port is None:
            broker_port = DEFAULT_BROKER_PORT if port_base else 0
        self.broker_port = broker_port
        broker_args = [] if self.security is None else self.security.broker_args()
        self.brokers = [
            BrokerProcess(
                self.data_dir,
                self.metadata_uri,
                name=f"broker-{i}",
                extra=["--broker-id", f"sandbox-broker-{i}", *broker_args],
                pulsar=True,
            )
            for i in range(brokers)
        ]
        for i, broker in enumerate(self.brokers):  # (0: free ports, as the broker port)
            broker.pulsar_port = DEFAULT_PULSAR_PORT + i if broker_port else 0
            broker.pulsar_admin_port = DEFAULT_PULSAR_ADMIN_PORT + i if broker_port else 0

    def start(self, timeout_s: float = 60.0) -> Sandbox:
        make_private_dir(self.data_dir)
        if self.security is not None:
            asyncio.run(self.security.grant_roles(self.metadata_uri))  # before bookies serve
        try:
            for i, process in enumerate(self.processes):
                process.start(port=self.port_base + i if self.port_base else 0)
            asyncio.run(self._wait_registered(timeout_s))
            asyncio.run(self._stream_defaults())
            for i, broker in enumerate(self.brokers):
                broker.start(port=self.broker_port + i if self.broker_port else 0)
        except BaseException:
            self.stop()
            raise
        return self

    async def _wait_registered(self, timeout_s: float) -> None:
        wanted = {p.bookie_id for p in self.processes}
        try:
            await wait_for_bookies(self.metadata_uri, lambda ids: wanted <= ids, timeout_s)
        except TimeoutError:
            raise SandboxError(f"bookies {sorted(wanted)} did not all register") from None

    async def _stream_defaults(self) -> None:
        """With fewer than three bookies, new streams default to as many as there are
        (E = Qw = Qa): a one-bookie sandbox takes `streamlib produce` at once. Set once,
        when the store has no defaults yet; a production cluster keeps E3/Qw2/Qa2
        unless an operator sets others (`streamlib admin streams defaults`)."""
        import metadata
        from metadata.schemas import LedgerConfig, StreamMetadata
        from metadata.services.streams import StreamRegistry

        n = len(self.processes)
        if n >= 3:
            return
        store = await metadata.connect(self.metadata_uri)
        try:
            registry = StreamRegistry(store)
            if await registry.read_defaults() is None:
                config = LedgerConfig(ensemble_size=n, write_quorum=n, ack_quorum=n)
                await registry.write_defaults(StreamMetadata(ledger_config=config))
        finally:
            await store.close()

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "metadata": self.metadata_uri,
            "bookies": [
                {"id": p.bookie_id, "address": p.address, "pid": p.proc.pid if p.proc else None}
                for p in self.processes
            ],
        }
        if self.brokers:
            info["service_url"] = self.service_url
            info["pulsar_url"] = self.brokers[0].pulsar_url
            info["pulsar_admin_url"] = self.brokers[0].pulsar_admin_url
            info["brokers"] = [
                {"id": b.broker_id, "address": b.address, "pid": b.pid,
                 "pulsar_url": b.pulsar_url, "pulsar_admin_url": b.pulsar_admin_url}
                for b in self.brokers
            ]  # fmt: skip
        if self.security is not None:
            info["tls_ca"] = str(self.security.certs.ca)
            info["tokens"] = self.security.tokens
        return info

    def client_options(self, principal: str = "writer") -> dict[str, Any]:
        """Client.connect options for principal ({} for a plaintext sandbox)."""
        if self.security is None:
            return {}
        return {"tls_ca": str(self.security.certs.ca), "token": self.security.tokens[principal]}

    @property
    def service_url(self) -> str:
        """The stream service's URI (streamlib://HOST:PORT,...)."""
        return "streamlib://" + ",".join(b.address for b in self.brokers)

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        for process in self.processes:
            process.stop()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SecureSetup:
    """A secure sandbox's credentials, made once in directory (0700, files 0600)."""

    ROLES = {
        "admin": ["admin"],
        "writer": ["write"],
        "reader": ["read"],
        "bookie": ["bookie"],
        "broker": ["write"],  # the brokers' own principal at the bookies
    }

    def __init__(self, directory: Path) -> None:
        from streamlib.security import (
            CertFiles,
            make_certs,
            make_token,
            new_secret_key,
            write_private,
        )

        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory = directory
        self.secret_file = directory / "token.key"
        if not self.secret_file.exists():
            write_private(self.secret_file, new_secret_key())
        names = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
        if all((directory / n).exists() for n in names):
            self.certs = CertFiles(*(directory / n for n in names))
        else:  # the bookies' certificate names 127.0.0.1: the sandbox binds only there
            self.certs = make_certs(directory, ca_name="streamlib sandbox CA", valid_days=365)
        secret = self.secret_file.read_bytes().strip()
        self.tokens = {p: make_token(secret, p) for p in ("admin", "writer", "reader")}
        self.broker_token = make_token(secret, "broker")
        for principal, token in self.tokens.items():
            write_private(directory / f"{principal}.token", token.encode())
        # The broker reads its token from a file: a command line is every local user's.
        self.broker_token_file = write_private(
            directory / "broker.token", self.broker_token.encode()
        )

    def bookie_args(self) -> list[str]:
        return [
            "--tls-cert", str(self.certs.server_cert),
            "--tls-key", str(self.certs.server_key),
            "--tls-ca", str(self.certs.ca),
            "--auth-token-secret-file", str(self.secret_file),
        ]  # fmt: skip

    def broker_args(self) -> list[str]:
        """A broker serves TLS, takes the same tokens as the bookies, writes to the
        bookies as the principal "broker", and creates no stream on first use (streams
        are made by `streamlib admin streams create`, as a production cluster's)."""
        return [
            "--tls-cert", str(self.certs.server_cert),
            "--tls-key", str(self.certs.server_key),
            "--tls-ca", str(self.certs.ca),
            "--auth-token-secret-file", str(self.secret_file),
            "--token", f"file:{self.broker_token_file}",
            "--allow-auto-create", "false",
        ]  # fmt: skip

    async def grant_roles(self, metadata_uri: str) -> None:
        import metadata
        from metadata.services.principals import PrincipalRoles

        async with await metadata.connect(metadata_uri) as store:
            principals = PrincipalRoles(store)
            for principal, roles in self.ROLES.items():
                await principals.grant(principal, roles)


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass


def run(args: argparse.Namespace) -> int:
    if args.bookies < 1:
        print("streamlib sandbox: --bookies must be >= 1", file=sys.stderr)
        return 2
    temp: tempfile.TemporaryDirectory[str] | None = None
    data_dir = args.data_dir
    if data_dir is None:
        if args.demo:  # a demo leaves nothing behind unless asked to
            temp = tempfile.TemporaryDirectory(prefix="streamlib-demo-")
            data_dir = Path(temp.name)
        else:
            data_dir = DEFAULT_DATA_DIR
    port_base = args.port_base
    if port_base is None:
        port_base = 0 if args.demo else DEFAULT_PORT_BASE
    sandbox = Sandbox(
        Path(data_dir),
        bookies=args.bookies,
        metadata_uri=args.metadata,
        port_base=port_base,
        secure=args.secure,
        brokers=args.brokers,
        broker_port=args.broker_port,
    )
    try:
        sandbox.start()
        info = sandbox.describe()
        if args.json:
            print(json.dumps(info), flush=True)
        else:
            print(f"sandbox ready: {len(sandbox.processes)} bookies")
            print(f"  metadata  {info['metadata']}")
            for b in info["bookies"]:
                print(f"  bookie    {b['id']:<18} {b['address']:<21} pid {b['pid']}")
            for b in info.get("brokers", []):
                print(f"  broker    {b['id']:<18} {b['address']:<21} pid {b['pid']}")
            if sandbox.brokers:
                print(f"  service   {info['service_url']}")
                print(f"  pulsar    {info['pulsar_url']}  (pulsar-client)")
                print(f"  admin     {info['pulsar_admin_url']}  (Pulsar's admin REST API)")
            if sandbox.security is not None:
                where = sandbox.security.directory
                print(f"  tls_ca    {info['tls_ca']}")
                print(f"  tokens    {where}/{{admin,writer,reader}}.token (the roles' names)")
            print("  (Ctrl-C to stop)" if not args.demo else "", flush=True)
        if args.demo:
            from streamlib.demo import run_demo

            return run_demo(
                sandbox.metadata_uri,
                service_url=sandbox.service_url if sandbox.brokers else None,
                writer=sandbox.client_options("writer"),
                reader=sandbox.client_options("reader") if args.secure else None,
            )
        _wait_for_signal()
        return 0
    finally:
        sandbox.stop()
        if temp is not None:
            temp.cleanup()
        if not args.json:
            print("sandbox stopped", flush=True)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "sandbox", help="run a local cluster (bookies + embedded metadata store)"
    )
    parser.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    parser.add_argument(
        "--data-dir", type=Path, help=f"where data lives (default {DEFAULT_DATA_DIR})"
    )
    parser.add_argument(
        "--metadata", help="metadata store URI (default: sqlite in the data directory)"
    )
    parser.add_argument(
        "--port-base",
        type=int,
        help=f"bookie i listens on PORT_BASE + i (default {DEFAULT_PORT_BASE}; 0 = any free port)",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="brokers of the stream service (default 1; 0: direct mode only)",
    )
    parser.add_argument(
        "--broker-port",
        type=int,
        help=f"broker i listens on BROKER_PORT + i (default {DEFAULT_BROKER_PORT}; its Pulsar "
        f"ports on {DEFAULT_PULSAR_PORT} + i and {DEFAULT_PULSAR_ADMIN_PORT} + i); 0: every broker port is any free one",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line once ready")
    parser.add_argument(
        "--demo", action="store_true", help="run an end-to-end demo against the cluster and exit"
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="TLS and token authentication with roles: a throwaway CA, certificates and "
        "tokens in DATA_DIR/security; --json adds tls_ca and tokens",
    )
    parser.set_defaults(run=run)
