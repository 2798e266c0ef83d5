"""The broker's authorization table (streamlib/protocol/service_access.py), as a table:
each role and grant against each operation, and the grants' forms."""

from __future__ import annotations

import re

import pytest

from metadata.errors import InvalidValueError
from metadata.services.principals import decode_grants, validate_grant
from streamlib.errors import UnauthorizedError
from streamlib.protocol.service_access import Caller, Operation, check, grant_covers, may_create

Op = Operation
EVERY = set(Operation)

# role -> the operations it allows (on any stream and subscription)
ALLOWED = {
    "read": {Op.LOOKUP, Op.CONSUME, Op.READ},
    "write": {Op.LOOKUP, Op.CREATE, Op.PRODUCE, Op.CONSUME, Op.READ, Op.MANAGE_SUBSCRIPTION},
    "admin": EVERY,
    "bookie": set(),
}


@pytest.mark.parametrize("role", sorted(ALLOWED))
@pytest.mark.parametrize("operation", list(Operation), ids=lambda o: o.name)
def test_each_role_allows_exactly_its_operations(role: str, operation: Operation) -> None:
    caller = Caller("p", frozenset({role}))
    if operation in ALLOWED[role]:
        check(caller, operation, "orders", "billing")
    else:
        refusal = re.escape(f"principal 'p' may not {operation.value} 'orders'")
        with pytest.raises(UnauthorizedError, match=refusal):
            check(caller, operation, "orders", "billing")


def test_no_role_allows_nothing_and_authentication_off_allows_everything() -> None:
    for operation in Operation:
        with pytest.raises(UnauthorizedError, match="it has no role"):
            check(Caller("nobody"), operation, "orders", "billing")
        check(Caller(None), operation, "orders", "billing")


@pytest.mark.parametrize(
    ("grant", "stream", "subscription", "covered"),
    [
        ("orders/billing", "orders", "billing", True),
        ("orders/billing", "orders", "audit", False),
        ("orders/billing", "orders-eu", "billing", False),
        ("orders/billing", "orders", None, True),  # a lookup of its stream
        ("orders/billing", "other", None, False),
        ("orders/*", "orders", "anything", True),
        ("orders/*", "orders", None, True),
        ("orders/*", "orders2", "x", False),
        ("orders/bill*", "orders", "billing-eu", True),
        ("orders/bill*", "orders", "audit", False),
        ("orders/bill*", "orders", None, True),
        ("team-a-*", "team-a-orders", "x", True),
        ("team-a-*", "team-a-orders", None, True),
        ("team-a-*", "team-b", None, False),
        ("*", "anything", "at-all", True),
        ("orders/billing", "orders-partition-3", "billing", True),  # a partitioned stream's
        ("orders/billing", "orders-partition-3", None, True),
        ("orders/billing", "orders-partition-3", "audit", False),
        ("orders/billing", "orders-partition-x", "billing", False),
    ],
)
def test_grants_cover_their_subscriptions_and_prefixes(
    grant: str, stream: str, subscription: str | None, covered: bool
) -> None:
    assert grant_covers(grant, stream, subscription) is covered


def test_a_grant_allows_consuming_and_managing_its_subscription_only() -> None:
    caller = Caller("billing", frozenset(), ("orders/billing",))
    for operation in (Op.LOOKUP, Op.CONSUME, Op.MANAGE_SUBSCRIPTION):
        check(caller, operation, "orders", "billing")
    check(caller, Op.LOOKUP, "orders")
    for operation in (Op.CREATE, Op.PRODUCE, Op.READ, Op.UNLOAD):
        with pytest.raises(UnauthorizedError):
            check(caller, operation, "orders", "billing")
    with pytest.raises(UnauthorizedError, match="principals grant billing consume orders/audit"):
        check(caller, Op.CONSUME, "orders", "audit")
    with pytest.raises(UnauthorizedError):
        check(caller, Op.LOOKUP, "payments")


def test_creating_needs_both_the_policy_and_a_role_that_may() -> None:
    writer, reader = Caller("w", frozenset({"write"})), Caller("r", frozenset({"read"}))
    assert may_create(writer, True) and not may_create(writer, False)
    assert not may_create(reader, True)
    assert may_create(Caller(None), True) and not may_create(Caller(None), False)


@pytest.mark.parametrize("grant", ["orders/billing", "orders/*", "orders/b*", "team-*", "*"])
def test_well_formed_grants(grant: str) -> None:
    assert validate_grant(grant) == grant


@pytest.mark.parametrize(
    "grant", ["", "orders", "orders/", "/billing", "a/b/c", "or*ders/x", "orders/bi ll", 7, None]
)
def test_malformed_grants_are_refused_saying_the_form(grant: object) -> None:
    with pytest.raises(InvalidValueError, match="a grant is STREAM/SUBSCRIPTION"):
        validate_grant(grant)


def test_a_grants_node_that_is_not_a_map_of_grants_is_an_error_saying_so() -> None:
    assert decode_grants(b'{"p": ["orders/billing"]}') == {"p": ("orders/billing",)}
    for bad in (b"[]", b'{"p": "orders/billing"}', b'{"p": ["orders"]}', b"{{"):
        with pytest.raises(InvalidValueError, match="grants"):
            decode_grants(bad)
