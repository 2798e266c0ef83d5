"""Who may do what: the principal -> roles map every bookie enforces.

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
from metadata.services._base import Service

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


class PrincipalRoles(Service):
    @property
    def node(self) -> str:
        return self.path("security", "principals")

    async def read(self) -> tuple[dict[str, tuple[str, ...]], int]:
        """The map and its version (-1 and {} when nothing was ever granted)."""
        try:
            stored = await self.store.get(self.node)
        except NoNodeError:
            return {}, -1
        return decode_principals(stored.data), stored.version

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
            f"the principals map kept changing under {_CAS_ATTEMPTS} updates; try again"
        )
