"""Parsing metadata URIs and opening the backend they name (metadata.connect)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from metadata.errors import InvalidURIError, InvalidValueError, UnknownSchemeError
from metadata.paths import validate_path
from metadata.store import MetadataStore

SCHEMES = ("zk", "sqlite", "memory")
OPTIONS: dict[str, set[str]] = {
    "memory": set(),
    "sqlite": {"poll_interval_s", "busy_timeout_s", "synchronous"},
    "zk": {"connect_timeout_s", "operation_timeout_s"},
}


@dataclass(frozen=True)
class MetadataURI:
    scheme: str
    hosts: str = ""  # zk: "h1:p1,h2:p2"
    path: str = ""  # zk: the chroot; sqlite: the database file; memory: the shared name
    auth: tuple[str, str] | None = None  # zk digest credentials
    options: dict[str, str] = field(default_factory=dict)


def parse_uri(uri: object) -> MetadataURI:
    if not isinstance(uri, str) or "://" not in uri:
        raise InvalidURIError(f"{uri!r} is not a metadata URI (zk://, sqlite:///, memory://)")
    scheme = uri.split("://", 1)[0]
    if scheme not in SCHEMES:
        raise UnknownSchemeError(f"unknown metadata scheme {scheme!r} in {uri!r}; use {SCHEMES}")
    try:
        parts = urlsplit(uri)
        query = {
            k: v[-1] for k, v in parse_qs(parts.query, strict_parsing=bool(parts.query)).items()
        }
    except ValueError as exc:
        raise InvalidURIError(f"malformed metadata URI {uri!r}: {exc}") from exc
    if scheme == "memory":
        name = parts.netloc + parts.path
        if not all(c.isalnum() or c in "-_." for c in name):
            raise InvalidURIError(f"memory store name {name!r} must be [A-Za-z0-9._-]")
        return MetadataURI("memory", path=name, options=query)
    if scheme == "sqlite":
        if parts.netloc or not parts.path.startswith("/") or parts.path.endswith("/"):
            raise InvalidURIError(f"{uri!r}: write sqlite:///absolute/path/to/meta.db")
        return MetadataURI("sqlite", path=os.path.normpath(parts.path), options=query)
    return _parse_zk(uri, parts.netloc, parts.path or "/", query)


def redact_uri(uri: str) -> str:
    """The URI safe to print or log: a zk digest password becomes the word PASSWORD."""
    base, sep, query = uri.partition("?")
    if not sep:
        return uri
    items = []
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if key == "auth" and eq:
            scheme, _, credentials = unquote(value).partition(":")
            item = f"auth={scheme}:{credentials.partition(':')[0]}:PASSWORD"
        items.append(item)
    return f"{base}?{'&'.join(items)}"


def _parse_zk(uri: str, netloc: str, chroot: str, query: dict[str, str]) -> MetadataURI:
    if not netloc:
        raise InvalidURIError(f"{uri!r}: write zk://host:port[,host:port]/chroot")
    for host_port in netloc.split(","):
        host, sep, port = host_port.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidURIError(f"{uri!r}: {host_port!r} is not host:port")
    try:
        chroot = validate_path(chroot.rstrip("/") or "/")
    except ValueError as exc:
        raise InvalidURIError(f"{uri!r}: bad chroot: {exc}") from exc
    auth = None
    if "auth" in query:
        scheme, _, credentials = query.pop("auth").partition(":")
        user, sep, password = credentials.partition(":")
        if scheme != "digest" or not sep or not user:
            raise InvalidURIError(f"{uri!r}: auth must be digest:user:password")
        auth = (user, password)
    return MetadataURI("zk", hosts=netloc, path=chroot, auth=auth, options=query)


async def connect(uri: str, *, session_timeout_s: float = 10.0, **options: object) -> MetadataStore:
    """Open the store named by uri: "memory://[name]", "sqlite:///abs/path/meta.db" or
    "zk://host:port[,host:port]/chroot[?auth=digest:user:password]".

    Options (keyword): sqlite takes poll_interval_s, busy_timeout_s, synchronous;
    zk takes connect_timeout_s, operation_timeout_s (default: the session timeout).
    """
    parsed = parse_uri(uri)
    if session_timeout_s <= 0:
        raise InvalidValueError(f"session_timeout_s must be > 0, got {session_timeout_s}")
    unknown = set(options) - OPTIONS[parsed.scheme]
    if unknown:
        raise InvalidValueError(
            f"{parsed.scheme}:// takes no option {sorted(unknown)}; "
            f"it takes {sorted(OPTIONS[parsed.scheme]) or 'none'}"
        )
    if parsed.scheme == "memory":
        from metadata.backends.memory import MemoryStore

        return MemoryStore(parsed.path)
    if parsed.scheme == "sqlite":
        from metadata.backends.sqlite import SqliteStore

        return await SqliteStore(
            parsed.path,
            session_timeout_s=session_timeout_s,
            **options,  # type: ignore[arg-type]
        ).start()
    from metadata.backends.zookeeper import ZooKeeperStore

    return await ZooKeeperStore(
        parsed.hosts,
        parsed.path,
        session_timeout_s=session_timeout_s,
        auth=parsed.auth,
        **options,  # type: ignore[arg-type]
    ).start()
