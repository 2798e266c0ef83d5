"""What every service shares: its root prefix, name checks, and creating directories."""

from __future__ import annotations

import re

from metadata.errors import InvalidNameError, NodeExistsError
from metadata.paths import join, validate_path
from metadata.store import MetadataStore

DEFAULT_ROOT = "/streamlib"

# Stream, subscription and bookie names: one path component, so a name can never
# reach outside its directory. ':' is allowed for "host:port" bookie ids.
_NAME = re.compile(r"[A-Za-z0-9._:-]{1,255}")


def validate_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidNameError(
            f"{kind} name {name!r} must be 1-255 of [A-Za-z0-9._:-], not '.' or '..'"
        )
    return name


def validate_ledger_id(ledger_id: object) -> int:
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) or not 0 <= ledger_id < 2**63:
        raise InvalidNameError(f"ledger id must be an int in [0, 2**63), got {ledger_id!r}")
    return ledger_id


class Service:
    def __init__(self, store: MetadataStore, root: str = DEFAULT_ROOT) -> None:
        self.store = store
        self.root = validate_path(root)
        self._made: set[str] = set()

    def path(self, *parts: str) -> str:
        path = self.root
        for part in parts:
            path = join(path, part)
        return path

    async def ensure(self, path: str) -> None:
        """Create the persistent directory node (and parents) unless it exists."""
        if path in self._made:
            return
        if await self.store.exists(path) is None:
            try:
                await self.store.create(path, make_parents=True)
            except NodeExistsError:
                pass  # another process made it first
        self._made.add(path)
