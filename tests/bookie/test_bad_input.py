"""Hostile and malformed requests get typed answers and leave stored data intact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookie.wire import add_results
from bookie.wire import bookie_pb2 as pb
from tests.bookie.conftest import Client, Cluster, entry, payload_of

PROTECTED = 1000
VALID_STATUSES = set(pb.StatusCode.values()) - {pb.STATUS_UNSPECIFIED}
MAX_ENTRY = 4096


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Client]]:
    cluster = Cluster(Path(tmp_path_factory.mktemp("fuzz")))
    try:
        bookie = cluster.bookie(extra=["--max-entry-bytes", str(MAX_ENTRY)])
        client = cluster.client(bookie)
        assert all(
            r.status == pb.OK for r in client.add(entry(PROTECTED, i) for i in range(20)).values()
        )
        yield cluster, client
    finally:
        cluster.close()


def assert_protected_intact(client: Client) -> None:
    resp = client.read(PROTECTED, 0, 19)
    assert [r.status for r in resp.results] == [pb.OK] * 20
    assert all(r.entry.payload == payload_of(PROTECTED, r.entry_id) for r in resp.results)
    assert not client.read_lac(PROTECTED).fenced


ids = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 5), st.just(PROTECTED))
keys = st.sampled_from([b"", b"wrong-key", b"k" * 2000])
flags = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2, 3]))

add_entries = st.builds(
    pb.AddEntry,
    ledger_id=ids,
    entry_id=ids,
    last_add_confirmed=ids,
    payload=st.one_of(st.binary(max_size=64), st.just(b"x" * (MAX_ENTRY + 1))),
    digest=st.binary(max_size=8),
    master_key=keys,
    flags=flags,
    term=st.integers(0, 2**64 - 1),
    length=ids,
)
reads = st.builds(
    pb.ReadRequest,
    ledger_id=ids,
    first_entry_id=ids,
    last_entry_id=ids,
    flags=flags,
    master_key=keys,
    term=st.integers(0, 2**64 - 1),
    max_bytes=st.integers(0, 2**64 - 1),
)
lac_reads = st.builds(
    pb.ReadLacRequest,
    ledger_id=ids,
    flags=flags,
    master_key=keys,
    term=st.integers(0, 2**64 - 1),
    previous_lac=ids,
    timeout_ms=st.integers(0, 50),
    piggyback_entry=st.booleans(),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=st.lists(add_entries, min_size=1, max_size=5), read=reads, lac_read=lac_reads)
def test_fuzzed_requests_get_typed_answers_and_leave_data_intact(
    fuzz_target: tuple[Cluster, Client],
    batch: list[pb.AddEntry],
    read: pb.ReadRequest,
    lac_read: pb.ReadLacRequest,
) -> None:
    _, client = fuzz_target
    results = client.add(batch)
    assert {(e.ledger_id, e.entry_id) for e in batch} == set(results)
    assert all(r.status in VALID_STATUSES for r in results.values())
    resp = client.stub.ReadEntries(read, timeout=30)
    assert resp.status in VALID_STATUSES
    assert all(r.status in VALID_STATUSES for r in resp.results)
    lac = client.stub.ReadLac(lac_read, timeout=30)
    assert lac.status in VALID_STATUSES
    assert_protected_intact(client)


def test_invalid_fields_are_bad_request_or_too_large(fuzz_target: tuple[Cluster, Client]) -> None:
    _, client = fuzz_target
    assert client.add_one(entry(-1, 0)).status == pb.BAD_REQUEST
    assert client.add_one(entry(1, 0, flags=8)).status == pb.BAD_REQUEST
    assert client.add_one(entry(1, 3, lac=5)).status == pb.BAD_REQUEST
    big = client.add_one(entry(1, 0, size=MAX_ENTRY + 1))
    assert big.status == pb.TOO_LARGE and str(MAX_ENTRY) in big.message
    assert client.read(1, 5, 2).status == pb.BAD_REQUEST
    assert client.read(1, 0, 100_000).status == pb.BAD_REQUEST
    assert client.read(PROTECTED, 0, flags=pb.FENCE).status == pb.BAD_REQUEST  # no key
    assert client.read(PROTECTED, 0, flags=4).status == pb.BAD_REQUEST
    assert client.read_lac(PROTECTED, previous_lac=-5).status == pb.BAD_REQUEST
    assert_protected_intact(client)


def test_malformed_messages_are_bad_request(fuzz_target: tuple[Cluster, Client]) -> None:
    _, client = fuzz_target
    garbage = b"\xff\xff\xff\xff\x0f\x01"
    for method, resp_cls in [
        ("ReadEntries", pb.ReadResponse),
        ("ReadLac", pb.ReadLacResponse),
        ("WriteLac", pb.WriteLacResponse),
        ("Force", pb.ForceResponse),
        ("GetBookieInfo", pb.GetBookieInfoResponse),
    ]:
        call = client.channel.unary_unary(
            f"/streamlib.bookie.v1.Bookie/{method}", response_deserializer=resp_cls.FromString
        )
        assert call(garbage, timeout=30).status == pb.BAD_REQUEST, method
    stream = client.channel.stream_stream(
        "/streamlib.bookie.v1.Bookie/AddStream", response_deserializer=pb.AddResponse.FromString
    )
    (resp,) = list(stream(iter([garbage]), timeout=30))
    assert add_results(resp)[0].status == pb.BAD_REQUEST
    assert_protected_intact(client)


def test_messages_over_the_grpc_cap_are_refused(fuzz_target: tuple[Cluster, Client]) -> None:
    _, client = fuzz_target
    huge = pb.AddRequest(entries=[entry(2, 0, size=65 << 20)])
    with pytest.raises(grpc.RpcError) as err:
        list(client.stub.AddStream(iter([huge]), timeout=30))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_protected_intact(client)
