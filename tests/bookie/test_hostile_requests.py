"""A client holding a ledger's master key (stream ledgers' keys are derivable) must not be
able to change what the bookie stores: forged rewrites, TRUNCATE on bounded ledgers, a
poisoned LAC, pre-fenced future ledgers, term-less requests on term-mode ledgers.
The rules are bookie/ledger_rules.py; these are the same attacks on a real bookie."""

from __future__ import annotations

from bookie.wire import add_results
from bookie.wire import bookie_pb2 as pb
from metadata.schemas import LedgerMetadata
from metadata.services.ledgers import LedgerMetadataManager
from tests.bookie.conftest import KEY, Cluster, entry
from tests.bookie.test_operations import with_store


def forged(ledger_id: int, entry_id: int, **kw: object) -> pb.AddEntry:
    e = entry(ledger_id, entry_id, **kw)  # type: ignore[arg-type]
    e.payload = b"forged by a client that holds the key"
    return e


def create_metadata(cluster: Cluster, *ledger_ids: int) -> None:
    async def create(store: object) -> None:
        for lid in ledger_ids:
            md = LedgerMetadata(ledger_id=lid, ensemble_size=1, write_quorum=1, ack_quorum=1)
            await LedgerMetadataManager(store).create(md)  # type: ignore[arg-type]

    with_store(cluster.metadata_uri, create)  # type: ignore[arg-type]


def payloads(client: object, ledger_id: int, last: int) -> list[bytes]:
    resp = client.read(ledger_id, 0, last)  # type: ignore[attr-defined]
    assert all(r.status == pb.OK for r in resp.results)
    return [r.entry.payload for r in resp.results]


def test_no_add_replaces_a_stored_entry_with_a_different_one(cluster: Cluster) -> None:
    bookie = cluster.bookie(extra=["--flush-interval", "3600"])
    client = cluster.client(bookie)
    assert all(r.status == pb.OK for r in client.add(entry(1, i) for i in range(6)).values())
    original = payloads(client, 1, 5)

    def attack() -> None:
        # The writer's ledger was closed at entry 5 (a close does not fence its bookies).
        assert client.add_one(forged(1, 3)).status == pb.BAD_REQUEST
        assert client.add_one(forged(1, 4, flags=pb.RECOVERY_ADD)).status == pb.BAD_REQUEST
        # Two copies of one new entry in one batch: the second is refused too.
        request = pb.AddRequest(entries=[entry(1, 9), forged(1, 9)])
        answers = [r for resp in client.stub.AddStream(iter([request])) for r in add_results(resp)]
        assert sorted(r.status for r in answers) == [pb.OK, pb.BAD_REQUEST]
        assert payloads(client, 1, 5) == original

    attack()  # the entries are in the write cache
    assert bookie.stop() == 0
    bookie.start()
    client = cluster.client(bookie)
    attack()  # and from the entry logs
    # A write-back of the same entry (recovery's, with its own LAC) is idempotent.
    assert client.add_one(entry(1, 5, lac=4, flags=pb.RECOVERY_ADD)).status == pb.OK
    assert client.read(1, 9).results[0].entry.payload == entry(1, 9).payload


def test_truncate_is_refused_on_a_bounded_ledger(cluster: Cluster) -> None:
    client = cluster.client(cluster.bookie())
    assert all(r.status == pb.OK for r in client.add(entry(2, i) for i in range(8)).values())
    for term in (0, 5):
        noop = entry(2, 2, lac=1, term=term, flags=pb.TRUNCATE | pb.RECOVERY_ADD)
        assert client.add_one(noop).status == pb.BAD_REQUEST
    assert len(payloads(client, 2, 7)) == 8


def test_an_explicit_lac_never_passes_the_highest_entry_stored(cluster: Cluster) -> None:
    client = cluster.client(cluster.bookie())
    assert all(r.status == pb.OK for r in client.add(entry(3, i) for i in range(4)).values())

    def write_lac(ledger_id: int, lac: int) -> int:
        req = pb.WriteLacRequest(ledger_id=ledger_id, master_key=KEY, last_add_confirmed=lac)
        return client.stub.WriteLac(req).status

    assert write_lac(3, 10**12) == pb.OK
    assert client.read_lac(3).last_add_confirmed == 3  # never past what is written here
    # A LAC written before its entries arrive (they are on their way, or with E > Qw not
    # all for this bookie) is reported as they arrive.
    assert write_lac(3, 5) == pb.OK
    assert client.add_one(entry(3, 4)).status == pb.OK
    assert client.read_lac(3).last_add_confirmed == 4
    # A ledger unknown here gets no state from a LAC write.
    assert write_lac(33, 10**12) == pb.NO_SUCH_LEDGER
    assert client.read_lac(33).status == pb.NO_SUCH_LEDGER
    assert client.add_one(entry(33, 0, key=b"the real writer's key")).status == pb.OK


def test_fences_of_ledgers_absent_from_the_metadata_block_nothing(cluster: Cluster) -> None:
    client = cluster.client(cluster.bookie())
    # Pre-fencing (or pre-claiming a term of) ledger ids not created yet...
    assert client.read_lac(40, flags=pb.FENCE, master_key=b"guess").status == pb.NO_SUCH_LEDGER
    assert client.read(41, 0, flags=pb.FENCE, master_key=KEY).status == pb.NO_SUCH_LEDGER
    assert client.read_lac(42, term=10**9, master_key=KEY).status == pb.NO_SUCH_LEDGER
    # ...leaves their creation alone: the real writers' first adds are accepted.
    assert client.add_one(entry(40, 0)).status == pb.OK
    assert client.add_one(entry(41, 0)).status == pb.OK
    assert client.add_one(entry(42, 0, term=1)).status == pb.OK


def test_a_term_mode_ledger_refuses_requests_without_its_term(cluster: Cluster) -> None:
    client = cluster.client(cluster.bookie())
    assert all(
        r.status == pb.OK for r in client.add(entry(5, i, term=2) for i in range(4)).values()
    )
    stale = client.add_one(entry(5, 4, term=0))
    assert stale.status == pb.INVALID_TERM and stale.term == 2
    # A FENCE flag would block the term writer's adds for ever: term mode fences by term.
    assert client.read_lac(5, flags=pb.FENCE, master_key=KEY).status == pb.BAD_REQUEST
    assert client.add_one(entry(5, 4, term=2)).status == pb.OK
    low = entry(5, 1, term=1, lac=0, flags=pb.TRUNCATE | pb.RECOVERY_ADD)
    assert client.add_one(low).status == pb.INVALID_TERM
    assert len(payloads(client, 5, 4)) == 5
