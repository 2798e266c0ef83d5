"""Who is asking, and may they: authentication and authorization at the bookie.

In direct mode a client talks to bookies and the metadata store and to nothing else, so
the bookie is where a principal's roles are enforced (BookKeeper's auth providers,
Pulsar's AuthenticationToken + per-role authorization). A request names its principal
by one of:

- a token: ``authorization: Bearer <JWT>`` in the call's metadata, signed HS256 with
  the cluster's secret key or RS256 with its private key (the bookie holds the secret,
  or the public key); the principal is the token's ``sub`` claim. A token wins over a
  certificate when a client sends both.
- a client certificate (mutual TLS, ``--tls-client-auth``): its common name.

With neither configured the bookie authenticates nobody and allows everything, as
before (the sandbox's plaintext default). With either configured, a request without a
principal it accepts is UNAUTHENTICATED (the message says why: none, expired, forged,
malformed), and a principal may do only what its roles allow
(:data:`bookie.ledger_rules.ROLES_ALLOWED`), roles read from the metadata store's
principal map and followed by a watch. A refusal is counted in
``bookie_auth_refusals_total{reason}`` and logged once per principal and reason, so a
misbehaving client cannot flood the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jwt

from bookie.errors import UnauthenticatedError
from bookie.ledger_rules import Access, check_access
from bookie.metrics import BookieMetrics  # noqa: F401 - (what the bookie passes)

log = logging.getLogger(__name__)

_CACHE_MAX = 4096  # verified tokens remembered (bounded: a client may send many)
_LOGGED_MAX = 4096


class TokenVerifier:
    """Verifies JWTs signed with the cluster's key (HS256 secret or RS256 public key)."""

    def __init__(
        self,
        *,
        secret: bytes | None = None,
        public_key: bytes | None = None,
        server: str = "bookie",  # what refusals call the server (the broker reuses this)
    ) -> None:
        if (secret is None) == (public_key is None):
            raise ValueError("token authentication needs a secret key or a public key (one)")
        self.server = server
        self._key: Any = secret if secret is not None else public_key
        self._algorithms = ["HS256"] if secret is not None else ["RS256"]
        # token -> (principal, expiry or None): a verified signature needs no second check,
        # only the clock does.
        self._verified: dict[str, tuple[str, float | None]] = {}

    @classmethod
    def from_files(
        cls,
        secret_file: Path | None = None,
        public_key_file: Path | None = None,
        *,
        server: str = "bookie",
    ) -> TokenVerifier:
        def read(path: Path, what: str) -> bytes:
            try:
                return path.read_bytes().strip()
            except OSError as e:
                raise ValueError(f"cannot read the token {what} {path}: {e.strerror}") from e

        if secret_file is not None:
            return cls(
                secret=read(secret_file, "secret key (--auth-token-secret-file)"), server=server
            )
        if public_key_file is not None:
            return cls(
                public_key=read(public_key_file, "public key (--auth-token-public-key-file)"),
                server=server,
            )
        raise ValueError(
            "token authentication needs --auth-token-secret-file or ...-public-key-file"
        )

    def principal(self, token: str, now: float | None = None) -> str:
        now = time.time() if now is None else now
        known = self._verified.get(token)
        if known is None:
            known = self._verify(token)
            if len(self._verified) >= _CACHE_MAX:
                self._verified.clear()
            self._verified[token] = known
        principal, expiry = known
        if expiry is not None and now >= expiry:
            raise UnauthenticatedError(
                f"token of {principal!r} expired at {_utc(expiry)}: get a new token",
                kind="expired",
            )
        return principal

    def _verify(self, token: str) -> tuple[str, float | None]:
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=self._algorithms,
                options={"require": ["sub"], "verify_exp": False},  # expiry: checked per call
            )
        except jwt.InvalidAlgorithmError:
            raise UnauthenticatedError(
                f"token is signed with an algorithm this {self.server} does not accept "
                f"(it accepts {self._algorithms[0]})",
                kind="algorithm",
            ) from None
        except jwt.InvalidSignatureError:
            raise UnauthenticatedError(
                "token signature is invalid: it was not signed with this cluster's key",
                kind="signature",
            ) from None
        except jwt.MissingRequiredClaimError:
            raise UnauthenticatedError(
                "token has no 'sub' claim naming its principal", kind="claim"
            ) from None
        except jwt.InvalidTokenError as e:
            raise UnauthenticatedError(f"token is malformed: {e}", kind="malformed") from None
        sub, exp = claims["sub"], claims.get("exp")
        if not isinstance(sub, str) or not sub:
            raise UnauthenticatedError("token's 'sub' claim is not a principal name", kind="claim")
        if exp is not None and not isinstance(exp, int | float):
            raise UnauthenticatedError("token's 'exp' claim is not a time", kind="claim")
        return sub, None if exp is None else float(exp)


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise UnauthenticatedError(
                    "the authorization header must be 'Bearer <token>'", kind="header"
                )
            return token.strip()
    return None


