"""The broker's dispatch rules (streamlib/protocol/dispatch.py), sans I/O."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlib.protocol.dispatch import SLOTS, ConsumerBusy, Dispatch, Kind, Pending, key_slot


def pending(message_id, slot=0):
    return Pending(f"m{message_id}", message_id, slot)


def offer_all(dispatch, ids, slot=0):
    for message_id in ids:
        dispatch.offer(pending(message_id, slot))


def ids_of(deliveries):
    return [(cid, p.message_id) for cid, p in deliveries]


def by_consumer(deliveries):
    out: dict[object, list[object]] = {}
    for cid, p in deliveries:
        out.setdefault(cid, []).append(p.message_id)
    return out


def keyed(key, message_id):
    return Pending(f"{key}{message_id}", message_id, key_slot(key, message_id))


# -- key_slot ---------------------------------------------------------------------------


def test_key_slot_is_stable_per_key_and_spreads_keyless_messages_by_id():
    assert key_slot("k", 1) == key_slot("k", 2) == key_slot("k", (9, 9, 9))
    assert all(0 <= key_slot(f"k{i}", i) < SLOTS for i in range(200))
    assert len({key_slot(f"k{i}", 0) for i in range(200)}) > 150
    assert key_slot(None, 7) == key_slot(None, 7)
    assert len({key_slot(None, i) for i in range(200)}) > 150


def test_an_ordering_key_decides_the_slot_over_the_key():
    assert (
        key_slot("k1", 1, b"order-7")
        == key_slot("k2", 2, b"order-7")
        == key_slot(None, 3, b"order-7")
    )
    assert key_slot("k", 1, b"k") == key_slot("k", 1)  # the same bytes: the same slot
    assert key_slot("k", 1, None) == key_slot("k", 1)  # none: by the key, as before
    assert len({key_slot("k", 0, b"o%d" % i) for i in range(200)}) > 150


# -- exclusive ----------------------------------------------------------------------------


def test_exclusive_refuses_a_second_consumer_and_other_kinds():
    d = Dispatch(Kind.EXCLUSIVE)
    d.add("a", "a", Kind.EXCLUSIVE)
    with pytest.raises(ConsumerBusy):
        d.add("b", "b", Kind.EXCLUSIVE)
    with pytest.raises(ConsumerBusy):
        d.add("c", "c", Kind.SHARED)
    assert d.consumers() == ["a"]
    d.remove("a")
    with pytest.raises(ConsumerBusy):  # the kind is the subscription's
        d.add("c", "c", Kind.FAILOVER)
    d.add("b", "b", Kind.EXCLUSIVE)  # free again once the first left
    assert d.consumers() == ["b"]


@pytest.mark.parametrize("kind", [Kind.FAILOVER, Kind.SHARED, Kind.KEY_SHARED])
def test_a_consumer_of_another_kind_is_refused(kind):
    d = Dispatch(kind)
    d.add(1, "one", kind)
    for other in Kind:
        if other is not kind:
            with pytest.raises(ConsumerBusy):
                d.add(2, "two", other)
    d.add(3, "three", kind)  # the same kind joins
    assert d.consumers() == [1, 3]


def test_exclusive_delivers_in_order_up_to_permits_and_hands_back_on_leaving():
    d = Dispatch(Kind.EXCLUSIVE)
    d.add("a", "a", Kind.EXCLUSIVE)
    offer_all(d, [1, 2, 3])
    assert d.deliveries() == []  # no permits yet
    d.flow("a", 2)
    assert ids_of(d.deliveries()) == [("a", 1), ("a", 2)]
    assert d.queued() == 1
    d.remove("a")
    d.add("b", "b", Kind.EXCLUSIVE)
    d.flow("b", 10)
    assert ids_of(d.deliveries()) == [("b", 1), ("b", 2), ("b", 3)]


# -- failover -----------------------------------------------------------------------------


def test_failover_only_the_first_consumer_receives():
    d = Dispatch(Kind.FAILOVER)
    d.add("a", "a", Kind.FAILOVER)
    d.add("b", "b", Kind.FAILOVER)
    d.add("c", "c", Kind.FAILOVER)
    assert d.active() == "a"
    d.flow("b", 10)
    d.flow("c", 10)
    offer_all(d, [1, 2])
    assert d.deliveries() == []  # the standbys' permits do not count
    assert not d.wants_more()
    d.flow("a", 1)
    assert d.wants_more()
    assert ids_of(d.deliveries()) == [("a", 1)]
    d.flow("a", 5)
    assert ids_of(d.deliveries()) == [("a", 2)]


def test_failover_hands_unacked_messages_first_in_id_order_to_the_next():
    d = Dispatch(Kind.FAILOVER)
    d.add("a", "a", Kind.FAILOVER)
    d.add("b", "b", Kind.FAILOVER)
    d.add("c", "c", Kind.FAILOVER)
    d.flow("a", 4)
    d.flow("b", 10)
    offer_all(d, [1, 2, 3, 4, 5, 6])
    assert ids_of(d.deliveries()) == [("a", 1), ("a", 2), ("a", 3), ("a", 4)]
    acked = d.ack("a", 3)
    assert acked is not None and acked.message_id == 3
    # unacked by "a", in a scrambled order of acks/arrivals
    assert sorted(p.message_id for p in d.unacked_of("a")) == [1, 2, 4]
    d.remove("a")
    assert d.active() == "b"
    assert ids_of(d.deliveries()) == [("b", 1), ("b", 2), ("b", 4), ("b", 5), ("b", 6)]
    assert d.unacked_of("a") == []
    assert d.ack("a", 1) is None  # a gone consumer's ack is nobody's
    # the standby after "b" only takes over when "b" leaves
    d.flow("c", 10)
    offer_all(d, [7])
    assert ids_of(d.deliveries()) == [("b", 7)]
    d.ack("b", 5)
    d.remove("b")
    assert d.active() == "c"
    assert ids_of(d.deliveries()) == [("c", m) for m in (1, 2, 4, 6, 7)]


def test_failover_a_late_consumer_stands_by():
    d = Dispatch(Kind.FAILOVER)
    d.add("a", "a", Kind.FAILOVER)
    d.flow("a", 1)
    offer_all(d, [1])
    assert ids_of(d.deliveries()) == [("a", 1)]
    d.add("z", "z", Kind.FAILOVER)
    d.flow("z", 10)
    offer_all(d, [2])
    assert d.deliveries() == []
    assert d.active() == "a"
    d.remove("z")
    d.remove("a")
    assert d.active() is None
    assert d.deliveries() == []
    assert d.queued() == 2  # 1 (unacked by "a") then 2
    d.add("y", "y", Kind.FAILOVER)
    d.flow("y", 2)
    assert ids_of(d.deliveries()) == [("y", 1), ("y", 2)]


# -- shared -------------------------------------------------------------------------------


def test_shared_round_robin_over_consumers_with_permits():
    d = Dispatch(Kind.SHARED)
    for cid in "abc":
        d.add(cid, cid, Kind.SHARED)
        d.flow(cid, 2)
    offer_all(d, range(1, 7))
    assert ids_of(d.deliveries()) == [
        ("a", 1),
        ("b", 2),
        ("c", 3),
        ("a", 4),
        ("b", 5),
        ("c", 6),
    ]


def test_shared_skips_consumers_without_permits_and_spends_one_per_message():
    d = Dispatch(Kind.SHARED)
    for cid in "abc":
        d.add(cid, cid, Kind.SHARED)
    d.flow("a", 3)
    d.flow("c", 1)
    offer_all(d, range(1, 8))
    got = d.deliveries()
    assert by_consumer(got) == {"a": [1, 3, 4], "c": [2]}
    assert "b" not in by_consumer(got)
    assert d.queued() == 3  # 4 permits, 4 messages out
    assert d.deliveries() == []  # every permit spent
    d.flow("b", 1)
    assert ids_of(d.deliveries()) == [("b", 5)]
    d.flow("b", 0)
    d.flow("b", -5)  # negative permits take nothing away and give nothing
    assert d.deliveries() == []
    d.flow("nobody", 5)  # an unknown consumer's permits are ignored
    assert d.deliveries() == []


def test_shared_redelivers_a_leaving_consumers_unacked_messages_to_the_others():
    d = Dispatch(Kind.SHARED)
    for cid in "ab":
        d.add(cid, cid, Kind.SHARED)
        d.flow(cid, 2)
    offer_all(d, [1, 2, 3, 4, 5])
    assert by_consumer(d.deliveries()) == {"a": [1, 3], "b": [2, 4]}
    d.ack("a", 1)
    d.remove("a")
    assert d.consumers() == ["b"]
    d.flow("b", 10)
    # a's unacked 3 goes before the never delivered 5
    assert ids_of(d.deliveries()) == [("b", 3), ("b", 5)]
    assert sorted(p.message_id for p in d.unacked_of("b")) == [2, 3, 4, 5]
    d.remove("nobody")  # removing an unknown consumer changes nothing
    assert d.consumers() == ["b"]


def test_shared_negative_ack_and_redelivery_go_first():
    d = Dispatch(Kind.SHARED)
    d.add("a", "a", Kind.SHARED)
    d.flow("a", 3)
    offer_all(d, [1, 2, 3, 4, 5])
    assert [m for _, m in ids_of(d.deliveries())] == [1, 2, 3]
    back = [p for p in (d.take_back("a", m) for m in (2, 1, 3)) if p is not None]
    assert [p.message_id for p in back] == [2, 1, 3]
    assert d.take_back("a", 1) is None  # no longer a's
    assert d.unacked_of("a") == []
    d.redeliver(back)
    d.flow("a", 10)
    assert [m for _, m in ids_of(d.deliveries())] == [1, 2, 3, 4, 5]


def test_shared_wants_more_needs_permits_and_room():
    d = Dispatch(Kind.SHARED, max_pending=3)
    assert not d.wants_more()  # nobody
    d.add("a", "a", Kind.SHARED)
    assert not d.wants_more()  # nobody with permits
    d.flow("a", 10)
    assert d.wants_more()
    offer_all(d, [1, 2])
    assert d.wants_more()
    d.offer(pending(3))
    assert not d.wants_more()  # max_pending queued: read no further
    assert len(d.deliveries()) == 3
    assert d.wants_more()
    d.remove("a")
    assert not d.wants_more()


def test_wants_more_is_false_with_a_full_queue_nobody_can_take():
    d = Dispatch(Kind.SHARED, max_pending=4)
    d.add("a", "a", Kind.SHARED)
    d.flow("a", 1)
    offer_all(d, range(5))
    assert len(d.deliveries()) == 1
    assert d.queued() == 4
    assert not d.wants_more()
    d.flow("a", 1)
    assert not d.wants_more()  # permits, but the queue is full
    assert len(d.deliveries()) == 1
    assert d.queued() == 3
    assert not d.wants_more()  # room, but the permit is spent
    d.flow("a", 1)
    assert d.wants_more()


# -- key_shared ---------------------------------------------------------------------------


def key_shared(*names):
    d = Dispatch(Kind.KEY_SHARED)
    for name in names:
        d.add(name, name, Kind.KEY_SHARED)
    return d


def keys_moving(before, after_names, count=1, staying=0):
    """Keys owned by "a" in `before` that move to the newcomer once `after_names`
    joined (and `staying` keys that stay with their owner)."""
    after = key_shared(*after_names)
    moving, kept = [], []
    for i in range(10_000):
        key = f"key-{i}"
        slot = key_slot(key, None)
        if before.owner(slot) != "a":
            continue
        if after.owner(slot) != "a":
            moving.append(key)
        else:
            kept.append(key)
        if len(moving) >= count and len(kept) >= staying:
            return moving[:count], kept[:staying]
    raise AssertionError("no such keys")


def test_key_shared_one_slot_goes_to_one_consumer():
    d = key_shared("a", "b", "c")
    for cid in "abc":
        d.flow(cid, 1000)
    keys = [f"k{i}" for i in range(40)]
    message_id = 0
    for _ in range(3):
        for key in keys:
            message_id += 1
            d.offer(keyed(key, message_id))
    got = d.deliveries()
    assert len(got) == 120
    owners: dict[int, object] = {}
    for cid, p in got:
        assert owners.setdefault(p.slot, cid) == cid
        assert d.owner(p.slot) == cid
    assert set(owners.values()) == {"a", "b", "c"}  # 40 keys spread over all three
    # within a slot, in id order
    for slot in owners:
        ids = [p.message_id for _, p in got if p.slot == slot]
        assert ids == sorted(ids)


def test_key_shared_sends_one_ordering_key_to_one_consumer_whatever_the_keys():
    d = key_shared("a", "b", "c")
    for cid in "abc":
        d.flow(cid, 1000)
    candidates = [b"order-%d" % i for i in range(100)]
    of_a = next(o for o in candidates if d.owner(key_slot(None, 0, o)) == "a")
    of_b = next(o for o in candidates if d.owner(key_slot(None, 0, o)) == "b")
    for message_id in range(60):  # 60 keys, which alone would go to all three
        ordering_key = of_a if message_id % 2 == 0 else of_b
        slot = key_slot(f"k{message_id}", message_id, ordering_key)
        d.offer(Pending(message_id, message_id, slot))
    assert by_consumer(d.deliveries()) == {"a": list(range(0, 60, 2)), "b": list(range(1, 60, 2))}


def test_key_shared_owner_without_permits_holds_only_its_keys():
    d = key_shared("a", "b")
    keys = {
        cid: [k for k in (f"k{i}" for i in range(100)) if d.owner(key_slot(k, None)) == cid]
        for cid in "ab"
    }
    ka, kb = keys["a"][0], keys["b"][0]
    d.flow("b", 10)
    d.offer(keyed(ka, 1))
    d.offer(keyed(kb, 2))
    d.offer(keyed(ka, 3))
    d.offer(keyed(kb, 4))
    assert ids_of(d.deliveries()) == [("b", 2), ("b", 4)]
    assert d.queued() == 2
    d.flow("a", 1)
    assert ids_of(d.deliveries()) == [("a", 1)]
    d.flow("a", 1)
    assert ids_of(d.deliveries()) == [("a", 3)]


def test_key_shared_a_joining_consumer_waits_for_moved_slots_to_be_acked():
    (moving,), (staying,) = keys_moving(key_shared("a"), ["a", "b"], count=1, staying=1)
    d = key_shared("a")
    d.flow("a", 3)
    d.offer(keyed(moving, 1))
    d.offer(keyed(moving, 2))
    d.offer(keyed(staying, 3))
    assert ids_of(d.deliveries()) == [("a", 1), ("a", 2), ("a", 3)]
    d.add("b", "b", Kind.KEY_SHARED)
    d.flow("a", 10)
    d.flow("b", 10)
    assert d.owner(key_slot(moving, None)) == "b"
    assert d.owner(key_slot(staying, None)) == "a"
    d.offer(keyed(moving, 4))
    d.offer(keyed(staying, 5))
    d.offer(keyed(moving, 6))
    # 4 and 6 wait: "a" still holds 1 and 2 of their slot; the staying key flows
    assert ids_of(d.deliveries()) == [("a", 5)]
    d.ack("a", 2)
    assert d.deliveries() == []  # 1 still unacked by "a"
    d.ack("a", 1)
    assert ids_of(d.deliveries()) == [("b", 4), ("b", 6)]


def test_key_shared_a_waiting_slots_later_messages_wait_behind_it():
    (moving,), _ = keys_moving(key_shared("a"), ["a", "b"])
    d = key_shared("a")
    d.flow("a", 1)
    d.offer(keyed(moving, 1))
    assert ids_of(d.deliveries()) == [("a", 1)]
    d.add("b", "b", Kind.KEY_SHARED)
    d.offer(keyed(moving, 2))
    d.offer(keyed(moving, 3))
    assert d.deliveries() == []  # b has no permits yet, and a holds 1
    d.ack("a", 1)
    d.flow("b", 1)
    # only one permit: 2 goes, 3 stays queued behind it (never before it)
    assert ids_of(d.deliveries()) == [("b", 2)]
    assert d.queued() == 1
    d.flow("b", 1)
    assert ids_of(d.deliveries()) == [("b", 3)]


def test_key_shared_a_blocked_slot_does_not_hold_other_slots():
    (moving,), (staying,) = keys_moving(key_shared("a"), ["a", "b"], staying=1)
    d = key_shared("a")
    d.flow("a", 1)
    d.offer(keyed(moving, 1))
    d.deliveries()
    d.add("b", "b", Kind.KEY_SHARED)
    d.flow("a", 5)
    d.flow("b", 5)
    d.offer(keyed(moving, 2))
    d.offer(keyed(staying, 3))
    d.offer(keyed(moving, 4))
    d.offer(keyed(staying, 5))
    assert ids_of(d.deliveries()) == [("a", 3), ("a", 5)]
    d.ack("a", 1)
    assert ids_of(d.deliveries()) == [("b", 2), ("b", 4)]


def test_key_shared_a_leaving_consumers_messages_go_first_in_order():
    d = key_shared("a", "b")
    key = next(k for k in (f"k{i}" for i in range(1000)) if d.owner(key_slot(k, None)) == "a")
    d.flow("a", 2)
    for message_id in range(1, 6):
        d.offer(keyed(key, message_id))
    assert ids_of(d.deliveries()) == [("a", 1), ("a", 2)]
    d.ack("a", 1)
    d.remove("a")
    assert d.owner(key_slot(key, None)) == "b"
    d.flow("b", 2)
    assert ids_of(d.deliveries()) == [("b", 2), ("b", 3)]
    d.flow("b", 10)
    assert ids_of(d.deliveries()) == [("b", 4), ("b", 5)]


def test_key_shared_a_leaving_consumer_frees_its_slots_for_the_others():
    (moving,), _ = keys_moving(key_shared("a"), ["a", "b"])
    d = key_shared("a")
    d.flow("a", 1)
    d.offer(keyed(moving, 1))
    d.deliveries()
    d.add("b", "b", Kind.KEY_SHARED)
    d.flow("b", 10)
    d.offer(keyed(moving, 2))
    assert d.deliveries() == []  # "a" holds 1
    d.remove("a")  # 1 comes back first, then 2
    assert ids_of(d.deliveries()) == [("b", 1), ("b", 2)]


def test_key_shared_consistent_hashing_moves_only_the_newcomers_or_leavers_slots():
    slots = range(0, SLOTS, 97)
    d = key_shared("a", "b", "c")
    before = {s: d.owner(s) for s in slots}
    d.add("d", "d", Kind.KEY_SHARED)
    joined = {s: d.owner(s) for s in slots}
    assert all(joined[s] in (before[s], "d") for s in slots)
    shares = {cid: sum(joined[s] == cid for s in slots) / len(slots) for cid in "abcd"}
    assert all(0.1 < share < 0.45 for share in shares.values()), shares  # roughly even
    d.remove("b")
    left = {s: d.owner(s) for s in slots}
    assert all(left[s] == joined[s] for s in slots if joined[s] != "b")
    assert "b" not in left.values()
    d.remove("a")
    d.remove("c")
    d.remove("d")
    assert d.owner(0) is None


def test_key_shared_wants_more_is_bounded():
    d = Dispatch(Kind.KEY_SHARED, max_pending=2)
    d.add("a", "a", Kind.KEY_SHARED)
    assert not d.wants_more()
    d.flow("a", 1)
    assert d.wants_more()
    d.offer(keyed("x", 1))
    d.offer(keyed("x", 2))
    assert not d.wants_more()
    assert len(d.deliveries()) == 1
    assert not d.wants_more()  # room again, but no permits
    d.flow("a", 1)
    assert d.wants_more()


# -- key_shared: random operations ----------------------------------------------------------

KEYS = ["red", "green", "blue", "cyan", "magenta", None]  # slots spread over c0..c3
NAMES = ["c0", "c1", "c2", "c3"]

OFFER = st.tuples(st.just("offer"), st.sampled_from(KEYS))
FLOW = st.tuples(st.just("flow"), st.integers(0, 7), st.integers(1, 3))  # (pick, permits)
ACK = st.tuples(st.just("ack"), st.integers(0, 1000))
operations = st.lists(
    st.one_of(
        OFFER,
        OFFER,
        OFFER,
        FLOW,
        FLOW,
        ACK,
        ACK,
        st.tuples(st.just("add"), st.sampled_from(NAMES)),
        st.tuples(st.just("remove"), st.integers(0, 7)),
        st.tuples(st.just("nack"), st.integers(0, 1000)),
        st.tuples(st.just("redeliver")),
        st.tuples(st.just("deliver")),
    ),
    min_size=20,
    max_size=100,
)


class KeySharedModel:
    """Drives a key_shared Dispatch and checks every delivery against a model."""

    def __init__(self, with_nacks):
        self.d = Dispatch(Kind.KEY_SHARED, max_pending=10_000)
        self.with_nacks = with_nacks
        self.offered = {}  # message id -> slot
        self.acked = set()
        self.held = {}  # message id -> consumer (unacknowledged)
        self.nacked = []  # taken back, not yet redelivered
        self.redelivered = set()  # ids ever handed back (a leaver's or a nack)
        self.last_first = {}  # (consumer, slot) -> last id delivered there for the first time
        self.delivered_once = set()

    def deliver(self):
        for cid, p in self.d.deliveries():
            mid, slot = p.message_id, p.slot
            assert cid in self.d.consumers()
            assert self.offered[mid] == slot
            assert mid not in self.acked, "an acknowledged message delivered again"
            assert mid not in self.held, "a message delivered while someone holds it"
            # (a) a slot's unacknowledged messages are all with one consumer
            others = {c for m, c in self.held.items() if self.offered[m] == slot and c != cid}
            assert not others, f"slot {slot} held by {others} while {mid} goes to {cid}"
            assert self.d.owner(slot) == cid
            if not self.with_nacks:
                # per-key order: every earlier message of the slot is acked or held here
                for earlier, earlier_slot in self.offered.items():
                    if earlier_slot == slot and earlier < mid:
                        assert earlier in self.acked or self.held.get(earlier) == cid
            # (c) a consumer's first deliveries of a slot come in id order
            if mid not in self.redelivered:
                last = self.last_first.get((cid, slot), -1)
                assert mid > last
                self.last_first[(cid, slot)] = mid
            assert (mid not in self.delivered_once) or (mid in self.redelivered)
            self.delivered_once.add(mid)
            self.held[mid] = cid

    def apply(self, op):
        d = self.d
        match op:
            case ("offer", key):
                mid = len(self.offered)
                slot = key_slot(key, mid)
                self.offered[mid] = slot
                d.offer(Pending(mid, mid, slot))
            case ("add", name):
                if name not in d.consumers():
                    d.add(name, name, Kind.KEY_SHARED)
            case ("remove", pick) if d.consumers():
                name = d.consumers()[pick % len(d.consumers())]
                mine = {m for m, c in self.held.items() if c == name}
                assert {p.message_id for p in d.unacked_of(name)} == mine
                d.remove(name)
                for m in mine:
                    del self.held[m]
                self.redelivered |= mine
            case ("flow", pick, permits):
                if d.consumers():
                    d.flow(d.consumers()[pick % len(d.consumers())], permits)
            case ("ack", pick):
                if self.held:
                    mid = sorted(self.held)[pick % len(self.held)]
                    acked = d.ack(self.held.pop(mid), mid)
                    assert acked is not None and acked.message_id == mid
                    self.acked.add(mid)
            case ("nack", pick):
                if self.held and self.with_nacks:
                    mid = sorted(self.held)[pick % len(self.held)]
                    back = d.take_back(self.held.pop(mid), mid)
                    assert back is not None and back.message_id == mid
                    self.nacked.append(back)
                    self.redelivered.add(mid)
            case ("redeliver",):
                d.redeliver(self.nacked)
                self.nacked = []
            case ("deliver",):
                self.deliver()
        for name in d.consumers():
            assert {p.message_id for p in d.unacked_of(name)} == {
                m for m, c in self.held.items() if c == name
            }

    def drain(self):
        """(b) with every consumer given permits and everything acked, all goes out."""
        d = self.d
        d.redeliver(self.nacked)
        self.nacked = []
        if not d.consumers():
            d.add("last", "last", Kind.KEY_SHARED)
        for _ in range(len(self.offered) + 2):
            for name in d.consumers():
                d.flow(name, 1000)
            self.deliver()
            for mid, cid in sorted(self.held.items()):
                assert d.ack(cid, mid) is not None
                self.acked.add(mid)
            self.held.clear()
            if d.queued() == 0:
                break
        assert d.queued() == 0
        assert self.acked == set(self.offered)


def run_model(ops, eager, with_nacks):
    """eager: deliver after every event, as the broker does; else only on "deliver"."""
    model = KeySharedModel(with_nacks=with_nacks)
    for op in ops:
        model.apply(op)
        if eager:
            model.deliver()
    model.drain()


@settings(max_examples=300, deadline=None)
@given(operations, st.booleans())
def test_key_shared_keeps_per_key_order_under_random_operations(ops, eager):
    run_model(ops, eager, with_nacks=False)


@settings(max_examples=300, deadline=None)
@given(operations, st.booleans())
def test_key_shared_with_negative_acks_never_splits_a_slot_and_loses_nothing(ops, eager):
    run_model(ops, eager, with_nacks=True)


def test_a_consumer_that_never_acknowledges_stops_getting_messages_at_max_unacked() -> None:
    dispatch = Dispatch(Kind.SHARED, max_unacked=3)
    dispatch.add("c", "c", Kind.SHARED)
    dispatch.flow("c", 100)
    for i in range(5):
        dispatch.offer(Pending(i, i, i))
    assert [p.message_id for _, p in dispatch.deliveries()] == [0, 1, 2]
    assert not dispatch.wants_more()  # permits, but nothing more may go to it
    dispatch.ack("c", 0)
    assert [p.message_id for _, p in dispatch.deliveries()] == [3]


# -- byte budgets -----------------------------------------------------------------------


def sized(message_id, size, slot=0):
    return Pending(f"m{message_id}", message_id, slot, size)


@pytest.mark.parametrize("kind", [Kind.EXCLUSIVE, Kind.SHARED, Kind.KEY_SHARED])
def test_a_consumer_granting_every_permit_and_never_acking_holds_at_most_its_byte_budget(kind):
    dispatch = Dispatch(kind, max_pending_bytes=10_000, max_unacked_bytes=3_000)
    dispatch.add("c", "c", kind)
    dispatch.flow("c", 2**32 - 1)
    held = 0
    for message_id in range(100):
        if not dispatch.wants_more():
            break
        dispatch.offer(sized(message_id, 1_000))
        held += sum(p.size for _, p in dispatch.deliveries())
    assert held == 3_000  # three of 1,000 bytes, then nothing more until acks
    assert not dispatch.wants_more()
    dispatch.ack("c", 0)
    assert dispatch.wants_more()


def test_the_read_ahead_is_bounded_by_bytes():
    """Messages read and not yet handed out (a key_shared slot waiting for its owner,
    say) stop the reading at max_pending_bytes, however few they are."""
    dispatch = Dispatch(Kind.SHARED, max_pending=1000, max_pending_bytes=5_000)
    dispatch.add("c", "c", Kind.SHARED)
    dispatch.flow("c", 1000)
    offered = 0
    while dispatch.wants_more() and offered < 100:
        dispatch.offer(sized(offered, 2_000))
        offered += 1
    assert offered == 3  # 6,000 bytes queued >= the 5,000 budget
    assert len(dispatch.deliveries()) == 3
    assert dispatch.wants_more()


def test_a_message_larger_than_a_budget_still_goes_alone():
    dispatch = Dispatch(Kind.EXCLUSIVE, max_pending_bytes=100, max_unacked_bytes=100)
    dispatch.add("c", "c", Kind.EXCLUSIVE)
    dispatch.flow("c", 10)
    dispatch.offer(sized(0, 1_000_000))
    assert ids_of(dispatch.deliveries()) == [("c", 0)]
    dispatch.offer(sized(1, 10))
    assert dispatch.deliveries() == []  # over budget until the big one is acknowledged
    dispatch.ack("c", 0)
    assert ids_of(dispatch.deliveries()) == [("c", 1)]


def test_bytes_come_back_when_a_consumer_leaves_or_the_cursor_is_reset():
    dispatch = Dispatch(Kind.SHARED, max_unacked_bytes=2_000, max_pending_bytes=10_000)
    for cid in ("a", "b"):
        dispatch.add(cid, cid, Kind.SHARED)
    dispatch.flow("a", 10)
    for message_id in range(3):
        dispatch.offer(sized(message_id, 1_000))
    assert ids_of(dispatch.deliveries()) == [("a", 0), ("a", 1)]
    dispatch.remove("a")  # its two go back first, with the third still queued
    dispatch.flow("b", 10)
    assert ids_of(dispatch.deliveries()) == [("b", 0), ("b", 1)]
    dispatch.reset()
    dispatch.flow("b", 10)
    dispatch.offer(sized(9, 1_000))
    assert ids_of(dispatch.deliveries()) == [("b", 9)]
