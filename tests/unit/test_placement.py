"""Placement: recently failed bookies are avoided, never banned while they are needed."""

import random

import pytest

from streamlib.ledger.placement import Candidate, PlacementPolicy
from streamlib.protocol.errors import NotEnoughBookiesError

FIVE = [Candidate(f"b{i}") for i in range(5)]


def test_new_ensembles_fill_up_with_recently_failed_bookies_when_healthy_ones_run_short():
    policy = PlacementPolicy(rnd=random.Random(1))
    for bookie in ("b0", "b1", "b2"):  # three distinct failures within the memory
        policy.record_failure(bookie)
    chosen = policy.new_ensemble(FIVE, 3, 2)
    assert len(set(chosen)) == 3
    assert {"b3", "b4"} <= set(chosen)  # the healthy ones first


def test_replacements_prefer_healthy_bookies_and_then_the_longest_ago_failed():
    policy = PlacementPolicy(rnd=random.Random(2))
    policy.record_failure("b3")
    policy.record_failure("b4")
    assert policy.replacements(FIVE, 1, exclude={"b0", "b1"}) == ["b2"]
    assert policy.replacements(FIVE, 2, exclude={"b0", "b1"}) in (["b2", "b3"], ["b3", "b2"])
    assert policy.replacements(FIVE, 1, exclude={"b0", "b1", "b2"}) == ["b3"]


def test_placement_still_refuses_when_too_few_bookies_are_writable():
    policy = PlacementPolicy()
    with pytest.raises(NotEnoughBookiesError, match="need 3 writable bookies, 2 available"):
        policy.new_ensemble(FIVE[:2], 3, 2)
