"""The README's "Security" section, as written: the secure sandbox and its JSON line, the
Python snippet that connects with it, the token and principals commands, and the CLI's
TLS and token flags (credentials never on a command line)."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest

import streamlib
from streamlib.errors import UnauthorizedError
from tests.cli.conftest import assert_one_line_error, run_cli

README = Path(__file__).resolve().parents[2] / "README.md"


def security_section() -> str:
    text = README.read_text()
    return text[text.index("## Security") : text.index("## Operating a bookie")]


@pytest.fixture
def secure_sandbox(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The README's snippet, run as written but on a temporary data dir and free ports:
    it starts `streamlib sandbox --secure --json` and connects as the writer."""
    (snippet,) = re.findall(r"```python\n(.*?)```", security_section(), flags=re.S)
    argv = f'["{sys.executable}", "-m", "streamlib.cli", "sandbox", "--secure", "--json", '
    argv += f'"--data-dir", "{tmp_path / "sandbox"}", "--port-base", "0"]'
    snippet = snippet.replace('["streamlib", "sandbox", "--secure", "--json"]', argv)
    names: dict[str, Any] = {}
    exec(compile(snippet, "README.md", "exec"), names)
    try:
        yield names
    finally:
        names["client"].close()
        names["sandbox"].send_signal(signal.SIGTERM)
        names["sandbox"].wait(timeout=60)
        names["sandbox"].stdout.close()


def test_the_secure_sandbox_snippet_connects_as_the_writer(secure_sandbox, tmp_path):
    j, client = secure_sandbox["j"], secure_sandbox["client"]
    assert set(j["tokens"]) == {"admin", "writer", "reader"} and Path(j["tls_ca"]).exists()
    security = tmp_path / "sandbox" / "security"
    assert stat.S_IMODE(os.stat(security).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(security / "token.key").st_mode) == 0o600

    producer = client.create_producer("orders")
    producer.send(b"order 1")
    with streamlib.connect(j["metadata"], tls_ca=j["tls_ca"], token=j["tokens"]["reader"]) as r:
        reader = r.create_reader("orders", start=streamlib.EARLIEST)
        assert reader.read_next(timeout=10).data == b"order 1"
        with pytest.raises(UnauthorizedError, match="'reader' may not"):
            r.create_producer("orders")
    producer.send(b"order 2")  # the reader disturbed nothing

    # The CLI with the README's flags: the token from a file or the environment.
    token_file = tmp_path / "writer.token"
    token_file.write_text(j["tokens"]["writer"])
    tls = ["--tls-ca", j["tls_ca"]]
    done = run_cli("produce", "orders", "-m", "from cli", *tls, "--token", f"file:{token_file}",
                   metadata=j["metadata"])  # fmt: skip
    assert done.code == 0, done
    env = {"READER_TOKEN": j["tokens"]["reader"]}
    done = run_cli("read", "orders", "--from", "earliest", "-n", "3", *tls,
                   "--token", "env:READER_TOKEN", metadata=j["metadata"], env=env)  # fmt: skip
    assert done.code == 0 and "from cli" in done.out, done
    # Without a token the bookies refuse; a token on the command line is a usage error.
    assert_one_line_error(
        run_cli("produce", "orders", "-m", "x", *tls, metadata=j["metadata"]),
        "UnauthenticatedError",
        "no credentials",
    )
    literal = run_cli("produce", "orders", "-m", "x", "--token", j["tokens"]["writer"])
    assert literal.code == 2 and "not the token itself" in literal.err


