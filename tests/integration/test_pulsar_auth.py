"""pulsar-client against a broker that authenticates tokens and serves TLS
(pulsar+ssl://): AuthenticationToken of a principal whose roles allow producing
produces, a read-only one consumes and may not produce, and no token, a forged one or
an expired one gets nothing (pulsar-client retries until its operation timeout, as
against Pulsar's broker); a client that does not trust the broker's certificate
authority gets nothing either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamlib.security import make_token, write_private
from tests.integration.pulsar_programs import ProgramError, Programs
from tests.integration.test_auth import Secure, secure  # noqa: F401 - (the fixture)

pytestmark = pytest.mark.timeout(180)

TOPIC = "persistent://public/default/secured"


@pytest.fixture
async def programs(tmp_path: Path) -> Any:
    async with Programs(tmp_path) as start:
        yield start


def start_broker(secure: Secure, tmp_path: Path) -> Any:  # noqa: F811
    """A TLS broker taking the cluster's tokens (Pulsar's port is pulsar+ssl://), writing
    to the bookies as "broker"."""
    certs = secure.certs
    token_file = write_private(tmp_path / "broker.token", secure.token("broker").encode())
    [broker] = secure.cluster.start_brokers(1, pulsar=True, extra=[
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-ca", str(certs.ca), "--auth-token-secret-file", str(tmp_path / "token.key"),
        "--token", f"file:{token_file}",
    ])  # fmt: skip
    return broker


async def test_tokens_and_roles_over_pulsar_ssl(secure: Secure, tmp_path: Path, programs):  # noqa: F811
    await secure.set_roles("broker", ["write"])
    broker = start_broker(secure, tmp_path)
    assert broker.pulsar_url.startswith("pulsar+ssl://127.0.0.1:")
    program = await programs()

    async def client(token: str | None, operation_timeout_seconds: int = 30) -> str:
        return await program.client(
            broker.pulsar_url, tls_trust_certs_file_path=str(secure.certs.ca),
            operation_timeout_seconds=operation_timeout_seconds,
            **({} if token is None else {"token": token}),
        )  # fmt: skip

    writer = await client(secure.token("writer"))
    producer, _ = await program.producer(writer, TOPIC)
    await program.send(producer, [{"data": "by the writer"}])

    reader = await client(secure.token("reader"))
    consumer = await program.subscribe(reader, TOPIC, "audit", initial_position="Earliest")
    [message] = await program.receive(consumer, 1)
    assert message["data"] == "by the writer"
    with pytest.raises(ProgramError) as refused:
        await program.producer(reader, TOPIC)
    assert refused.value.error == "AuthorizationError"

    # The broker answers a CONNECT it does not authenticate with ERROR
    # AuthenticationError and closes, as Pulsar's does; pulsar-client (its C++ core)
    # takes that as a broken connection and tries again until its operation timeout.
    forged = make_token(b"another cluster's secret key, 32+ bytes", "writer")
    expired = secure.token("writer", expires_in_s=-60)
    for token, why in ((None, "no credentials: this broker requires a token"),
                       (forged, "token signature is invalid"),
                       (expired, "token of 'writer' expired")):  # fmt: skip
        stranger = await client(token, operation_timeout_seconds=3)
        with pytest.raises(ProgramError) as unauthenticated:
            await program.producer(stranger, TOPIC)
        assert unauthenticated.value.error == "Timeout", token
        assert f"closed: unauthenticated: {why}" in broker.stderr_tail(100_000), why
    # Nothing but the writer's message is stored; the broker serves on.
    more = await program.subscribe(writer, TOPIC, "check", initial_position="Earliest")
    assert [m["data"] for m in await program.drain(more, timeout_ms=1000)] == ["by the writer"]
    # TLS for real: a client that does not trust the broker's CA gets nowhere.
    distrustful = await program.client(broker.pulsar_url, token=secure.token("writer"),
                                       operation_timeout_seconds=3)  # fmt: skip
    with pytest.raises(ProgramError):
        await program.producer(distrustful, TOPIC)
