"""The stream service's ownership rules in the simulator (tests/sim/service.py): brokers
killed, restarted, stopped and cut off past their sessions, falsely evicted behind a
firewall, rolling ledgers and losing them to failures, lose and duplicate nothing
acknowledged; each unsafe variant is caught."""

import pytest

from tests.sim.service import MUTATIONS, run_service_seed
from tests.sim.test_simulation import SEEDS, first_violation


def test_no_invariant_breaks_as_brokers_fail():
    for seed in range(SEEDS):
        run_service_seed(seed)


@pytest.mark.parametrize("mutation", [m for m in MUTATIONS if m != "none"])
def test_the_simulator_catches_each_unsafe_ownership_variant(mutation):
    found = first_violation(lambda seed: run_service_seed(seed, mutation), mutation)
    assert f"--service-mutation {mutation}" in found


def test_a_service_seed_replays_exactly():
    assert run_service_seed(77).trace == run_service_seed(77).trace
