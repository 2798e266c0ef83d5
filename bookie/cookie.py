"""The bookie's identity cookie: instance id, bookie id and directories.

A copy lives in every directory the bookie owns (``<dir>/cookie``) and one in the
metadata store. A bookie whose disks were wiped has lost entries other bookies and
clients believe it holds, so it must not come back under its old id: when the
metadata store has a cookie for the id but the disks have none, the bookie refuses
to start and says how to decommission it and re-add it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bookie.errors import CookieError
from bookie.journal import write_file_atomically

COOKIE_FILE = "cookie"


@dataclass(frozen=True)
class BookieCookie:
    bookie_id: str
    instance_id: str
    journal_dir: str
    data_dirs: tuple[str, ...]
    created_ms: int = 0

    def same_identity(self, other: BookieCookie) -> bool:
        return (self.bookie_id, self.instance_id, self.journal_dir, self.data_dirs) == (
            other.bookie_id,
            other.instance_id,
            other.journal_dir,
            other.data_dirs,
        )

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> BookieCookie:
        try:
            d = json.loads(raw)
            return cls(
                bookie_id=str(d["bookie_id"]),
                instance_id=str(d["instance_id"]),
                journal_dir=str(d["journal_dir"]),
                data_dirs=tuple(str(x) for x in d["data_dirs"]),
                created_ms=int(d.get("created_ms", 0)),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CookieError(f"{where}: unreadable cookie ({e})") from None


MetaRead = Callable[[], Awaitable[BookieCookie | None]]
MetaWrite = Callable[[BookieCookie], Awaitable[None]]


def _read_local(dirs: list[Path]) -> list[BookieCookie | None]:
    out: list[BookieCookie | None] = []
    for d in dirs:
        p = d / COOKIE_FILE
        out.append(BookieCookie.from_json(p.read_bytes(), str(p)) if p.exists() else None)
    return out


def _wiped_message(bookie_id: str, dirs: list[Path]) -> str:
    return (
        f"bookie {bookie_id}: the metadata store has a cookie for this bookie but "
        f"{', '.join(str(d) for d in dirs)} hold none: its disks were wiped or replaced, so "
        f"entries it acknowledged are gone. It must not rejoin under its old id. "
        f"Decommission it (`streamlib admin decommission {bookie_id}`, which re-replicates "
        f"its ledgers and deletes its cookie), then start it again to re-add it as a new bookie."
    )


async def check_cookie(
    bookie_id: str,
    journal_dir: Path,
    data_dir: Path,
    now_ms: int,
    meta_read: MetaRead | None,
    meta_write: MetaWrite | None,
) -> BookieCookie:
    """Apply the start rules; returns the cookie in force or raises :class:`CookieError`."""
    dirs = [data_dir] if journal_dir == data_dir else [data_dir, journal_dir]
    local = _read_local(dirs)
    remote = await meta_read() if meta_read is not None else None
    present = [c for c in local if c is not None]
    if present and len(present) != len(local):
        missing = [str(d) for d, c in zip(dirs, local, strict=True) if c is None]
        raise CookieError(
            f"bookie {bookie_id}: {', '.join(missing)} has no cookie while the other "
            f"directories do: a directory was wiped or swapped. {_wiped_message(bookie_id, dirs)}"
        )
    for c in present[1:]:
        if not c.same_identity(present[0]):
            raise CookieError(
                f"bookie {bookie_id}: the directories hold cookies of different bookies"
            )
    if not present:
        if remote is not None:
            raise CookieError(_wiped_message(bookie_id, dirs))
        cookie = BookieCookie(
            bookie_id=bookie_id,
            instance_id=str(uuid.uuid4()),
            journal_dir=str(journal_dir.resolve()),
            data_dirs=(str(data_dir.resolve()),),
            created_ms=now_ms,
        )
        # Disks first: a crash before the metadata write leaves a cookie we re-publish.
        for d in dirs:
            write_file_atomically(d / COOKIE_FILE, cookie.to_json())
        if meta_write is not None:
            await meta_write(cookie)
        return cookie
    cookie = present[0]
    if cookie.bookie_id != bookie_id:
        raise CookieError(
            f"the directories belong to bookie {cookie.bookie_id}, not {bookie_id}; start it "
            f"with --bookie-id {cookie.bookie_id} or give it fresh directories"
        )
    if remote is None:
        if meta_write is not None:
            await meta_write(cookie)
        return cookie
    if not remote.same_identity(cookie):
        raise CookieError(
            f"bookie {bookie_id}: the cookie on disk (instance {cookie.instance_id}) does not "
            f"match the metadata store's (instance {remote.instance_id}): another bookie uses "
            f"this id or the directories moved. Decommission the id "
            f"(`streamlib admin decommission {bookie_id}`) before re-adding it."
        )
    return cookie
