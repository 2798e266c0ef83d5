"""sqlite:///path/meta.db — the embedded default, shared by the processes of one host.

Bookies, clients, the auditor and the CLI are separate processes, so everything that
ZooKeeper gives them must come from the database file itself:

- CAS and multi-op: writes commit in `BEGIN IMMEDIATE` transactions, so a check and the
  write it guards can never interleave with another process. WAL mode lets readers
  run beside the one writer. Group commit: the transactions a process asks for while
  its last batch commits go together in the next one (each in a savepoint of its own:
  atomic alone, failing alone), so one sync serves them all -- a broker persisting a
  thousand cursors a second syncs a few dozen times, not a thousand.
- Sessions: a row per store with a heartbeat timestamp (wall clock, the one clock the
  processes share), refreshed by the store's poll every third of the timeout by the
  clock. Any live store reaps the sessions
  whose heartbeat is older than their timeout, with their ephemeral nodes, in one
  transaction; a process killed with SIGKILL loses its ephemerals that way.
- Watches: every write appends its events to a change log in the same transaction.
  SQLite cannot notify another process, so each store polls — this is the one place
  where polling IS the design: `PRAGMA data_version` (a cheap, in-memory check that
  changes only when ANOTHER connection committed) every poll_interval_s (25 ms),
  reading the log only when it moved. Own writes read the log right after committing.
- A busy database (another process holds the write lock) is retried with tenacity
  for busy_timeout_s, then StoreBusyError.
- The file is the store's only protection, so it is its owner's alone: created 0600
  (SQLite gives its -wal, -shm and -journal files the database file's mode), and an
  older file we own found wider is narrowed to 0600, side files too. One OS user per
  store, then; the directory is the caller's (0700 when it makes one).

Database work runs on two threads per store, each with its connection (sqlite3
connections are not shared across threads), reached from asyncio through
run_in_executor: writes, polls and sessions on one, reads (get, exists, children) on
the other, so a read never waits for a commit's sync. A read that follows an answered
write sees it (a read transaction starts after the commit, and WAL gives it that
snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import sqlite3
import stat
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from metadata.backends import _tree
from metadata.backends._recipes import SequentialElection, SequentialLock
from metadata.errors import (
    InvalidURIError,
    MetadataError,
    SessionExpiredError,
    StoreBusyError,
    StoreIOError,
    TransactionError,
)
from metadata.paths import parent_of
from metadata.store import Create, Election, Lock, MetadataStore, Op, Versioned, WatchEvent

T = TypeVar("T")
log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    data BLOB NOT NULL,
    version INTEGER NOT NULL,
    seq INTEGER NOT NULL DEFAULT 0,
    ephemeral_owner TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes(parent);
CREATE INDEX IF NOT EXISTS nodes_by_owner ON nodes(ephemeral_owner) WHERE ephemeral_owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    heartbeat_ms INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL,
    owner TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL,
    kind TEXT NOT NULL,
    ts_ms INTEGER NOT NULL
);
INSERT OR IGNORE INTO nodes(path, parent, data, version) VALUES ('/', '', x'', 0);
"""

