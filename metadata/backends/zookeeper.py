"""zk://host:port[,host:port]/chroot — ZooKeeper through kazoo, bridged to asyncio.

kazoo runs its own connection and callback threads. Operations use kazoo's *_async
calls and complete an asyncio future through loop.call_soon_threadsafe, so no thread
blocks per request. Watches are kazoo's DataWatch/ChildrenWatch recipes (they re-arm
themselves after every event and after reconnects); Lock and Election are kazoo's
recipes, whose blocking calls run in worker threads.

Sessions: kazoo reconnects by itself while the session lives (SUSPENDED -> CONNECTED,
ephemerals kept). When the session expires (LOST) kazoo opens a new one; then every
watch fires once (changes may have been missed) and the session listeners run so
their owners re-create their ephemeral nodes.

Security: with digest credentials (identity W) every node we create, the chroot and
the parents kazoo makes included (kazoo's default_acl), gets [digest W: ALL, world:
READ]: readers running as another identity or none follow the metadata, only W
changes it. A private node gets [digest W: ALL] alone. Without credentials nodes are
open to all, as ZooKeeper makes them. With tls=true kazoo speaks TLS, verifying the
server's certificate and its host name.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from typing import Any

from kazoo import exceptions as kz
from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat
from kazoo.recipe.election import Election as KazooElection
from kazoo.recipe.lock import Lock as KazooLock
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry
from kazoo.security import ACL, make_acl, make_digest_acl

from metadata import errors
from metadata.store import (
    CheckVersion,
    Create,
    Delete,
    Election,
    Lock,
    MetadataStore,
    Op,
    Set,
    Versioned,
    Watch,
    WatchEvent,
    WatchKind,
)

_ERRORS: dict[type[Exception], type[errors.MetadataError]] = {
    kz.NoNodeError: errors.NoNodeError,
    kz.NodeExistsError: errors.NodeExistsError,
    kz.BadVersionError: errors.BadVersionError,
    kz.NotEmptyError: errors.NotEmptyError,
    kz.NoChildrenForEphemeralsError: errors.NoChildrenForEphemeralsError,
    kz.SessionExpiredError: errors.SessionExpiredError,
    kz.ConnectionLoss: errors.ConnectionLossError,
    kz.ConnectionClosedError: errors.SessionExpiredError,
    kz.OperationTimeoutError: errors.ConnectionLossError,
    KazooTimeoutError: errors.ConnectionLossError,
    kz.ConnectionDropped: errors.ConnectionLossError,
    kz.ZookeeperStoppedError: errors.SessionExpiredError,
    kz.AuthFailedError: errors.AuthFailedError,
    kz.NoAuthError: errors.AuthFailedError,
    kz.MarshallingError: errors.ValueTooLargeError,
}

# What to do about an error, where the error alone does not tell.
_HINTS: dict[type[Exception], str] = {
    kz.NoAuthError: (
        "the node's ACL (for a create: its parent's) does not allow that to this store's "
        "identity; connect with the credentials that created it (auth_file= in the URI, "
        "or $STREAMLIB_ZK_AUTH)"
    ),
}

_KINDS: dict[str, WatchKind] = {
    EventType.CREATED: "created",
    EventType.CHANGED: "changed",
    EventType.DELETED: "deleted",
    EventType.CHILD: "children",
}


def translate(exc: BaseException, context: str = "") -> BaseException:
    """The metadata error for a kazoo one (unknown kazoo errors become MetadataError)."""
    if isinstance(exc, errors.MetadataError):
        return exc
    message = f"{context}: ZooKeeper said {type(exc).__name__} {exc}".strip(": ")
    for kazoo_type, hint in _HINTS.items():
        if isinstance(exc, kazoo_type):
            message = f"{message}: {hint}"
    for kazoo_type, ours in _ERRORS.items():
        if isinstance(exc, kazoo_type):
            return ours(message)
    if isinstance(exc, kz.ZookeeperError | kz.KazooException):
        return errors.MetadataError(message)
    return exc


class ZooKeeperStore(MetadataStore):
    def __init__(
        self,
        hosts: str,
        chroot: str,
        *,
        session_timeout_s: float = 10.0,
        auth: tuple[str, str] | None = None,
        connect_timeout_s: float = 15.0,
        operation_timeout_s: float | None = None,
        tls: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        super().__init__()
        self.uri = f"zk://{hosts}{chroot}"
        self._hosts = hosts
        self._chroot = chroot
        self._tls = tls
        self._connect_timeout_s = connect_timeout_s
        # By default an operation may wait out one session timeout for a reconnect.
        self._operation_timeout_s = operation_timeout_s or session_timeout_s
        acl: list[ACL] | None = None
        self._private_acl: list[ACL] | None = None
        auth_data = None
        if auth is not None:
            user, password = auth
            auth_data = [("digest", f"{user}:{password}")]
            owner = make_digest_acl(user, password, all=True)
            acl = [owner, make_acl("world", "anyone", read=True)]
            self._private_acl = [owner]
        if tls:
            _check_tls_files(tls_ca, tls_cert, tls_key)
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            auth_data=auth_data,
            default_acl=acl,
            use_ssl=tls,
            ca=tls_ca,
            certfile=tls_cert,
            keyfile=tls_key,
            verify_certs=True,
            # The certificate must name the host we dialled, as in any TLS client.
            check_hostname=tls,
            # Reconnect every second at most while ZooKeeper is unreachable: kazoo's
            # default backoff doubles up to an hour, so a bookie healed after a long
            # partition took tens of seconds to notice and register again.
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0),
        )
        self._lost = False
        self._closed = False
        self._kazoo_watchers: dict[Watch, list[Any]] = {}
        self.session_id = ""

    async def start(self) -> ZooKeeperStore:
        def start() -> None:
            try:
                self._client.start(timeout=self._connect_timeout_s)
                if self._chroot != "/":
                    self._client.ensure_path(self._chroot)
                    # What kazoo's own hosts parsing does; set after creating the chroot
                    # because kazoo will not create it.
                    self._client.chroot = self._chroot
            except KazooTimeoutError:
                self._client.stop()
                self._client.close()
                raise errors.ConnectionLossError(self._no_session_message()) from None
            except Exception as exc:
                self._client.stop()
                self._client.close()
                raise translate(exc) from exc

        await asyncio.to_thread(start)
        self._refresh_session_id()
        self._client.add_listener(self._on_state)
        return self

    def _no_session_message(self) -> str:
        message = (
            f"no ZooKeeper session at {self._hosts} within {self._connect_timeout_s}s: "
            "is it running and reachable?"
        )
        if self._tls:
            message += (
                " With tls=true: is that its secureClientPort, did tls_ca's CA sign its "
                "certificate for that host name, does it want a client certificate?"
            )
        return message

    def _refresh_session_id(self) -> None:
        client_id = self._client.client_id
        self.session_id = f"zk-{client_id[0]:016x}" if client_id else ""

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: no blocking calls here.
        if state == KazooState.LOST:
            self._lost = True
        elif state == KazooState.CONNECTED:
            self._refresh_session_id()
            self._dispatch_everyone()
            if self._lost:
                self._lost = False
                self._session_expired()

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a kazoo *_async method and await its result on this loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        context = f"{method.__name__.removesuffix('_async')} {args[0] if args else ''}"

        def settle(result: Any) -> None:
            if future.done():
                return
            try:
                value = result.get_nowait()
            except Exception as exc:
                loop.call_soon_threadsafe(_set_exception, future, translate(exc, context))
            else:
                loop.call_soon_threadsafe(_set_result, future, value)

        try:
            method(*args, **kwargs).rawlink(settle)
        except Exception as exc:
            raise translate(exc, context) from exc
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancellation
            # that arrives as the answer does, and the cancelled caller runs on (a closed
            # consumer's reader task polled for ever).
            async with asyncio.timeout(self._operation_timeout_s):
                return await future
        except TimeoutError:
            # kazoo queues requests while it reconnects and may still send this one
            # later: the outcome is unknown, which is what ConnectionLossError means.
            raise errors.ConnectionLossError(
                f"{context}: no answer from ZooKeeper within {self._operation_timeout_s}s "
                "(disconnected?); the operation may or may not have been applied"
            ) from None

    # reads --------------------------------------------------------------------------

    async def _get(self, path: str) -> Versioned:
        data, stat = await self._call(self._client.get_async, path)
        return Versioned(data, stat.version)

    async def _exists(self, path: str) -> int | None:
        stat = await self._call(self._client.exists_async, path)
        return None if stat is None else stat.version

    async def _children(self, path: str) -> list[str]:
        return list(await self._call(self._client.get_children_async, path))

    # writes -------------------------------------------------------------------------

    async def _transaction(self, ops: list[Op]) -> list[object]:
        if len(ops) == 1:
            return [await self._one(ops[0])]
        for op in ops:
            # ZooKeeper's multi cannot create parents; they are plain persistent nodes,
            # so creating them ahead of the transaction is harmless if it then fails.
            if isinstance(op, Create) and op.make_parents:
                await self._ensure_parent(op.path)
        txn = self._client.transaction()
        for op in ops:
            if isinstance(op, CheckVersion):
                txn.check(op.path, op.version)
            elif isinstance(op, Create):
                txn.create(
                    op.path,
                    op.data,
                    acl=self._acl_for(op),
                    ephemeral=op.ephemeral,
                    sequence=op.sequential,
                )
            elif isinstance(op, Set):
                txn.set_data(op.path, op.data, op.version)
            else:
                txn.delete(op.path, op.version)
        raw = await self._call(txn.commit_async)
        failures = [
            (i, r)
            for i, r in enumerate(raw)
            if isinstance(r, Exception) and not isinstance(r, kz.RolledBackError)
        ]
        if failures:
            index, exc = failures[0]
            cause = translate(exc)
            if not isinstance(cause, errors.MetadataError):
                cause = errors.MetadataError(repr(exc))
            raise errors.TransactionError(index, cause)
        return [_txn_result(op, r, self._client) for op, r in zip(ops, raw, strict=True)]

    async def _ensure_parent(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent:
            await self._call(self._client.ensure_path_async, parent)

    def _acl_for(self, op: Create) -> list[ACL] | None:
        """None: kazoo's default_acl (see the module docstring)."""
        return self._private_acl if op.private else None

    async def _one(self, op: Op) -> object:
        try:
            if isinstance(op, Create):
                if op.make_parents and op.private:
                    # kazoo's makepath gives the parents the node's own ACL: made here
                    # with the default one, a private node's parents stay readable.
                    await self._ensure_parent(op.path)
                return await self._call(
                    self._client.create_async,
                    op.path,
                    op.data,
                    acl=self._acl_for(op),
                    ephemeral=op.ephemeral,
                    sequence=op.sequential,
                    makepath=op.make_parents,
                )
            if isinstance(op, Set):
                stat = await self._call(self._client.set_async, op.path, op.data, op.version)
                return stat.version
            if isinstance(op, Delete):
                await self._call(self._client.delete_async, op.path, op.version)
                return None
            stat = await self._call(self._client.exists_async, op.path)
            if stat is None:
                raise errors.NoNodeError(f"{op.path} does not exist")
            if stat.version != op.version:
                raise errors.BadVersionError(f"{op.path} is at {stat.version}, not {op.version}")
            return True
        except errors.MetadataError as exc:
            raise errors.TransactionError(0, exc) from None

    async def _delete_recursive(self, path: str, version: int) -> None:
        # Not atomic on ZooKeeper (kazoo deletes leaf by leaf); the version guards the top.
        if version != -1:
            current = await self._exists(path)
            if current is None:
                raise errors.NoNodeError(f"{path} does not exist")
            if current != version:
                raise errors.BadVersionError(f"{path} is at {current}, not {version}")
        try:
            await asyncio.to_thread(self._client.delete, path, recursive=True)
        except Exception as exc:
            raise translate(exc) from exc

    # watches ------------------------------------------------------------------------

    def _watch_added(self, watch: Watch) -> None:
        """Arms kazoo's watchers. This does one blocking round trip to the server (the
        initial read of DataWatch), so that no change made after watch() returns can be
        missed."""
        state = {"open": True, "first": True}
        watchers: list[Any] = []
        self._kazoo_watchers[watch] = watchers

        def on_data(_data: bytes | None, stat: ZnodeStat | None, event: WatchedEvent | None) -> Any:
            if not state["open"]:
                return False
            if state["first"]:
                state["first"] = False
                if watch.children and stat is not None:
                    arm_children(rearmed=False)
                return None
            kind: WatchKind = _KINDS.get(event.type, "changed") if event else "changed"
            watch.deliver(WatchEvent(kind, watch.path))
            if watch.children and kind == "created":
                arm_children(rearmed=True)
            return None

        def arm_children(rearmed: bool) -> None:
            # ChildrenWatch stops when its node is deleted, so one is armed per
            # incarnation of the node. Armed in the calling thread (the caller of
            # watch() or kazoo's callback thread) so that no child created after this
            # point is missed; children that appeared before a re-arm are reported too.
            def on_children(children: list[str], event: WatchedEvent | None = None) -> Any:
                if not state["open"]:
                    return False
                if event is not None or (rearmed and children):
                    watch.deliver(WatchEvent("children", watch.path))
                return None

            watchers.append(ChildrenWatch(self._client, watch.path, on_children, send_event=True))

        watchers.append(state)
        try:
            watchers.append(DataWatch(self._client, watch.path, on_data))
        except Exception as exc:
            raise translate(exc) from exc

    def _watch_removed(self, watch: Watch) -> None:
        # kazoo's watchers stop at their next callback when told to (they return False).
        watchers = self._kazoo_watchers.pop(watch, [])
        if watchers:
            watchers[0]["open"] = False

    # recipes --------------------------------------------------------------------------

    def lock(self, path: str, identifier: str) -> Lock:
        return _ZkLock(KazooLock(self._client, path, identifier))

    def election(self, path: str, identifier: str) -> Election:
        return _ZkElection(self._client, path, identifier)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in list(self._kazoo_watchers):
            self._watch_removed(watch)

        def stop() -> None:
            self._client.stop()
            self._client.close()

        await asyncio.to_thread(stop)