def certificate_principal(auth_context: Mapping[str, Sequence[bytes]]) -> str | None:
    """The common name of a client certificate gRPC verified (mutual TLS), if any."""
    names = auth_context.get("x509_common_name") or ()
    return names[0].decode(errors="replace") if names else None


class Credentials:
    """A caller's credentials where AccessControl looks for them in a gRPC call's
    context, for a call that is not gRPC's (a framed connection, a Pulsar connection):
    a token as the bearer header, a verified client certificate's common name as the
    auth context's."""

    __slots__ = ("_auth", "_metadata")

    def __init__(self, token: str | None, common_name: str | None) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._auth = certificate_context(common_name)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


def certificate_context(common_name: str | None) -> dict[str, list[bytes]]:
    """A verified client certificate's common name as gRPC's auth context holds it."""
    return {"x509_common_name": [common_name.encode()]} if common_name else {}


class AccessControl:
    """Authentication and the role check, for every request path of the service."""

    def __init__(
        self,
        metrics: Any,  # has auth_refusals, a prometheus Counter labelled by reason
        *,
        tokens: TokenVerifier | None = None,
        certificates: bool = False,
        server: str = "bookie",  # what refusals call the server: the broker reuses this
    ) -> None:
        self.metrics = metrics
        self.tokens = tokens
        self.certificates = certificates
        self.server = server
        self.roles: dict[str, frozenset[str]] = {}
        self._logged: set[tuple[str, str]] = set()

    @property
    def enabled(self) -> bool:
        return self.tokens is not None or self.certificates

    def set_roles(self, principals: Mapping[str, Sequence[str]]) -> None:
        self.roles = {p: frozenset(r) for p, r in principals.items()}

    def principal(self, context: Any) -> str | None:
        """Who makes this call (None: authentication is off). UnauthenticatedError when
        it is on and the call names nobody this server accepts."""
        if not self.enabled:
            return None
        try:
            token = bearer_token(context.invocation_metadata())
            if token is not None and self.tokens is not None:
                return self.tokens.principal(token)
            # (A token to a bookie that takes none: the certificate may still name one.)
            if self.certificates:
                name = certificate_principal(context.auth_context())
                if name:
                    return name
            raise UnauthenticatedError(
                f"no credentials: this {self.server} requires "
                + ("a token" if self.tokens is not None else "")
                + (" or " if self.tokens is not None and self.certificates else "")
                + ("a client certificate" if self.certificates else ""),
                kind="none",
            )
        except UnauthenticatedError as e:
            self._refused("unauthenticated", "?", str(e), kind=e.kind)
            raise

    def check(self, principal: str | None, access: Access) -> None:
        """UnauthorizedError unless principal's roles allow access."""
        if principal is None:
            return
        try:
            check_access(principal, self.roles.get(principal, frozenset()), access)
        except Exception as e:
            self.refused_role(principal, str(e))
            raise

    def refused_role(self, principal: str, message: str) -> None:
        """Count and log (once) a principal refused for what its roles do not allow."""
        self._refused("role", principal, message)

    def authorize(self, context: Any, access: Access) -> str | None:
        principal = self.principal(context)
        self.check(principal, access)
        return principal

    def _refused(self, reason: str, principal: str, message: str, kind: str = "") -> None:
        self.metrics.auth_refusals.labels(reason).inc()
        # Logged once per principal and kind of refusal: never keyed on text a caller
        # controls (a malformed token's parser error varies with every byte).
        key = (principal, kind or message)
        if key in self._logged:
            return
        if len(self._logged) >= _LOGGED_MAX:
            self._logged.clear()
        self._logged.add(key)
        log.warning("refused %s: %s", principal if principal != "?" else "a caller", message)


async def follow_principals(store: Any, control: AccessControl, ready: asyncio.Event) -> None:
    """Keep control's roles equal to the metadata store's principal map: read it, then
    re-read on every change. An unreadable map keeps the last one (a fresh bookie starts
    with none: it refuses every principal until the map is read -- fail closed)."""
    from metadata.services.principals import PrincipalRoles

    await follow_node(PrincipalRoles(store), control.set_roles, ready)


async def follow_node(
    service: Any, apply: Callable[[dict[str, tuple[str, ...]]], None], ready: asyncio.Event
) -> None:
    """apply(service.read()'s map) now and after every change of service.node; ready is
    set after the first read that worked."""
    async with service.store.watch(service.node) as watch:
        while True:
            try:
                current, _ = await service.read()
                apply(current)
                ready.set()
            except Exception as e:  # the store is unreachable or the node malformed
                log.error("cannot read %s (keeping the last one): %s", service.node, e)
            try:
                await watch.next(timeout_s=30.0)
            except TimeoutError:
                pass  # re-read anyway: a missed event costs at most this long