# How long the change log keeps events. A store that fell further behind (a process
# stopped for a minute) cannot tell what changed, so all its watches fire.
CHANGE_LOG_KEEP_MS = 60_000
# The reaper looks for dead sessions on every Nth poll (a read; it writes only when
# it found one).
REAP_EVERY_POLLS = 8
# At most this many transactions commit together (a batch is one call on the store's
# thread: a poll or a read waits for at most one).
MAX_GROUP_COMMIT = 256
# Reads asked for while one batch of reads runs make the next batch: one hop to the
# reading thread and one read transaction for all of them (at most this many).
MAX_GROUP_READ = 256
# FULL (the default) syncs the WAL on every commit: a committed CAS survives power loss.
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
# The database and the files SQLite keeps beside it (same name plus these suffixes).
SIDE_FILE_SUFFIXES = ("-wal", "-shm", "-journal")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _is_busy(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


def _restrict_to_owner(db_path: str) -> None:
    """Create the database file 0600 (whatever the umask), and take group and world
    bits off the files of an existing store that we own (files of another user are
    theirs to mode; we only read what they let us)."""
    try:
        os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise StoreIOError(f"cannot create {db_path}: {exc.strerror}") from exc
    for path in (db_path, *(db_path + suffix for suffix in SIDE_FILE_SUFFIXES)):
        try:
            st = os.stat(path)
            if st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
        except FileNotFoundError:
            continue  # a side file SQLite has not made (or just removed)
        except OSError as exc:
            raise StoreIOError(f"cannot narrow the permissions of {path}: {exc.strerror}") from exc


class _SqliteTable(_tree.NodeTable):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def load(self, path: str) -> _tree.Node | None:
        row = self.conn.execute(
            "SELECT data, version, seq, ephemeral_owner FROM nodes WHERE path = ?", (path,)
        ).fetchone()
        return None if row is None else _tree.Node(path, bytes(row[0]), row[1], row[2], row[3])

    def save(self, node: _tree.Node) -> None:
        parent = "" if node.path == "/" else parent_of(node.path)
        self.conn.execute(
            "INSERT INTO nodes(path, parent, data, version, seq, ephemeral_owner) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(path) DO UPDATE SET "
            "data = excluded.data, version = excluded.version, seq = excluded.seq",
            (node.path, parent, node.data, node.version, node.seq, node.ephemeral_owner),
        )

    def remove(self, path: str) -> None:
        self.conn.execute("DELETE FROM nodes WHERE path = ?", (path,))

    def child_names(self, path: str) -> list[str]:
        rows = self.conn.execute("SELECT path FROM nodes WHERE parent = ?", (path,)).fetchall()
        return [r[0].rsplit("/", 1)[1] for r in rows]

    def ephemerals_of(self, owner: str) -> list[str]:
        rows = self.conn.execute(
            "SELECT path FROM nodes WHERE ephemeral_owner = ?", (owner,)
        ).fetchall()
        return [r[0] for r in rows]


class SqliteStore(MetadataStore):
    def __init__(
        self,
        db_path: str,
        *,
        session_timeout_s: float = 10.0,
        poll_interval_s: float = 0.025,
        busy_timeout_s: float = 10.0,
        synchronous: str = "FULL",
    ) -> None:
        super().__init__()
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise InvalidURIError(
                f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}"
            )
        if min(session_timeout_s, poll_interval_s, busy_timeout_s) <= 0:
            raise InvalidURIError(
                "session_timeout_s, poll_interval_s and busy_timeout_s must be > 0"
            )
        self.uri = f"sqlite://{db_path}"
        self.db_path = db_path
        self.session_timeout_s = session_timeout_s
        self.poll_interval_s = poll_interval_s
        self.busy_timeout_s = busy_timeout_s
        self._synchronous = synchronous
        self.session_id = ""
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="metadata-sqlite")
        # Reads: a connection and a thread of their own (WAL: a reader never waits for the
        # writer), so that a read does not queue behind a commit's sync.
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="metadata-sqlite-read")
        self._reader: _SqliteTable | None = None
        self._conn: sqlite3.Connection | None = None
        self._table: _tree.NodeTable | None = None
        self._last_change = 0
        self._data_version = -1
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        self._last_beat = time.monotonic()  # (on the store's thread)
        # Transactions waiting for the next group commit, and the task committing them.
        self._pending: list[tuple[list[Op], asyncio.Future[list[object]]]] = []
        self._committer: asyncio.Task[None] | None = None
        # Reads waiting for the next batch, and the task reading them.
        self._read_queue: list[tuple[Callable[[_tree.NodeTable], Any], asyncio.Future[Any]]] = []
        self._reading = False  # a batch is on the reading thread

    # lifecycle ------------------------------------------------------------------------

    async def start(self) -> SqliteStore:
        try:
            await self._call(self._open)
            await asyncio.get_running_loop().run_in_executor(self._reads, self._open_reader)
        except BaseException:
            if self._conn is not None:
                await self._call(self._conn.close)
            await self._close_reader()
            self._executor.shutdown(wait=False)
            raise
        self._poller = asyncio.create_task(self._poll_forever(), name=f"metadata-poll {self.uri}")
        return self

    def _open(self) -> None:
        _restrict_to_owner(self.db_path)
        try:
            # timeout: sqlite's own short busy wait per attempt; tenacity does the rest.
            conn = sqlite3.connect(self.db_path, timeout=0.1, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreIOError(f"cannot open {self.db_path}: {exc}") from exc
        self._conn = conn
        self._table = _SqliteTable(conn)
        self._retrying(lambda: conn.execute("PRAGMA journal_mode=WAL"))
        conn.execute(f"PRAGMA synchronous={self._synchronous}")

        def create_schema() -> None:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

        self._write(create_schema)
        self._last_change = conn.execute("SELECT coalesce(max(seq), 0) FROM changes").fetchone()[0]
        self._data_version = conn.execute("PRAGMA data_version").fetchone()[0]
        self._new_session()

    def _open_reader(self) -> None:
        try:
            conn = sqlite3.connect(self.db_path, timeout=0.1, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreIOError(f"cannot open {self.db_path}: {exc}") from exc
        self._reader = _SqliteTable(conn)

    async def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await asyncio.get_running_loop().run_in_executor(self._reads, reader.conn.close)
        self._reads.shutdown(wait=True)

    def _new_session(self) -> None:
        conn = self._db()
        session_id = f"sqlite-{uuid.uuid4().hex}"
        owner = f"{socket.gethostname()}:{os.getpid()}"

        def insert() -> None:
            conn.execute(
                "INSERT INTO sessions(id, heartbeat_ms, timeout_ms, owner) VALUES (?, ?, ?, ?)",
                (session_id, _now_ms(), int(self.session_timeout_s * 1000), owner),
            )

        self._write(insert)
        self.session_id = session_id

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        try:
            events = await self._call(self._end_session)
        finally:
            await self._close_reader()
        self._dispatch(events)
        self._executor.shutdown(wait=True)

    def _end_session(self) -> list[WatchEvent]:
        conn = self._db()
        try:

            def end() -> list[WatchEvent]:
                events = _tree.reap_session(self._tab(), self.session_id)
                conn.execute("DELETE FROM sessions WHERE id = ?", (self.session_id,))
                self._log(events)
                return events

            return self._write(end)
        finally:
            conn.close()
            self._conn = None

    # plumbing ---------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise SessionExpiredError(f"store {self.uri} is closed")
        return self._conn

    def _tab(self) -> _tree.NodeTable:
        assert self._table is not None
        return self._table

    async def _call(self, fn: Callable[[], T]) -> T:
        if self._conn is None and self._table is not None:
            raise SessionExpiredError(f"store {self.uri} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _retrying(self, fn: Callable[[], T]) -> T:
        # The first try outside tenacity: nearly every one succeeds, and a retry loop's
        # setup costs more than a read (a broker opening thousands of streams makes
        # tens of thousands). Busy: the loop from there, as if it had made that try.
        try:
            return fn()
        except sqlite3.Error as exc:
            if not _is_busy(exc):
                raise StoreIOError(f"{self.db_path}: {exc}") from exc
        retrying = Retrying(
            retry=retry_if_exception(_is_busy),
            stop=stop_after_delay(self.busy_timeout_s),
            wait=wait_random_exponential(multiplier=0.001, max=0.05),
        )
        try:
            return retrying(fn)
        except RetryError as exc:
            raise StoreBusyError(
                f"{self.db_path} stayed locked by another process for {self.busy_timeout_s}s; "
                "is a process stuck holding a write transaction?"
            ) from exc.last_attempt.exception()
        except sqlite3.Error as exc:
            raise StoreIOError(f"{self.db_path}: {exc}") from exc

    def _write(self, fn: Callable[[], T]) -> T:
        """fn inside BEGIN IMMEDIATE ... COMMIT, retried while the database is busy."""
        conn = self._db()

        def attempt() -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        return self._retrying(attempt)

    async def _read_call(self, fn: Callable[[_tree.NodeTable], T]) -> T:
        """fn(the reader's table) in a read transaction, on the reading thread: with the
        other reads asked for meanwhile (group read). The batch's transaction begins
        after each of its reads was asked for, so each sees every write answered
        before it was asked."""
        if self._reader is None:
            raise SessionExpiredError(f"store {self.uri} is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._read_queue.append((fn, future))
        if not self._reading:
            self._next_reads()
        return await future

    def _next_reads(self) -> None:
        """Send the waiting reads (at most MAX_GROUP_READ) to the reading thread as one
        batch; when it answers, the next. (Callbacks, not a task: a lone read costs no
        more than one hop.)"""
        batch = [(fn, f) for fn, f in self._read_queue[:MAX_GROUP_READ] if not f.done()]
        del self._read_queue[:MAX_GROUP_READ]
        self._reading = bool(batch)
        if not batch:
            if self._read_queue:  # (only cancelled ones were first in line)
                self._next_reads()
            return
        table = self._reader
        if table is None:  # (closed while these waited: no thread to run them)
            self._answer_reads(batch, SessionExpiredError(f"store {self.uri} is closed"))
            return

        def each() -> list[tuple[bool, Any]]:
            answers: list[tuple[bool, Any]] = []
            for fn, _ in batch:
                try:
                    answers.append((True, fn(table)))
                except MetadataError as exc:  # (this read's answer: NoNode, ...)
                    answers.append((False, exc))
            return answers

        try:
            done = asyncio.get_running_loop().run_in_executor(
                self._reads, lambda: self._read(each, table.conn)
            )
        except RuntimeError as exc:  # (the reading thread shut down meanwhile)
            self._answer_reads(batch, SessionExpiredError(f"store {self.uri} is closed: {exc}"))
            return
        done.add_done_callback(lambda _: self._answer_reads(batch, done))

    def _answer_reads(
        self,
        batch: list[tuple[Callable[[_tree.NodeTable], Any], asyncio.Future[Any]]],
        done: asyncio.Future[list[tuple[bool, Any]]] | Exception,
    ) -> None:
        if isinstance(done, Exception):
            answers: list[tuple[bool, Any]] = [(False, done)] * len(batch)
        elif done.cancelled() or done.exception() is not None:  # the batch as a whole
            error = done.exception() if not done.cancelled() else None
            failed = error or SessionExpiredError(f"store {self.uri} is closed")
            answers = [(False, failed)] * len(batch)
        else:
            answers = done.result()
        for (_, future), (ok, answer) in zip(batch, answers, strict=True):
            if future.done():
                continue
            if ok:
                future.set_result(answer)
            else:
                future.set_exception(answer)
        self._next_reads()

    def _read(self, fn: Callable[[], T], conn: sqlite3.Connection) -> T:

        def attempt() -> T:
            conn.execute("BEGIN")
            try:
                return fn()
            finally:
                conn.execute("COMMIT")

        return self._retrying(attempt)

    def _log(self, events: list[WatchEvent]) -> None:
        now = _now_ms()
        self._db().executemany(
            "INSERT INTO changes(path, kind, ts_ms) VALUES (?, ?, ?)",
            [(e.path, e.kind, now) for e in events],
        )

    def _drain(self) -> tuple[list[WatchEvent], bool]:
        """Events logged since we last looked; True when some were pruned unseen."""
        rows = (
            self._db()
            .execute(
                "SELECT seq, path, kind FROM changes WHERE seq > ? ORDER BY seq",
                (self._last_change,),
            )
            .fetchall()
        )
        if not rows:
            return [], False
        gap = rows[0][0] != self._last_change + 1
        self._last_change = rows[-1][0]
        return [WatchEvent(kind, path) for _, path, kind in rows], gap

    def _write_and_drain(
        self, fn: Callable[[], tuple[T, list[WatchEvent]]]
    ) -> tuple[T, list[WatchEvent], bool]:
        def logged() -> T:
            result, events = fn()
            self._log(events)
            return result

        result = self._write(logged)
        try:
            events, gap = self._retrying(self._drain)
        except MetadataError as exc:
            # Committed: the writes are answered as done (a caller told otherwise would
            # write again). Not knowing what changed, every watch fires.
            log.warning("reading the change log of %s failed: %s", self.uri, exc)
            return result, [], True
        return result, events, gap

    def _publish(self, events: list[WatchEvent], gap: bool) -> None:
        if gap:
            self._dispatch_everyone()
        self._dispatch(events)

    # store operations ---------------------------------------------------------------------

    async def _get(self, path: str) -> Versioned:
        node = await self._read_call(lambda table: _tree.read(table, path))
        return Versioned(node.data, node.version)

    async def _exists(self, path: str) -> int | None:
        node = await self._read_call(lambda table: table.load(path))
        return None if node is None else node.version

    async def _children(self, path: str) -> list[str]:
        def children(table: _tree.NodeTable) -> list[str]:
            _tree.read(table, path)
            return table.child_names(path)

        return await self._read_call(children)

    async def _transaction(self, ops: list[Op]) -> list[object]:
        """Group commit: the transactions asked for while one batch commits make the next
        batch, one sqlite transaction and one sync for all of them (ZooKeeper's group
        commit). Each is atomic on its own (a savepoint) and is answered only once the
        batch committed: a failed one leaves no trace, and fails no other."""
        future: asyncio.Future[list[object]] = asyncio.get_running_loop().create_future()
        self._pending.append((ops, future))
        if self._committer is None:
            self._committer = asyncio.create_task(self._commit_pending(), name="metadata-commit")
        return await future

    async def _commit_pending(self) -> None:
        try:
            while self._pending:
                batch = [(ops, f) for ops, f in self._pending[:MAX_GROUP_COMMIT] if not f.done()]
                del self._pending[:MAX_GROUP_COMMIT]
                if batch:
                    await self._commit_batch(batch)
        finally:
            self._committer = None

    async def _commit_batch(
        self, batch: list[tuple[list[Op], asyncio.Future[list[object]]]]
    ) -> None:
        def apply() -> tuple[list[list[object] | MetadataError], list[WatchEvent]]:
            return self._apply_each([ops for ops, _ in batch])

        try:
            outcomes, events, gap = await self._call(lambda: self._write_and_drain(apply))
        except Exception as exc:  # (the batch as a whole: busy, the disk, a closed store)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self._publish(events, gap)
        if any(isinstance(o, SessionExpiredError) for o in outcomes) and not self._closed:
            try:
                await self._call(self._renew_session)
            except Exception as exc:
                log.warning("renewing the session of %s failed: %s", self.uri, exc)
            self._session_expired()
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, MetadataError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _apply_each(
        self, batch: list[list[Op]]
    ) -> tuple[list[list[object] | MetadataError], list[WatchEvent]]:
        """Each transaction of a batch inside a savepoint of the one sqlite transaction:
        its results, or the error that undid it."""
        conn = self._db()
        outcomes: list[list[object] | MetadataError] = []
        events: list[WatchEvent] = []
        for ops in batch:
            conn.execute("SAVEPOINT one")
            try:
                if any(isinstance(op, Create) and op.ephemeral for op in ops):
                    self._check_session()
                results, applied = _tree.apply(self._tab(), ops, self.session_id)
            except (TransactionError, SessionExpiredError) as exc:
                conn.execute("ROLLBACK TO one")
                outcomes.append(exc)
            else:
                outcomes.append(results)
                events += applied
            conn.execute("RELEASE one")
        return outcomes, events

    async def _delete_recursive(self, path: str, version: int) -> None:
        _, events, gap = await self._call(
            lambda: self._write_and_drain(
                lambda: (None, _tree.delete_recursive(self._tab(), path, version))
            )
        )
        self._publish(events, gap)

    def lock(self, path: str, identifier: str) -> Lock:
        return SequentialLock(self, path, identifier)

    def election(self, path: str, identifier: str) -> Election:
        return SequentialElection(self, path, identifier)

    # sessions ---------------------------------------------------------------------------

    def _check_session(self) -> None:
        row = (
            self._db().execute("SELECT 1 FROM sessions WHERE id = ?", (self.session_id,)).fetchone()
        )
        if row is None:
            raise SessionExpiredError(
                f"session {self.session_id} expired (no heartbeat for {self.session_timeout_s}s); "
                "its ephemeral nodes are gone"
            )

    def _heartbeat(self) -> bool:
        """Refresh our session. False when it already expired: reaped by another store,
        or stale (we stalled past the timeout) - then we reap it ourselves, because other
        stores may already treat its ephemerals as gone."""
        conn = self._db()

        def beat() -> bool:
            now = _now_ms()
            updated = conn.execute(
                "UPDATE sessions SET heartbeat_ms = ? WHERE id = ? AND heartbeat_ms + timeout_ms >= ?",
                (now, self.session_id, now),
            ).rowcount
            if updated:
                return True
            conn.execute("DELETE FROM sessions WHERE id = ?", (self.session_id,))
            self._log(_tree.reap_session(self._tab(), self.session_id))
            return False

        return self._write(beat)

    def _renew_session(self) -> None:
        self._new_session()

    def _reap(self) -> list[WatchEvent]:
        """Remove dead sessions, their ephemerals (and orphans), and old change-log rows."""
        conn = self._db()
        now = _now_ms()
        dead = conn.execute(
            "SELECT count(*) FROM sessions WHERE heartbeat_ms + timeout_ms < ?", (now,)
        ).fetchone()[0]
        orphans = conn.execute(
            "SELECT count(*) FROM nodes WHERE ephemeral_owner IS NOT NULL "
            "AND ephemeral_owner NOT IN (SELECT id FROM sessions)"
        ).fetchone()[0]
        oldest = conn.execute("SELECT ts_ms FROM changes ORDER BY seq LIMIT 1").fetchone()
        stale = oldest is not None and oldest[0] < now - CHANGE_LOG_KEEP_MS
        if not (dead or orphans or stale):
            return []

        def reap() -> list[WatchEvent]:
            conn.execute("DELETE FROM sessions WHERE heartbeat_ms + timeout_ms < ?", (now,))
            rows = conn.execute(
                "SELECT DISTINCT ephemeral_owner FROM nodes WHERE ephemeral_owner IS NOT NULL "
                "AND ephemeral_owner NOT IN (SELECT id FROM sessions)"
            ).fetchall()
            events: list[WatchEvent] = []
            for (owner,) in rows:
                events += _tree.reap_session(self._tab(), owner)
            self._log(events)
            conn.execute("DELETE FROM changes WHERE ts_ms < ?", (now - CHANGE_LOG_KEEP_MS,))
            return events

        return self._write(reap)

    def _poll_once(self, tick: int) -> tuple[list[WatchEvent], bool]:
        """The heartbeat when a third of the session timeout passed since the last one,
        by the clock; then what other processes changed. (Counted in polls, the beats of a
        loop running late came late by as many times its lag: a broker of 2,000 streams
        under load lost its session, every lease and every stream at once.)"""
        conn = self._db()
        expired = False
        now = time.monotonic()
        if now - self._last_beat >= self.session_timeout_s / 3:
            self._last_beat = now
            if not self._heartbeat():
                self._new_session()
                # Told now: before the reap's watch events reach anyone, and even if what
                # follows in this poll fails.
                self._session_expired()
                expired = True
        reaped = self._reap() if tick % REAP_EVERY_POLLS == 0 else []
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._data_version and not reaped and not expired:
            return [], False
        self._data_version = version
        return self._drain()

    async def _poll_forever(self) -> None:
        tick = 1
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                events, gap = await self._call(functools.partial(self._poll_once, tick))
            except (MetadataError, sqlite3.Error) as exc:
                # Busy or failing storage: the next tick tries again. Sessions expire if
                # this lasts, which is exactly what other processes must see.
                log.warning("metadata poll of %s failed: %s", self.uri, exc)
                continue
            self._publish(events, gap)
            tick += 1
