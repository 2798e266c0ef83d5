"""The bookie's identity cookie: instance id, bookie id, directories and cluster.

A copy lives in every directory the bookie owns (``<dir>/cookie``) and one in the
metadata store. It stops two mistakes that lose acknowledged entries:

- A bookie whose disks were wiped has lost entries other bookies and clients believe
  it holds, so it must not come back under its old id: when the metadata store has a
  cookie for the id but the disks have none, the bookie refuses to start and says how
  to decommission it and re-add it.
- A bookie with data started against the wrong metadata store (a mistyped URI, a new
  or wiped store, another cluster's) would take every ledger it holds for deleted and
  garbage-collect it. Every cookie records the cluster instance id
  (metadata.services.cluster), and the bookie refuses a store whose id is missing or
  different, as BookKeeper does.

The start rules, first matching row wins. L = the cookie on the disks, R = the store's
cookie for this bookie id, S = the store's cluster instance id, C = the cluster L
names (for a cookie written before cluster ids existed: the one R names, else none).

    L         R                 S, C                        outcome
    in some directories only    -                           refuse: a directory wiped
    none      none              -                           new bookie: S made unless
                                                            present; L, then R written
    none      present           -                           refuse: disks wiped
    of another bookie id        -                           refuse: wrong --bookie-id
    present   other identity    -                           refuse: another bookie's id
    present   -                 --allow-new-cluster         adopt S (made unless present)
    present   -                 C set, S absent             refuse: not its store
    present   -                 C set, S != C               refuse: another cluster
    present   -                 C set, S == C               start; R written if absent
                                                            (or if it lacks C)
    present   same identity     C unset                     adopt S (made unless present)
    present   none              C unset                     refuse: nothing ties them

Adopting rewrites L, then R, with S. "R written if absent" is the re-publish of a
cookie whose store write a crash interrupted (the disks are written first so that
crash cannot brick the bookie); it is only safe because the cluster ids match.
A cookie older than cluster ids (C unset) is adopted only when the store holds the
same bookie's cookie: that store is the one the bookie was formatted against.
Without a metadata store only L is kept and checked.
"""

from __future__ import annotations

import json
import logging
import shlex
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

from bookie.errors import CookieError
from bookie.journal import write_file_atomically

log = logging.getLogger(__name__)

COOKIE_FILE = "cookie"


@dataclass(frozen=True)
class BookieCookie:
    bookie_id: str
    instance_id: str
    journal_dir: str
    data_dirs: tuple[str, ...]
    created_ms: int = 0
    cluster_instance_id: str = ""  # "" = written before cluster ids existed: unknown

    def same_identity(self, other: BookieCookie) -> bool:
        """Same bookie and directories; the cluster is checked (and adopted) apart."""
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
                cluster_instance_id=str(d.get("cluster_instance_id", "")),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CookieError(f"{where}: unreadable cookie ({e})") from None


class CookieMetadata(Protocol):
    """What the start rules need of the metadata store (bookie.meta.MetadataLink)."""

    @property
    def uri(self) -> str:
        """The store's URI, safe to print (no password)."""

    async def read_cookie(self) -> BookieCookie | None: ...

    async def write_cookie(self, cookie: BookieCookie, *, replace: bool = False) -> None:
        """Create the store's cookie, or with replace=True overwrite the one there."""

    async def read_cluster_instance(self) -> str | None: ...

    async def create_cluster_instance(self) -> str:
        """The store's cluster instance id, made now if it has none."""


def _read_local(dirs: list[Path]) -> list[BookieCookie | None]:
    out: list[BookieCookie | None] = []
    for d in dirs:
        p = d / COOKIE_FILE
        out.append(BookieCookie.from_json(p.read_bytes(), str(p)) if p.exists() else None)
    return out


