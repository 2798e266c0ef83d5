"""Who of a subscription's consumers receives: the subscription types, enforced through
the metadata store.

Every consumer of a subscription contends for one lock in the store (kazoo's Lock
recipe on ZooKeeper; the same sequential-ephemeral-node algorithm on the embedded
stores), under ``streams/NAME/subscribers/SUBSCRIPTION``. Its identifier names the
consumer's type and name. Pulsar's rules, as a direct-mode client can keep them:

- ``exclusive`` (the default): the consumer takes the lock at once or is refused with
  ConsumerBusyError. It stays the only one until it closes or its metadata session
  ends (a stopped or partitioned process: after the session timeout). A consumer that
  ran on this host and is provably gone (SIGKILLed: its pid runs no more) loses its
  place at once to the next consumer that comes (streamlib.protocol.ownership).
- ``failover``: the first consumer is active; the others wait in line, holding no
  messages. When the active one closes (its cursor persisted first) or its session ends,
  the next in line becomes active and starts after the durable cursor: at-least-once,
  as in Pulsar (what the last one had acknowledged within its last persist interval may
  come again).
- ``shared`` and ``key_shared`` split one subscription's messages between consumers;
  that needs a broker to dispatch them (the stream service), so direct mode refuses them
  with UnsupportedConsumerTypeError.

A consumer of one type is refused (ConsumerBusyError) while the subscription's holder
is of another type, as Pulsar refuses "a subscription of a different type". A consumer
whose session ended stops receiving at once (messages read ahead are dropped, its
unacknowledged ones will come to whoever is active next); a failover one queues again,
an exclusive one tries to take the lock back and, failing, raises ConsumerBusyError from
receive().
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import uuid
from typing import Any

from metadata.errors import MetadataError
from metadata.store import Lock, MetadataStore
from streamlib import liveness
from streamlib.protocol.errors import (
    BadRequestError,
    ClientClosedError,
    ConsumerBusyError,
    UnsupportedConsumerTypeError,
)
from streamlib.protocol.ownership import Incarnation, Process

log = logging.getLogger(__name__)


class ConsumerType(enum.Enum):
    """Pulsar's subscription types (``ConsumerType.Exclusive`` and friends)."""

    Exclusive = "exclusive"
    Shared = "shared"
    Failover = "failover"
    KeyShared = "key_shared"


_SPELLINGS = {
    "exclusive": ConsumerType.Exclusive,
    "shared": ConsumerType.Shared,
    "failover": ConsumerType.Failover,
    "key_shared": ConsumerType.KeyShared,
    "keyshared": ConsumerType.KeyShared,
}


def parse_consumer_type(value: object, *, service: bool = False) -> ConsumerType:
    """A ConsumerType from ours, a string ("exclusive", "Failover", "key_shared",
    "KeyShared") or anything with such a ``name`` (pulsar-client's enum). Shared and
    Key_Shared only through the stream service (service=True)."""
    text = value if isinstance(value, str) else getattr(value, "name", None)
    found = _SPELLINGS.get(text.lower().replace("-", "_")) if isinstance(text, str) else None
    if found is None:
        raise BadRequestError(
            f"consumer_type is one of exclusive, failover, shared, key_shared "
            f"(or streamlib.ConsumerType), got {value!r}"
        )
    if found in (ConsumerType.Shared, ConsumerType.KeyShared) and not service:
        raise UnsupportedConsumerTypeError(
            f"consumer_type {found.value!r} splits a subscription's messages between "
            f"consumers, which needs the stream service (a broker dispatching them); "
            f"clients talking to bookies directly support 'exclusive' and 'failover'"
        )
    return found


