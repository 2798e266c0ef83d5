"""Path and value rules shared by every backend (the ONE place they are checked).

ZooKeeper's own rules, made stricter where ZooKeeper would accept something that
surprises: a path is absolute, '/'-separated, without empty, '.' or '..' components
and without control characters. Values are bytes of at most MAX_VALUE_BYTES.
"""

from __future__ import annotations

import re

from metadata.errors import InvalidPathError, InvalidValueError, ValueTooLargeError

MAX_VALUE_BYTES = 1024 * 1024
MAX_PATH_CHARS = 1024
# ZooKeeper appends a 10-digit, zero-padded counter to a sequential node's name; the
# other backends emulate it so names sort the same way everywhere.
SEQUENCE_DIGITS = 10
# C0 and C1 control characters, and DEL.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def validate_path(path: object) -> str:
    if not isinstance(path, str):
        raise InvalidPathError(f"a path must be a str, got {type(path).__name__}")
    if not path.startswith("/"):
        raise InvalidPathError(f"path {path!r} must be absolute (start with '/')")
    if len(path) > MAX_PATH_CHARS:
        raise InvalidPathError(f"path of {len(path)} chars exceeds {MAX_PATH_CHARS}")
    if path == "/":
        return path
    if path.endswith("/"):
        raise InvalidPathError(f"path {path!r} must not end with '/'")
    for part in path[1:].split("/"):
        if part in ("", ".", ".."):
            raise InvalidPathError(f"path {path!r} has an empty, '.' or '..' component")
    if _CONTROL.search(path):
        raise InvalidPathError(f"path {path!r} contains a control character")
    return path


def validate_value(data: object) -> bytes:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidValueError(f"a node value must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_VALUE_BYTES:
        raise ValueTooLargeError(
            f"value of {len(data)} bytes exceeds the {MAX_VALUE_BYTES}-byte limit"
        )
    return data


def validate_version(version: object) -> int:
    if not isinstance(version, int) or isinstance(version, bool) or version < -1:
        raise InvalidValueError(f"a version must be an int >= -1 (-1 = any), got {version!r}")
    return version


def parent_of(path: str) -> str:
    if path == "/":
        raise InvalidPathError("the root has no parent")
    head = path.rsplit("/", 1)[0]
    return head or "/"


def name_of(path: str) -> str:
    return path.rsplit("/", 1)[1]


def join(parent: str, name: str) -> str:
    return parent.rstrip("/") + "/" + name


def ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b'] (the root excluded, nearest last)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def sequential_name(path: str, counter: int) -> str:
    return f"{path}{counter:0{SEQUENCE_DIGITS}d}"
