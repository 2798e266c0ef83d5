"""Parsing metadata URIs and opening the backend they name (metadata.connect).

ZooKeeper credentials are a secret, and a URI is not: it lands on command lines (ps
shows them to every local user), in logs and in error messages. So besides the inline
``auth=digest:user:password`` (kept for programs and tests), a zk URI can name a file
that holds them (``auth_file=``), and with neither the store takes them from the
environment ($STREAMLIB_ZK_AUTH). CLIs refuse inline credentials (credentials_in_uri).
TLS is switched on by the URI (``tls=true``, it decides which port speaks what) and
configured by connect() keywords or $STREAMLIB_ZK_TLS_CA / _CERT / _KEY.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qs, parse_qsl, unquote, urlsplit

from metadata.errors import InvalidURIError, InvalidValueError, UnknownSchemeError
from metadata.paths import validate_path
from metadata.store import MetadataStore

SCHEMES = ("zk", "sqlite", "memory")
OPTIONS: dict[str, set[str]] = {
    "memory": set(),
    "sqlite": {"poll_interval_s", "busy_timeout_s", "synchronous"},
    "zk": {"connect_timeout_s", "operation_timeout_s", "tls_ca", "tls_cert", "tls_key"},
}
# What a zk URI's query may hold. Anything else is refused rather than ignored: a
# misspelt "tls=true" must not quietly connect in plaintext.
ZK_URI_OPTIONS = {"auth", "auth_file", "tls", "connect_timeout_s", "operation_timeout_s"}
AUTH_ENV = "STREAMLIB_ZK_AUTH"
TLS_ENV = {
    "tls_ca": "STREAMLIB_ZK_TLS_CA",
    "tls_cert": "STREAMLIB_ZK_TLS_CERT",
    "tls_key": "STREAMLIB_ZK_TLS_KEY",
}
# An auth file holds one short line; a bigger one is not an auth file.
MAX_AUTH_FILE_BYTES = 4096


@dataclass(frozen=True)
class MetadataURI:
    scheme: str
    hosts: str = ""  # zk: "h1:p1,h2:p2"
    path: str = ""  # zk: the chroot; sqlite: the database file; memory: the shared name
    auth: tuple[str, str] | None = None  # zk digest credentials given inline
    options: dict[str, str] = field(default_factory=dict)
    auth_file: str | None = None  # zk: the file holding digest:user:password
    tls: bool = False  # zk: speak TLS to the servers


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


def credentials_in_uri(uri: str) -> bool:
    """True when the URI carries a password (auth=...). A command line must not: every
    local user can read it; use auth_file= or $STREAMLIB_ZK_AUTH there."""
    _, sep, query = uri.partition("?")
    query = query.partition("#")[0]
    return bool(sep) and any(key == "auth" for key, _ in parse_qsl(query, keep_blank_values=True))


def redact_uri(uri: str) -> str:
    """The URI safe to print or log: a zk digest password becomes the word PASSWORD."""
    base, sep, query = uri.partition("?")
    if not sep:
        return uri
    items = []
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        # Decoded as parse_uri decodes it, so "%61uth=" cannot smuggle a password out.
        if unquote(key.replace("+", " ")) == "auth" and eq:
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
    unknown = set(query) - ZK_URI_OPTIONS
    if unknown:
        raise InvalidURIError(
            f"{redact_uri(uri)!r}: a zk URI takes no option {sorted(unknown)}; it takes "
            f"{sorted(ZK_URI_OPTIONS)} (tls_ca, tls_cert, tls_key are connect() keywords "
            f"or ${TLS_ENV['tls_ca']}, ...)"
        )
    auth = None
    if "auth" in query:
        auth = parse_digest(query.pop("auth"))
        if auth is None:
            raise InvalidURIError(f"{redact_uri(uri)!r}: auth must be digest:user:password")
    auth_file = query.pop("auth_file", None)
    if auth_file is not None:
        if auth is not None:
            raise InvalidURIError(f"{redact_uri(uri)!r}: give auth or auth_file, not both")
        if not os.path.isabs(auth_file):
            raise InvalidURIError(f"{redact_uri(uri)!r}: auth_file must be an absolute path")
    tls = query.pop("tls", "false").lower()
    if tls not in ("true", "false"):
        raise InvalidURIError(f"{redact_uri(uri)!r}: tls must be true or false, not {tls!r}")
    return MetadataURI(
        "zk",
        hosts=netloc,
        path=chroot,
        auth=auth,
        options=query,
        auth_file=auth_file,
        tls=tls == "true",
    )


def parse_digest(text: str) -> tuple[str, str] | None:
    """(user, password) from "digest:user:password"; None when text is not that."""
    scheme, _, credentials = text.partition(":")
    user, sep, password = credentials.partition(":")
    if scheme != "digest" or not sep or not user:
        return None
    return user, password


def zk_credentials(parsed: MetadataURI) -> tuple[str, str] | None:
    """The digest identity a zk store uses: inline auth, else the auth_file's, else
    $STREAMLIB_ZK_AUTH's, else none (an anonymous client, which reads but cannot
    change what an identity created). Messages never quote the secret."""
    if parsed.auth is not None:
        return parsed.auth
    if parsed.auth_file is not None:
        return _read_auth_file(parsed.auth_file)
    from_env = os.environ.get(AUTH_ENV)
    if not from_env:
        return None
    credentials = parse_digest(from_env.strip())
    if credentials is None:
        raise InvalidValueError(f"${AUTH_ENV} is malformed; it must be digest:user:password")
    return credentials


def _read_auth_file(path: str) -> tuple[str, str]:
    expected = "it must hold one line, digest:user:password (surrounding blanks ignored)"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_AUTH_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidURIError(
            f"auth_file {path}: cannot read it ({exc.strerror}); {expected}"
        ) from exc
    try:
        lines = raw.decode("utf-8").strip().splitlines()
    except UnicodeDecodeError:
        lines = []
    credentials = parse_digest(lines[0]) if len(lines) == 1 else None
    if len(raw) > MAX_AUTH_FILE_BYTES or credentials is None:
        raise InvalidURIError(f"auth_file {path}: malformed; {expected}")
    return credentials


def _zk_options(parsed: MetadataURI, options: dict[str, object]) -> dict[str, object]:
    """connect()'s keywords for ZooKeeperStore: the URI's timeouts under the keywords,
    the TLS files from $STREAMLIB_ZK_TLS_* when tls=true and no keyword names them."""
    merged: dict[str, object] = {}
    for key, value in parsed.options.items():
        try:
            merged[key] = float(value)
        except ValueError:
            raise InvalidURIError(f"{key} must be a number of seconds, got {value!r}") from None
    merged.update(options)
    if not parsed.tls:
        given = sorted(key for key in TLS_ENV if merged.get(key) is not None)
        if given:
            raise InvalidValueError(f"{given} take effect with TLS only: add tls=true to the URI")
        return merged
    for key, env in TLS_ENV.items():
        if merged.get(key) is None:
            merged[key] = os.environ.get(env) or None
    return merged


async def connect(uri: str, *, session_timeout_s: float = 10.0, **options: object) -> MetadataStore:
    """Open the store named by uri: "memory://[name]", "sqlite:///abs/path/meta.db" or
    "zk://host:port[,host:port]/chroot[?auth_file=/path&tls=true]".

    Options (keyword): sqlite takes poll_interval_s, busy_timeout_s, synchronous;
    zk takes connect_timeout_s, operation_timeout_s (default: the session timeout) and,
    with tls=true, tls_ca, tls_cert, tls_key: PEM files (the CA that signed the servers'
    certificates, a client certificate and its key), by default $STREAMLIB_ZK_TLS_CA,
    $STREAMLIB_ZK_TLS_CERT, $STREAMLIB_ZK_TLS_KEY. Credentials: see zk_credentials.
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
        auth=zk_credentials(parsed),
        tls=parsed.tls,
        **_zk_options(parsed, options),  # type: ignore[arg-type]
    ).start()