class SubscriptionGate:
    """One consumer's place among its subscription's consumers (see the module doc).

    ``active`` is set while this consumer may receive. on_change(active) runs on the loop
    whenever that flips, so the consumer can start from the cursor or drop what it read.
    """

    def __init__(
        self,
        store: MetadataStore,
        path: str,
        kind: ConsumerType,
        consumer_name: str,
    ) -> None:
        self.kind = kind
        self.consumer_name = consumer_name
        self.path = path
        self._store = store
        host, pid, started = liveness.identity()
        # (this process too: a consumer restarted on this host after a SIGKILL takes
        # its dead predecessor's place at once -- see _evict_the_dead)
        self._identifier = json.dumps(
            {"type": kind.value, "name": consumer_name, "id": uuid.uuid4().hex,
             "host": host, "pid": pid, "started": started}
        )  # fmt: skip
        self._lock: Lock = store.lock(path, self._identifier)
        self.active = asyncio.Event()
        self.lost: Exception | None = None  # why an exclusive consumer may not go on
        self._queueing: asyncio.Task[None] | None = None
        self._closed = False
        self.on_change: Any = None  # Callable[[bool], None] | None

    async def enter(self) -> None:
        """Exclusive: hold the lock now or ConsumerBusyError. Failover: refuse if the
        holder is exclusive, else queue (active at once when first in line)."""
        await self._evict_the_dead()
        await self._refuse_other_types()
        if self.kind is ConsumerType.Exclusive:
            if not await self._lock.acquire(timeout_s=0):
                raise ConsumerBusyError(await self._busy_message())
            self._set_active(True)
        else:  # in line in the background: receive() waits until this one is active
            self._queueing = asyncio.get_running_loop().create_task(self._queue())
        self._store.add_session_listener(self._on_session)

    async def wait_active(self) -> None:
        """Until this consumer may receive; raises why it may not (check())."""
        while True:
            self.check()
            if self.active.is_set():
                return
            queueing = self._queueing
            if self.kind is ConsumerType.Failover and (queueing is None or queueing.done()):
                # (again, after a metadata error ended the last wait in line)
                queueing = self._queueing = asyncio.get_running_loop().create_task(self._queue())
            waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(self.active.wait())}
            if queueing is not None:
                waiters.add(queueing)
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    if w is not queueing:
                        w.cancel()
            if queueing is not None and queueing.done() and not queueing.cancelled():
                error = queueing.exception()
                if error is not None:  # e.g. the metadata store is unreachable
                    raise error

    async def _evict_the_dead(self) -> None:
        """Delete the lock nodes of contenders whose process is provably gone (it ran on
        this host and runs no more: streamlib.protocol.ownership): a SIGKILLed consumer
        would otherwise hold the subscription until its session expires. Nothing else
        is evidence -- a stopped or cut-off consumer keeps its place until then."""
        try:
            names = await self._store.children(self.path)
        except MetadataError:
            return  # (no lock directory yet: nobody to evict)
        for name in names:
            node = f"{self.path}/{name}"
            try:
                holder = describe_contender((await self._store.get(node)).data.decode())
                owner = Incarnation("consumer", str(holder.get("id", "")), str(holder["host"]),
                                    int(holder["pid"]), int(holder["started"]))  # fmt: skip
            except (MetadataError, KeyError, TypeError, ValueError, UnicodeDecodeError):
                continue  # (gone meanwhile, or an identifier without its process)
            if liveness.process_of(owner) is Process.GONE:
                log.info("%s: consumer %s is gone (pid %d): its place is taken",
                         self.path, holder.get("name"), owner.pid)  # fmt: skip
                try:
                    await self._store.delete(node)
                except MetadataError:
                    pass  # (gone meanwhile)

    async def _refuse_other_types(self) -> None:
        contenders = await self._lock.contenders()
        for raw in contenders[:1]:
            holder = describe_contender(raw)
            if holder.get("type") != self.kind.value:
                raise ConsumerBusyError(
                    f"subscription {self._subscription()!r} has an active "
                    f"{holder.get('type', '?')} consumer ({holder.get('name', '?')}); a "
                    f"{self.kind.value} consumer may join only once it is gone"
                )

    async def _busy_message(self) -> str:
        try:
            holder = describe_contender((await self._lock.contenders())[0])
        except (IndexError, MetadataError):
            holder = {}
        return (
            f"subscription {self._subscription()!r} already has an active consumer "
            f"({holder.get('type', 'exclusive')}, {holder.get('name', '?')}): an exclusive "
            f"subscription takes one; use consumer_type='failover' for a standby, or another "
            f"subscription name"
        )

    def _subscription(self) -> str:
        return self.path.rsplit("/", 1)[1]

    async def _queue(self) -> None:
        """Failover: wait in line, then lead until closed or the session ends."""
        await self._evict_the_dead()
        await self._lock.acquire()
        if self._closed:
            await self._lock.release()
            return
        self._set_active(True)

    def _set_active(self, active: bool) -> None:
        if active == self.active.is_set():
            return
        if active:
            self.active.set()
        else:
            self.active.clear()
        log.info(
            "%s consumer %s of %s is %s",
            self.kind.value,
            self.consumer_name,
            self.path,
            "active" if active else "inactive",
        )
        if self.on_change is not None:
            self.on_change(active)

    def _on_session(self, _event: str) -> None:
        """The session (and the lock's node with it) is gone: stop receiving now."""
        if self._closed:
            return
        self._set_active(False)
        loop = asyncio.get_running_loop()
        if self._queueing is not None:  # (a wait in line, or a retake after a loss before)
            self._queueing.cancel()
        if self.kind is ConsumerType.Failover:
            self._queueing = loop.create_task(self._requeue())
        else:
            self._queueing = loop.create_task(self._retake())

    async def _requeue(self) -> None:
        await self._forget_lock()
        await self._queue()

    async def _retake(self) -> None:
        """Exclusive after a lost session: back if nobody took it meanwhile."""
        await self._forget_lock()
        try:
            if await self._lock.acquire(timeout_s=0):
                self.lost = None
                self._set_active(True)
                return
            self.lost = ConsumerBusyError(
                f"consumer {self.consumer_name} lost subscription {self._subscription()!r} "
                f"with its metadata session, and another consumer holds it now"
            )
        except MetadataError as exc:
            self.lost = exc
        self.active.set()  # wake receive(): it raises self.lost

    async def _forget_lock(self) -> None:
        try:
            await self._lock.release()  # (our node went with the session; forget it)
        except MetadataError:
            pass
        self._lock = self._store.lock(self.path, self._identifier)

    def check(self) -> None:
        """Raise why this consumer may not receive, if it may not."""
        if self._closed:
            raise ClientClosedError(f"consumer {self.consumer_name} is closed")
        if self.lost is not None:
            raise self.lost

    async def leave(self) -> None:
        """Give the subscription to the next in line (call after persisting the cursor)."""
        if self._closed:
            return
        self._closed = True
        self._store.remove_session_listener(self._on_session)
        task, self._queueing = self._queueing, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.active.clear()
        try:
            await self._lock.release()
        except MetadataError as exc:  # the session is gone: so is our node
            log.warning("releasing %s: %s", self.path, exc)


def describe_contender(identifier: str) -> dict[str, str]:
    try:
        found = json.loads(identifier)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
