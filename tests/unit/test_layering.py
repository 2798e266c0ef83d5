"""The dependency direction of ARCHITECTURE.md §2, checked on the source (every import
statement anywhere in a module, including inside functions)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

IO_MODULES = {"asyncio", "grpc", "socket", "selectors", "threading", "time", "concurrent", "trio"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, node.module or ""]).strip("."))
            elif node.module:
                found.add(node.module)
    return found


def sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if not p.name.endswith("_pb2.py"))


def top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("path", sources("metadata"), ids=str)
def test_metadata_imports_nothing_of_ours(path):
    bad = {m for m in imports_of(path) if top(m) in {"streamlib", "bookie"}}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", sources("bookie"), ids=str)
def test_bookie_never_imports_the_client(path):
    bad = {m for m in imports_of(path) if top(m) == "streamlib"}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", sources("streamlib/protocol"), ids=str)
def test_protocol_core_is_sans_io_and_self_contained(path):
    found = imports_of(path)
    ours = {m for m in found if top(m) in {"metadata", "bookie"}}
    ours |= {m for m in found if top(m) == "streamlib" and not m.startswith("streamlib.protocol")}
    io = {m for m in found if top(m) in IO_MODULES}
    assert not ours, f"{path} imports {ours}"
    assert not io, f"{path} does I/O through {io}"


# The client may use the bookie's wire, and its process-level tools: the launcher runs
# `bookie serve` as a child process (sandbox, benchmarks) and the bookie benchmark
# drives one over the wire. Neither imports server code (checked below).
CLIENT_SIDE = ("bookie.wire", "bookie.launcher", "bookie.bench")


# The broker (streamlib/broker: a server, ARCHITECTURE 4a) authenticates, authorizes,
# serves TLS and advertises its address exactly as a bookie does: it shares those tools
# of the bookie's -- and nothing of its storage.
SERVER_TOOLS = ("bookie.auth", "bookie.tls", "bookie.addresses", "bookie.errors",
                "bookie.ledger_rules")  # fmt: skip
BROKER_SERVER = (
    "server.py", "cli.py", "access.py", "pulsar_admin.py", "pulsar_server.py", "http_server.py"
)  # fmt: skip


@pytest.mark.parametrize("path", sources("streamlib"), ids=str)
def test_client_uses_only_the_wire_of_the_bookie(path):
    allowed = CLIENT_SIDE
    if path.parent.name == "broker" and path.name in BROKER_SERVER:
        allowed = CLIENT_SIDE + SERVER_TOOLS
    bad = {m for m in imports_of(path) if top(m) == "bookie" and not m.startswith(allowed)}
    assert not bad, f"{path} imports the bookie server: {bad}"


@pytest.mark.parametrize("path", sources("streamlib/service"), ids=str)
def test_the_service_client_imports_no_server_code(path):
    bad = {m for m in imports_of(path) if top(m) == "bookie" or m.startswith("streamlib.broker")}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", sources("streamlib/wire"), ids=str)
def test_the_service_wire_sits_below_client_and_server(path):
    bad = {m for m in imports_of(path) if m.startswith(("streamlib.broker", "streamlib.service"))}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize(
    "path", [*sources("streamlib/broker"), *sources("streamlib/stream")], ids=str
)
def test_nothing_below_the_clients_imports_them(path):
    if path.name == "cli.py":  # (the broker's command line: `unload` is a client's call)
        return
    bad = {m for m in imports_of(path) if m.startswith(("streamlib.service", "streamlib.client"))}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", sources("streamlib/chaos"), ids=str)
def test_the_chaos_verifier_sees_only_what_an_application_sees(path):
    """Its workers reach the stream service through Client.connect, not its package; its
    harness runs brokers as processes (the launcher), never their code."""
    found = imports_of(path)
    bad = {m for m in found if m.startswith("streamlib.service")}
    bad |= {
        m for m in found if m.startswith("streamlib.broker") and m != "streamlib.broker.launcher"
    }
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("module", ["launcher", "bench"])
def test_client_side_bookie_tools_import_no_server_code(module):
    found = imports_of(ROOT / "bookie" / f"{module}.py")
    bad = {m for m in found if top(m) == "bookie" and not m.startswith(CLIENT_SIDE)}
    assert not bad, f"bookie/{module}.py imports {bad}"


def test_every_package_states_its_rule():
    for package in ("metadata", "bookie", "streamlib", "streamlib/protocol", "streamlib/service",
                    "streamlib/wire", "streamlib/chaos"):  # fmt: skip
        doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text()))
        assert doc and "import" in doc, f"{package}/__init__.py must say what it may not import"