def bookie_id_on_disk(journal_dir: Path, data_dir: Path) -> str | None:
    """The bookie id a cookie in these directories names, if any: a bookie's id is a
    stable name, kept across restarts whatever address it comes back on."""
    for d in (data_dir, journal_dir):
        found = _read_local([d])[0] if d.exists() else None
        if found is not None:
            return found.bookie_id
    return None


def _write_local(dirs: list[Path], cookie: BookieCookie) -> None:
    for d in dirs:
        write_file_atomically(d / COOKIE_FILE, cookie.to_json())


def decommission_command(bookie_id: str, meta: CookieMetadata | None) -> str:
    """The admin command that re-replicates a bookie's ledgers and deletes its cookie,
    ready to paste (the store's URI included, so it acts on this bookie's store)."""
    command = f"streamlib admin decommission {shlex.quote(bookie_id)}"
    return command if meta is None else f"{command} --metadata {shlex.quote(meta.uri)}"


def _wiped_message(bookie_id: str, dirs: list[Path], meta: CookieMetadata | None) -> str:
    return (
        f"bookie {bookie_id}: the metadata store has a cookie for this bookie but "
        f"{', '.join(str(d) for d in dirs)} hold none: its disks were wiped or replaced, so "
        f"entries it acknowledged are gone. It must not rejoin under its old id. "
        f"Decommission it (`{decommission_command(bookie_id, meta)}`, which re-replicates "
        f"its ledgers and then deletes its cookie), then start it again to re-add it as a "
        f"new bookie."
    )


def _partly_wiped_message(
    bookie_id: str, missing: list[str], kept: list[str], meta: CookieMetadata | None
) -> str:
    # The directories that kept their cookie hold part of the old identity: left as they
    # are, they would refuse the next start again, so the advice says to empty them.
    kept_dirs = ", ".join(kept)
    if meta is None:
        steps = f"Empty {kept_dirs}"
    else:
        steps = (
            f"Decommission it (`{decommission_command(bookie_id, meta)}`, which re-replicates "
            f"its ledgers and then deletes its cookie), empty {kept_dirs}"
        )
    return (
        f"bookie {bookie_id}: {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} "
        f"no cookie while {kept_dirs} {'has' if len(kept) == 1 else 'have'} one: a directory "
        f"was wiped or swapped, so entries it acknowledged are gone. It must not rejoin under "
        f"its old id. {steps}, then start it again to re-add it as a new bookie."
    )


_GC_DANGER = (
    "Starting here would take every ledger this bookie holds for deleted and garbage-collect it."
)


def _allow_advice(target: str) -> str:
    return (
        f"Only to move this bookie into {target} on purpose (the ledgers on it that this "
        f"store does not list are then garbage-collected), start it once with "
        f"--allow-new-cluster."
    )


def _no_cluster_message(bookie_id: str, meta: CookieMetadata, ours: str) -> str:
    return (
        f"bookie {bookie_id}: the metadata store {meta.uri} has no cluster instance id, but "
        f"this bookie's directories belong to cluster {ours}: a wrong --metadata URI, or a "
        f"new or wiped store. {_GC_DANGER} Start it with the metadata store of cluster "
        f"{ours}. {_allow_advice('this store')}"
    )


def _other_cluster_message(bookie_id: str, meta: CookieMetadata, ours: str, theirs: str) -> str:
    return (
        f"bookie {bookie_id}: its directories belong to cluster {ours} but the metadata "
        f"store {meta.uri} is cluster {theirs}: a wrong --metadata URI, or the store was "
        f"re-created. {_GC_DANGER} Start it with the metadata store of cluster {ours}. "
        f"{_allow_advice(f'cluster {theirs}')}"
    )


def _unknown_cluster_message(bookie_id: str, meta: CookieMetadata, theirs: str | None) -> str:
    store = f"{meta.uri}" + (f" (cluster {theirs})" if theirs else " (no cluster instance id)")
    return (
        f"bookie {bookie_id}: its cookie predates cluster instance ids and the metadata "
        f"store {store} has no cookie for this bookie, so nothing shows this is its cluster: "
        f"a wrong --metadata URI, or a new or wiped store? {_GC_DANGER} Start it with the "
        f"metadata store it was formatted against. {_allow_advice('this store')}"
    )


