"""Scripted recoveries of the real state machines over simulated bookies: the seed
scenarios of fencing.txt and protocol.txt, step by step."""

from streamlib.protocol import LedgerState
from streamlib.protocol.actions import EntryData
from streamlib.protocol.errors import StatusCode
from streamlib.protocol.writer import WriterState
from tests.sim.cluster import NetworkConfig
from tests.sim.scenario import LEDGER_ID, MASTER_KEY, Scenario

QUIET = NetworkConfig(min_delay=1, max_delay=1, drop_rate=0.0, timeout=50)


def quiet_scenario(quorums=(2, 2)):
    return Scenario(0, net=QUIET, quorums=quorums, ensemble=("b0", "b1", "b2"))


def settle(scenario):
    while scenario.world.step():
        pass


def store(scenario, bookie, entry_id, lac):
    """Put an entry on one bookie as the writer would have sent it."""
    payload = scenario.payload(entry_id)
    length = sum(len(scenario.payload(e)) for e in range(entry_id + 1))
    entry = EntryData(
        entry_id, lac, length, payload, scenario.digest.compute(entry_id, lac, length, payload)
    )
    assert scenario.world.bookies[bookie].add(LEDGER_ID, entry, MASTER_KEY, 0, 0) == StatusCode.OK


def test_fencing_txt_seed_scenario():
    # E=3, Qw=2: the writer was acknowledged up to entry 11 and wrote entry 12 to one
    # bookie only. Recovery reads 12, writes it back, finds no 13 and closes at 12.
    # Qa=1, so entry 12 may have been acknowledged and one positive must recover it
    # whatever order the answers come in (with Qa=2 a negative first may end at 11).
    s = quiet_scenario(quorums=(2, 1))
    md = s.initial
    for entry_id in range(12):
        for bookie in md.write_set_bookies(entry_id):
            store(s, bookie, entry_id, entry_id - 1)
    store(s, md.write_set_bookies(12)[0], 12, 11)
    s.start_recovery()
    settle(s)
    closed, _ = s.world.metadata.read(LEDGER_ID)
    assert closed.state is LedgerState.CLOSED
    assert closed.last_entry_id == 12
    # entry 12 was written back to its whole write set
    for bookie in closed.write_set_bookies(12):
        assert 12 in s.world.bookies[bookie].ledgers[LEDGER_ID].entries
    assert closed.length == sum(len(s.payload(e)) for e in range(13))
    # ... and every bookie of the ensemble is now fenced
    assert all(s.world.bookies[b].ledgers[LEDGER_ID].state.fenced for b in ("b0", "b1", "b2"))


def test_old_writer_is_fenced_out_after_recovery():
    s = quiet_scenario()
    s.append([s.payload(0), s.payload(1)])
    settle(s)
    assert sorted(s.acked) == [0, 1]
    s.start_recovery()
    settle(s)
    s.written = 2
    s.append([s.payload(2)])
    settle(s)
    assert s.writer.state is WriterState.FAILED
    assert type(s.writer.error).__name__ == "LedgerFencedError"
    closed, _ = s.world.metadata.read(LEDGER_ID)
    assert closed.last_entry_id == 1 and 2 not in s.acked


def test_recovery_aborts_rather_than_close_on_unknowns():
    # Entry 5 is on b0 and b1 (acknowledged, Qa=2) but the bookies' LAC says 4 and both
    # holders are down: the only answer for entry 5 is a NEGATIVE from b2 plus timeouts.
    s = quiet_scenario(quorums=(3, 2))
    for entry_id in range(6):
        for bookie in ("b0", "b1", "b2") if entry_id < 5 else ("b0", "b1"):
            store(s, bookie, entry_id, min(entry_id - 1, 4))
    s.world.bookies["b0"].alive = False
    s.start_recovery()
    s.world.at(0, lambda: setattr(s.world.bookies["b1"], "alive", False))
    aborted = False
    while not aborted and s.world.step():
        aborted = "failed: RecoveryAbortedError" in s.world.trace[-1]
    md, _ = s.world.metadata.read(LEDGER_ID)
    assert aborted
    assert md.state is LedgerState.IN_RECOVERY  # not closed at 3 or 4


def test_concurrent_recoveries_agree_on_the_last_entry():
    s = quiet_scenario()
    for entry_id in range(8):
        for bookie in s.initial.write_set_bookies(entry_id):
            store(s, bookie, entry_id, entry_id - 1)
    store(s, s.initial.write_set_bookies(8)[1], 8, 7)
    for _ in range(10):
        s.start_recovery()
    settle(s)
    closed, _ = s.world.metadata.read(LEDGER_ID)
    # Qw=Qa=2: entry 8 on one bookie may end up either side, but all ten agree.
    assert closed.last_entry_id in (7, 8)
    assert s.recovered_last == [closed.last_entry_id] * 10


def test_a_takeover_never_recovers_a_leftover_an_earlier_term_left_on_a_reused_bookie():
    # Term 2's recovery replaced b0 (unreachable) from entry 5 on with b3; b3 had been a
    # bookie of this ledger before and kept dirty term-1 copies of entries 6 and 7. Term
    # 2 committed entries 5 and 6 on b1 and b2. Term 3's recovery must recover 5 and 6
    # as term 2 wrote them and end there: b3's copies are leftovers (older than their
    # fragment), never Positive answers.
    from streamlib.protocol import Fragment, LedgerMetadata
    from tests.sim.scenario import PASSWORD_HASH
    from tests.sim.unbounded import UnboundedScenario

    s = UnboundedScenario(0, net=QUIET, quorums=(3, 2), ensemble=("b0", "b1", "b2"))
    s.world.metadata.ledgers[LEDGER_ID] = (
        LedgerMetadata(
            LEDGER_ID, 3, 3, 2,
            (Fragment(0, ("b0", "b1", "b2"), term=1), Fragment(5, ("b3", "b1", "b2"), term=2)),
            password_hash=PASSWORD_HASH, term=2, unbounded=True,
        ),
        0,
    )  # fmt: skip

    def put(bookie, entry_id, payload, term, lac=4):
        length = 10 * entry_id + len(payload)
        digest = s.digest.compute(entry_id, lac, length, payload)
        entry = EntryData(entry_id, lac, length, payload, digest)
        assert s.world.bookies[bookie].add(LEDGER_ID, entry, MASTER_KEY, 0, term) == StatusCode.OK

    for entry_id in range(5):
        for bookie in ("b0", "b1", "b2"):
            put(bookie, entry_id, b"e%d" % entry_id, 1)
    for entry_id in (5, 6):
        for bookie in ("b1", "b2"):
            put(bookie, entry_id, b"committed%d" % entry_id, 2)
    put("b3", 6, b"dirty6", 1)
    put("b3", 7, b"dirty7", 1)
    s.final = True  # no new writer's appends after the takeover
    s.start_recovery()
    settle(s)
    done = s.recoveries[-1]
    assert done.last_entry_id == 6
    for bookie in ("b1", "b2", "b3"):
        entries = s.world.bookies[bookie].ledgers[LEDGER_ID].entries
        assert entries[6].payload == b"committed6", bookie