def test_the_token_and_principals_commands_work_as_written(tmp_path):
    section = security_section()
    for command in ("token create-secret", "token create", "admin principals grant"):
        assert f"streamlib {command}" in section
    key = tmp_path / "token.key"
    assert run_cli("token", "create-secret", "--output", str(key)).code == 0
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    again = run_cli("token", "create-secret", "--output", str(key))
    assert again.code == 1 and "invalidate" in again.err  # never overwrites a key
    made = run_cli("token", "create", "--secret-file", str(key), "--subject", "billing",
                   "--expires-in", "86400")  # fmt: skip
    assert made.code == 0, made
    claims = jwt.decode(made.out.strip(), key.read_bytes().strip(), algorithms=["HS256"])
    assert claims["sub"] == "billing" and claims["exp"] > 0

    uri = f"sqlite://{tmp_path / 'meta.db'}"
    subprocess.run([sys.executable, "-c", f"import asyncio, metadata; "
                    f"asyncio.run(metadata.connect({uri!r}))"], check=True)  # fmt: skip
    granted = run_cli("admin", "principals", "grant", "billing", "write", "read", "--json",
                      metadata=uri)  # fmt: skip
    assert json.loads(granted.out) == {"principal": "billing", "roles": ["read", "write"]}
    revoked = run_cli("admin", "principals", "revoke", "billing", "write", metadata=uri)
    assert revoked.code == 0 and revoked.out.strip() == "billing: read"
    listed = run_cli("admin", "principals", "list", "--json", metadata=uri)
    assert json.loads(listed.out) == {"billing": ["read"]}
    assert run_cli("admin", "principals", "revoke", "billing", metadata=uri).code == 0
    assert json.loads(run_cli("admin", "principals", "list", "--json", metadata=uri).out) == {}
    bad = run_cli("admin", "principals", "grant", "billing", "superuser", metadata=uri)
    assert bad.code == 2  # not a role


def test_the_broker_takes_its_token_from_a_file_never_from_its_command_line(tmp_path):
    uri = f"sqlite://{tmp_path / 'absent' / 'meta.db'}"  # (never reached)
    token = jwt.encode({"sub": "broker"}, "a secret key of 32 bytes or more.", "HS256")
    literal = run_cli("broker", "--metadata", uri, "--port", "0", "--token", token)
    assert literal.code == 2 and "not the token itself" in literal.err, literal
    missing = run_cli("broker", "--metadata", uri, "--token", f"file:{tmp_path / 'none'}")
    assert missing.code == 2 and "cannot read the --token file" in missing.err, missing


def test_a_password_in_a_metadata_uri_on_the_command_line_is_refused(tmp_path):
    uri = "zk://127.0.0.1:1/streamlib?auth=digest:admin:s3cret"
    assert_one_line_error(run_cli("admin", "streams", "list", metadata=uri), "process list")
    bookie = subprocess.run(
        [sys.executable, "-m", "bookie", "serve", "--data-dir", str(tmp_path / "b"),
         "--metadata", uri],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert bookie.returncode == 1 and b"process list" in bookie.stderr
    assert b"s3cret" not in bookie.stderr


def test_bench_stream_secure_reports_the_cost_of_tls_next_to_plaintext():
    done = run_cli("bench", "stream", "--messages", "2000", "--seconds", "0.3", "--rate", "200",
                   "--low-rate", "100", "--blocking-sends", "100", "--secure")  # fmt: skip
    assert done.code == 0, done
    table = done.out[done.out.index("TLS + token authentication") :]
    for row in ("blocking send p50", "publish throughput", "end-to-end p99, low", "catch-up reads"):
        (line,) = [x for x in table.splitlines() if x.strip().startswith(row)]
        assert line.count("msgs/s" if "reads" in row or "throughput" in row else "ms") >= 2
        assert line.rstrip().endswith("%")


def test_consume_grants_are_granted_listed_and_revoked(tmp_path):
    """`principals grant NAME consume STREAM/SUB`: a subscription the brokers let the
    principal consume and manage; a malformed grant is a usage error saying the form."""
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    subprocess.run([sys.executable, "-c", f"import asyncio, metadata; "
                    f"asyncio.run(metadata.connect({uri!r}))"], check=True)  # fmt: skip
    granted = run_cli("admin", "principals", "grant", "billing", "consume", "invoices/billing",
                      "orders/*", metadata=uri)  # fmt: skip
    assert granted.code == 0, granted.err
    assert "consume invoices/billing orders/*" in granted.out
    listed = run_cli("admin", "principals", "list", metadata=uri)
    assert "billing" in listed.out and "invoices/billing" in listed.out
    bad = run_cli("admin", "principals", "grant", "billing", "consume", "invoices", metadata=uri)
    assert bad.code == 1 and "a grant is STREAM/SUBSCRIPTION" in bad.err
    assert run_cli("admin", "principals", "grant", "billing", "consume", metadata=uri).code == 2
    revoked = run_cli("admin", "principals", "revoke", "billing", "consume", "orders/*",
                      metadata=uri)  # fmt: skip
    assert revoked.code == 0 and "consume invoices/billing" in revoked.out
    assert "orders/*" not in revoked.out