async def check_cookie(
    bookie_id: str,
    journal_dir: Path,
    data_dir: Path,
    now_ms: int,
    meta: CookieMetadata | None,
    *,
    allow_new_cluster: bool = False,
) -> BookieCookie:
    """Apply the start rules (module docstring); returns the cookie in force or raises
    :class:`CookieError` having changed nothing."""
    dirs = [data_dir] if journal_dir == data_dir else [data_dir, journal_dir]
    local = _read_local(dirs)
    present = [c for c in local if c is not None]
    if present and len(present) != len(local):
        missing = [str(d) for d, c in zip(dirs, local, strict=True) if c is None]
        kept = [str(d) for d, c in zip(dirs, local, strict=True) if c is not None]
        raise CookieError(_partly_wiped_message(bookie_id, missing, kept, meta))
    for c in present[1:]:
        if not c.same_identity(present[0]):
            raise CookieError(
                f"bookie {bookie_id}: the directories hold cookies of different bookies"
            )
    remote = await meta.read_cookie() if meta is not None else None
    if not present:
        if remote is not None:
            raise CookieError(_wiped_message(bookie_id, dirs, meta))
        cookie = BookieCookie(
            bookie_id=bookie_id,
            instance_id=str(uuid.uuid4()),
            journal_dir=str(journal_dir.resolve()),
            data_dirs=(str(data_dir.resolve()),),
            created_ms=now_ms,
            cluster_instance_id=await meta.create_cluster_instance() if meta else "",
        )
        # Disks first: a crash before the metadata write leaves a cookie we re-publish.
        _write_local(dirs, cookie)
        if meta is not None:
            await meta.write_cookie(cookie)
        return cookie
    cookie = present[0]
    if cookie.bookie_id != bookie_id:
        raise CookieError(
            f"the directories belong to bookie {cookie.bookie_id}, not {bookie_id}; start it "
            f"with --bookie-id {cookie.bookie_id} or give it fresh directories"
        )
    if meta is None:
        return cookie
    if remote is not None and not remote.same_identity(cookie):
        raise CookieError(
            f"bookie {bookie_id}: the cookie on disk (instance {cookie.instance_id}) does not "
            f"match the metadata store's (instance {remote.instance_id}): another bookie uses "
            f"this id or the directories moved. Decommission the id "
            f"(`{decommission_command(bookie_id, meta)}`) before re-adding it."
        )
    theirs = await meta.read_cluster_instance()
    ours = cookie.cluster_instance_id or (remote.cluster_instance_id if remote else "")
    if allow_new_cluster:
        if theirs is None or theirs != ours:
            log.warning(
                "bookie %s: --allow-new-cluster: adopting the cluster of %s (its cookie named "
                "%s); ledgers on it that this store does not list will be garbage-collected",
                bookie_id,
                meta.uri,
                ours or "none",
            )
    elif ours and theirs is None:
        raise CookieError(_no_cluster_message(bookie_id, meta, ours))
    elif ours and theirs != ours:
        assert theirs is not None
        raise CookieError(_other_cluster_message(bookie_id, meta, ours, theirs))
    elif not ours and remote is None:
        raise CookieError(_unknown_cluster_message(bookie_id, meta, theirs))
    cluster = theirs or await meta.create_cluster_instance()
    if cookie.cluster_instance_id != cluster:
        cookie = replace(cookie, cluster_instance_id=cluster)
        _write_local(dirs, cookie)
    if remote is None:
        await meta.write_cookie(cookie)
    elif remote.cluster_instance_id != cluster:
        await meta.write_cookie(cookie, replace=True)
    return cookie