def _check_tls_files(ca: str | None, cert: str | None, key: str | None) -> None:
    """Load the TLS files once here: kazoo would load them on every connection attempt
    and retry failures until the connect timeout, hiding the cause."""
    if bool(cert) != bool(key):
        raise errors.InvalidValueError("tls_cert and tls_key go together: give both or neither")
    context = ssl.create_default_context()
    try:
        if ca:
            context.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise errors.InvalidValueError(
            f"tls_ca {ca}: cannot load PEM CA certificates from it ({exc})"
        ) from None
    try:
        if cert and key:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise errors.InvalidValueError(
            f"tls_cert {cert} / tls_key {key}: not a PEM certificate and its unencrypted "
            f"private key ({exc})"
        ) from None


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


async def _in_own_thread(fn: Callable[[], Any], name: str) -> Any:
    """Run a call that may block for long (waiting for a lock) on its own thread, so
    waiters never exhaust asyncio's shared default executor."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            value = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(_set_exception, future, exc)
        else:
            loop.call_soon_threadsafe(_set_result, future, value)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


def _txn_result(op: Op, raw: Any, client: KazooClient) -> object:
    if isinstance(op, CheckVersion):
        return True
    if isinstance(op, Create):
        return client.unchroot(raw)
    if isinstance(op, Set):
        return raw.version
    return None


class _ZkLock(Lock):
    def __init__(self, lock: KazooLock) -> None:
        self._lock = lock

    @property
    def is_acquired(self) -> bool:
        return bool(self._lock.is_acquired)

    async def acquire(self, timeout_s: float | None = None) -> bool:
        def acquire() -> bool:
            try:
                if timeout_s is not None and timeout_s <= 0:  # a try, as the recipes' own
                    return bool(self._lock.acquire(blocking=False))
                return bool(self._lock.acquire(blocking=True, timeout=timeout_s))
            except kz.LockTimeout:
                return False
            except Exception as exc:
                raise translate(exc) from exc

        try:
            return bool(await _in_own_thread(acquire, "metadata-zk-lock"))
        except asyncio.CancelledError:
            self._lock.cancel()
            raise

    async def release(self) -> None:
        try:
            await asyncio.to_thread(self._lock.release)
        except Exception as exc:
            raise translate(exc) from exc

    async def contenders(self) -> list[str]:
        try:
            return list(await asyncio.to_thread(self._lock.contenders))
        except Exception as exc:
            raise translate(exc) from exc


class _ZkElection(Election):
    """kazoo's Election.run(func) blocks while func runs as leader: func signals the
    loop that we lead, then waits for resign()."""

    def __init__(self, client: KazooClient, path: str, identifier: str) -> None:
        self._election = KazooElection(client, path, identifier)
        self._leading = False
        self._resigned = threading.Event()
        self._runner: asyncio.Future[None] | None = None

    async def campaign(self) -> None:
        if self._leading:
            return
        loop = asyncio.get_running_loop()
        elected = loop.create_future()
        self._resigned.clear()

        def lead() -> None:
            self._leading = True
            loop.call_soon_threadsafe(_set_result, elected, None)
            self._resigned.wait()
            self._leading = False

        def run() -> None:
            try:
                self._election.run(lead)
            except Exception as exc:
                loop.call_soon_threadsafe(_set_exception, elected, translate(exc))
            # run() also returns when resign() cancelled us before we were elected.
            loop.call_soon_threadsafe(
                _set_exception, elected, errors.MetadataError("resigned before being elected")
            )

        self._runner = asyncio.ensure_future(_in_own_thread(run, "metadata-zk-election"))
        try:
            await elected
        except asyncio.CancelledError:
            self._election.cancel()
            raise

    async def resign(self) -> None:
        self._election.cancel()
        self._resigned.set()
        if self._runner is not None:
            await self._runner
            self._runner = None

    @property
    def is_leader(self) -> bool:
        return self._leading and bool(self._election.lock.is_acquired)

    async def leader(self) -> str | None:
        try:
            contenders = await asyncio.to_thread(self._election.contenders)
        except Exception as exc:
            raise translate(exc) from exc
        return contenders[0] if contenders else None
