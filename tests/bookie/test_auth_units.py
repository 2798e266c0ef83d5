"""The bookie's authentication and role check as one layer (bookie/auth.py and the role
table of bookie/ledger_rules.py): token algorithms and refusals, bearer headers,
certificate principals, the table itself, and refusals logged once per principal and
reason. Integration over real processes: tests/integration/test_auth.py."""

from __future__ import annotations

import logging
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bookie.auth import AccessControl, TokenVerifier, bearer_token, certificate_principal
from bookie.errors import UnauthenticatedError, UnauthorizedError
from bookie.ledger_rules import ROLES_ALLOWED, Access, check_access
from bookie.metrics import BookieMetrics

SECRET = b"a cluster's HS256 secret key, 32 bytes or more"


def rsa_pair() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def test_hs256_and_rs256_tokens_name_their_subject():
    assert TokenVerifier(secret=SECRET).principal(jwt.encode({"sub": "a"}, SECRET)) == "a"
    private, public = rsa_pair()
    rs = jwt.encode({"sub": "b", "exp": int(time.time()) + 60}, private, algorithm="RS256")
    assert TokenVerifier(public_key=public).principal(rs) == "b"
    # A token of another algorithm (HS256 to a bookie that verifies RS256) is refused.
    confused = jwt.encode({"sub": "c"}, b"x" * 32, algorithm="HS256")
    with pytest.raises(UnauthenticatedError, match="accepts RS256"):
        TokenVerifier(public_key=public).principal(confused)


@pytest.mark.parametrize(
    ("claims", "key", "says"),
    [
        ({"sub": "a", "exp": 1}, SECRET, "expired at 1970-01-01T00:00:01Z"),
        ({"sub": "a"}, b"another cluster's key, 32 bytes long", "signature is invalid"),
        ({"exp": 4102444800}, SECRET, "no 'sub' claim"),
        ({"sub": ""}, SECRET, "not a principal name"),
    ],
)
def test_bad_tokens_are_refused_saying_why(claims, key, says):
    with pytest.raises(UnauthenticatedError, match=says):
        TokenVerifier(secret=SECRET).principal(jwt.encode(claims, key))


def test_a_verified_token_still_expires():
    verifier = TokenVerifier(secret=SECRET)
    token = jwt.encode({"sub": "a", "exp": 2_000_000_000}, SECRET)
    assert verifier.principal(token, now=1_999_999_999) == "a"
    with pytest.raises(UnauthenticatedError, match="expired"):
        verifier.principal(token, now=2_000_000_000)  # cached signature, fresh clock


def test_bearer_headers_and_certificate_names():
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("x-other", "1")]) is None
    with pytest.raises(UnauthenticatedError, match="Bearer <token>"):
        bearer_token([("authorization", "Basic dXNlcjpwdw==")])
    assert certificate_principal({"x509_common_name": [b"billing"]}) == "billing"
    assert certificate_principal({}) is None


def test_the_role_table():
    assert check_access("w", frozenset({"write"}), Access.FENCE) is None
    for access in (Access.ADD, Access.FENCE, Access.RECOVERY_ADD, Access.WRITE_LAC, Access.ADMIN):
        with pytest.raises(UnauthorizedError, match="'r' may not"):
            check_access("r", frozenset({"read"}), access)
    with pytest.raises(UnauthorizedError):
        check_access("b", frozenset({"bookie"}), Access.ADD)  # copies, never new data
    assert all("admin" in roles for roles in ROLES_ALLOWED.values())  # the superuser
    with pytest.raises(UnauthorizedError, match="has none"):
        check_access("nobody", frozenset(), Access.READ)


class Call:
    def __init__(self, token: str | None) -> None:
        self.token = token

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def test_refusals_are_counted_and_logged_once_per_principal_and_reason(caplog):
    metrics = BookieMetrics()
    control = AccessControl(metrics, tokens=TokenVerifier(secret=SECRET))
    control.set_roles({"reader": ["read"]})
    reader = Call(jwt.encode({"sub": "reader"}, SECRET))
    caplog.set_level(logging.WARNING, logger="bookie.auth")
    for _ in range(5):
        with pytest.raises(UnauthorizedError):
            control.authorize(reader, Access.ADD)
        with pytest.raises(UnauthenticatedError):
            control.authorize(Call(None), Access.READ)
    assert control.authorize(reader, Access.READ) == "reader"
    refusals = [r.getMessage() for r in caplog.records]
    assert len(refusals) == 2, refusals  # one per (principal, reason), not ten
    sample = metrics.registry.get_sample_value
    assert sample("bookie_auth_refusals_total", {"reason": "role"}) == 5
    assert sample("bookie_auth_refusals_total", {"reason": "unauthenticated"}) == 5


def test_without_token_or_certificate_authentication_the_bookie_allows_everyone():
    control = AccessControl(BookieMetrics())
    assert not control.enabled and control.authorize(Call(None), Access.ADMIN) is None


def test_malformed_tokens_are_logged_once_however_they_vary(caplog):
    control = AccessControl(BookieMetrics(), tokens=TokenVerifier(secret=SECRET))
    caplog.set_level(logging.WARNING, logger="bookie.auth")
    for padding in range(20):  # each parser error names another column
        with pytest.raises(UnauthenticatedError, match="malformed"):
            control.authorize(Call("x" * padding + ".e30.sig"), Access.READ)
    assert len(caplog.records) == 1


class CertifiedCall(Call):
    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [b"billing"]}


def test_a_certificate_names_the_principal_when_the_bookie_takes_no_tokens():
    control = AccessControl(BookieMetrics(), certificates=True)
    control.set_roles({"billing": ["read"]})
    # A token from the environment does not hide the certificate from such a bookie.
    assert control.authorize(CertifiedCall("some.token.here"), Access.READ) == "billing"
