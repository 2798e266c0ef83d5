"""Who may do what: the principal -> roles map every bookie enforces, and the
principal -> subscription grants map the brokers add to it.

One node (``security/principals``) holds the whole map as JSON, CAS'd as a whole, so a
bookie reads it in one get and follows it with one watch: a grant or a revoke reaches
every bookie within one watch delivery. Principals are what authentication yields (a
token's ``sub`` claim, a client certificate's common name); roles are the four the
bookie knows (read, write, admin, bookie; see bookie/ledger_rules.py for what each
allows). The map is not secret (it holds no credential); changing it is what an
administrator's metadata-store identity is for.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from metadata.errors import BadVersionError, InvalidValueError, NodeExistsError, NoNodeError
from metadata.services._base import Service, validate_name

ROLES = ("read", "write", "admin", "bookie")
_CAS_ATTEMPTS = 20


def validate_principal(principal: object) -> str:
    """A principal is any printable name (a certificate's common name may hold spaces):
    the map is one JSON node, so names never become paths."""
    if (
        not isinstance(principal, str)
        or not 0 < len(principal) <= 255
        or not principal.isprintable()
        or principal != principal.strip()
    ):
        raise InvalidValueError(
            f"principal {principal!r} must be 1-255 printable characters, no outer spaces"
        )
    return principal


def validate_roles(roles: object) -> tuple[str, ...]:
    """roles as a tuple in the canonical order; anything but a list of known role names
    is an InvalidValueError."""
    if not isinstance(roles, list | tuple) or not all(isinstance(r, str) for r in roles):
        raise InvalidValueError(f"roles must be a list of names, got {roles!r}")
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise InvalidValueError(f"unknown role(s) {unknown}; the roles are {list(ROLES)}")
    return tuple(r for r in ROLES if r in roles)


def decode_principals(data: bytes) -> dict[str, tuple[str, ...]]:
    """The map stored in the node; a node that is not such a map is an error that says
    where (an operator may have written it by hand)."""
    try:
        raw = json.loads(data or b"{}")
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        return {validate_principal(p): validate_roles(r) for p, r in raw.items()}
    except (ValueError, InvalidValueError) as exc:
        raise InvalidValueError(
            f"the principals node holds no principal -> roles map: {exc}"
        ) from None


class _PrincipalMap(Service):
    """One JSON node mapping principal -> a tuple of names, CAS'd as a whole."""

    NODE = ""

    @property
    def node(self) -> str:
        return self.path("security", self.NODE)

    def decode(self, data: bytes) -> dict[str, tuple[str, ...]]:
        raise NotImplementedError

    async def read(self) -> tuple[dict[str, tuple[str, ...]], int]:
        """The map and its version (-1 and {} when nothing was ever granted)."""
        try:
            stored = await self.store.get(self.node)
        except NoNodeError:
            return {}, -1
        return self.decode(stored.data), stored.version

    async def _update(
        self, principal: str, change: Callable[[tuple[str, ...]], tuple[str, ...]]
    ) -> tuple[str, ...]:
        for _ in range(_CAS_ATTEMPTS):
            current, version = await self.read()
            after = change(current.get(principal, ()))
            if after:
                current[principal] = after
            else:
                current.pop(principal, None)
            data = json.dumps({p: list(r) for p, r in sorted(current.items())}, indent=1).encode()
            try:
                if version < 0:
                    await self.ensure(self.path("security"))
                    await self.store.create(self.node, data)
                else:
                    await self.store.set(self.node, data, version=version)
                return tuple(after)
            except (BadVersionError, NodeExistsError):
                continue  # another grant or revoke moved it: apply ours to theirs
        raise BadVersionError(
            f"the {self.NODE} map kept changing under {_CAS_ATTEMPTS} updates; try again"
        )


class PrincipalRoles(_PrincipalMap):
    NODE = "principals"

    def decode(self, data: bytes) -> dict[str, tuple[str, ...]]:
        return decode_principals(data)

    async def grant(self, principal: str, roles: list[str]) -> tuple[str, ...]:
        """Add roles to principal; its roles afterwards."""
        validate_principal(principal)
        wanted = validate_roles(roles)
        return await self._update(principal, lambda have: validate_roles([*have, *wanted]))

    async def revoke(self, principal: str, roles: list[str] | None = None) -> tuple[str, ...]:
        """Take roles (all of them when None) from principal; its roles afterwards."""
        validate_principal(principal)
        gone = set(ROLES if roles is None else validate_roles(roles))
        return await self._update(principal, lambda have: tuple(r for r in have if r not in gone))


# -- subscription grants (the brokers') ------------------------------------------------

MAX_GRANTS_PER_PRINCIPAL = 1000


def validate_grant(grant: object) -> str:
    """A grant of a subscription: ``STREAM/SUB``, or a prefix of one ending in ``*``
    (``orders/*``, ``orders/audit-*``, ``team-a-*``, ``*``). See
    streamlib/protocol/service_access.py for what a grant allows."""
    form = "a grant is STREAM/SUBSCRIPTION or a prefix ending in '*' (orders/billing, orders/*)"
    if not isinstance(grant, str) or not grant:
        raise InvalidValueError(f"{form}: {grant!r}")
    prefix = grant.endswith("*")
    stream, slash, subscription = (grant[:-1] if prefix else grant).partition("/")
    try:
        if not prefix and not slash:
            raise InvalidValueError("it names no subscription")
        if stream or not prefix:
            validate_name("stream", stream)
        if subscription or (slash and not prefix):
            validate_name("subscription", subscription)
    except (ValueError, InvalidValueError) as exc:  # (InvalidNameError is a ValueError)
        raise InvalidValueError(f"{form}: {grant!r}: {exc}") from None
    return grant


def decode_grants(data: bytes) -> dict[str, tuple[str, ...]]:
    try:
        raw = json.loads(data or b"{}")
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        out: dict[str, tuple[str, ...]] = {}
        for principal, grants in raw.items():
            if not isinstance(grants, list):
                raise ValueError(f"grants of {principal!r} are not a list")
            out[validate_principal(principal)] = tuple(sorted({validate_grant(g) for g in grants}))
        return out
    except (ValueError, InvalidValueError) as exc:
        raise InvalidValueError(
            f"the grants node holds no principal -> grants map: {exc}"
        ) from None


class SubscriptionGrants(_PrincipalMap):
    """Which subscriptions each principal may consume and manage through the brokers,
    whatever its roles (Pulsar's subscription permissions)."""

    NODE = "grants"

    def decode(self, data: bytes) -> dict[str, tuple[str, ...]]:
        return decode_grants(data)

    async def grant(self, principal: str, grants: list[str]) -> tuple[str, ...]:
        validate_principal(principal)
        wanted = {validate_grant(g) for g in grants}

        def add(have: tuple[str, ...]) -> tuple[str, ...]:
            after = tuple(sorted({*have, *wanted}))
            if len(after) > MAX_GRANTS_PER_PRINCIPAL:
                raise InvalidValueError(
                    f"{principal!r} would hold {len(after)} grants: at most "
                    f"{MAX_GRANTS_PER_PRINCIPAL} (grant a prefix instead)"
                )
            return after

        return await self._update(principal, add)

    async def revoke(self, principal: str, grants: list[str] | None = None) -> tuple[str, ...]:
        validate_principal(principal)
        gone = None if grants is None else {validate_grant(g) for g in grants}
        return await self._update(
            principal, lambda have: () if gone is None else tuple(g for g in have if g not in gone)
        )
