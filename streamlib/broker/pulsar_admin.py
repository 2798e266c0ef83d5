"""The broker's Pulsar admin REST port: the subset of Pulsar's admin API (v2) and HTTP
lookup that pulsar-admin and Pulsar's clients use, over streams (docs/pulsar-admin.md
lists each endpoint and its answers). A thin translator, as the gRPC front end is: the
streams' administration is StreamManager's, ownership the broker core's, and every
call is authorized for its caller exactly as the gRPC front end authorizes the same
action: each handler asks streamlib/protocol/service_access.py for the Operation the
gRPC path asks for (docs/pulsar-admin.md tabulates them).

Topic names map to streams by streamlib/pulsar/topics.py. Answers are Pulsar's: JSON,
errors as {"reason": ...} with Pulsar's status codes -- 401 without credentials the
broker accepts, 403 for what the caller's roles and grants do not allow, 404 for no
such topic or subscription, 409 for one that exists, 412 for an invalid name (as
Pulsar) or a topic or subscription in use, 500 with the error's class. A stream owned
by another broker that serves this port is redirected there (307, as Pulsar's brokers
do) for what only its owner knows or does: its connected clients' stats, cursor resets
and deletions that must reach its consumers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlencode

from bookie.errors import UnauthenticatedError
from metadata.errors import NodeExistsError
from metadata.errors import NoSuchStreamError as StoreNoSuchStream
from streamlib.broker.access import BrokerAccess
from streamlib.broker.http_server import HttpError, HttpServer, Request, Response, json_response
from streamlib.broker.ownership import Broker
from streamlib.broker.pulsar_rest import (
    as_http,
    check_namespace,
    json_body,
    match,
    message_id,
    topic_stream,
)
from streamlib.protocol.errors import (
    ConsumerBusyError,
    NoSuchStreamError,
    NoSuchSubscriptionError,
    UnauthorizedError,
)
from streamlib.protocol.service_access import Caller, Operation, may_create
from streamlib.pulsar import stats as shapes
from streamlib.pulsar.topics import namespace_of, topic_of
from streamlib.stream.admin import MAX_PARTITIONS, partition_name
from streamlib.stream.positions import LATEST, MessageId

CLUSTER = "streamlib"  # the one cluster this answers for (Pulsar standalone's: "standalone")
_PARTITION = "-partition-"

Handler = Callable[..., Awaitable[Response]]


async def serve_admin(
    broker: Broker, access: BrokerAccess, host: str, port: int, ssl_context: Any = None
) -> tuple[HttpServer, int]:
    """Bind the admin port (not serving yet: `await server.serve()`, after the broker
    registered); the server and the port bound."""
    server = HttpServer(PulsarAdmin(broker, access), ssl=ssl_context)
    bound = await server.bind(host, port)
    return server, bound


def _no_content() -> Response:
    return Response(204)


# The compactions asked of a broker it keeps the outcome of (the last of each stream), at
# most about this many: past it, the finished ones are forgotten (their status then
# reads from the stream: SUCCESS once it has a view).
MAX_COMPACTIONS_KEPT = 10_000


class PulsarAdmin:
    """The routes: (method, path pattern) -> handler. A pattern's {name} takes one path
    segment, percent-decoded; each handler authorizes its caller before acting."""

    def __init__(self, broker: Broker, access: BrokerAccess) -> None:
        self.broker = broker
        self.access = access
        self.streams = broker.client.streams
        # The compactions asked of this broker, by stream (the last one of each).
        self._compactions: dict[str, asyncio.Task[Any]] = {}
        topic = "admin/v2/persistent/{tenant}/{namespace}/{topic}"
        subscription = topic + "/subscription/{sub}"
        table: list[tuple[str, str, Handler]] = [
            ("GET", "admin/v2/clusters", self.clusters),
            ("GET", "admin/v2/clusters/{cluster}", self.cluster),
            ("GET", "admin/v2/brokers/health", self.health),
            ("GET", "admin/v2/brokers/ready", self.health),
            ("GET", "admin/v2/brokers/{cluster}", self.brokers),
            ("GET", "admin/v2/tenants", self.tenants),
            ("GET", "admin/v2/tenants/{tenant}", self.tenant),
            ("GET", "admin/v2/namespaces/{tenant}", self.namespaces),
            ("GET", "admin/v2/namespaces/{tenant}/{namespace}/topics", self.namespace_topics),
            ("GET", "admin/v2/namespaces/{tenant}/{namespace}/deduplication", self.dedup),
            ("POST", "admin/v2/namespaces/{tenant}/{namespace}/deduplication", self.set_dedup),
            ("DELETE", "admin/v2/namespaces/{tenant}/{namespace}/deduplication", self.set_dedup),
            ("GET", "admin/v2/persistent/{tenant}/{namespace}", self.topics),
            ("GET", "admin/v2/persistent/{tenant}/{namespace}/partitioned", self.partitioned),
            ("PUT", topic, self.create_topic),
            ("DELETE", topic, self.delete_topic),
            ("PUT", topic + "/partitions", self.create_partitioned),
            ("GET", topic + "/partitions", self.partitions),
            ("DELETE", topic + "/partitions", self.delete_partitioned),
            ("POST", topic + "/partitions", self.add_partitions),
            ("GET", topic + "/stats", self.stats),
            ("GET", topic + "/partitioned-stats", self.partitioned_stats),
            ("GET", topic + "/internalStats", self.internal_stats),
            ("GET", topic + "/subscriptions", self.subscriptions),
            ("PUT", subscription, self.create_subscription),
            ("DELETE", subscription, self.delete_subscription),
            ("POST", subscription + "/resetcursor/{timestamp}", self.reset_to_time),
            ("POST", subscription + "/resetcursor", self.reset_to_position),
            ("PUT", topic + "/compaction", self.compact),
            ("GET", topic + "/compaction", self.compaction_status),
            ("GET", topic + "/deduplicationEnabled", self.topic_dedup),
            ("GET", "lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}", self.lookup),
        ]
        self.routes = [(method, tuple(p.split("/")), handler) for method, p, handler in table]

    # -- dispatch -----------------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        if request.path == "/status.html" and request.method == "GET":  # (load balancers)
            return Response(200, b"OK", "text/plain")
        handler, params = self._route(request)
        try:
            caller = self.access.caller(request)
        except UnauthenticatedError as error:
            raise HttpError(401, f"UnauthenticatedError: {error}") from None
        try:
            return await handler(request, caller, **params)
        except HttpError:
            raise
        except Exception as error:
            raise as_http(error) from None

    def _route(self, request: Request) -> tuple[Handler, dict[str, str]]:
        segments = [unquote(s) for s in request.path.strip("/").split("/")]
        allowed = []
        for method, pattern, handler in self.routes:
            params = match(pattern, segments)
            if params is None:
                continue
            if method == request.method:
                return handler, params
            allowed.append(method)
        if allowed:
            raise HttpError(405, f"{request.method} is not allowed here: {', '.join(allowed)}")
        hint = ""
        if "non-persistent" in segments:
            hint = ": non-persistent topics are not streams (only persistent:// ones are)"
        raise HttpError(404, f"no such resource {request.path!r:.200}{hint}")

    def _check(
        self, caller: Caller, operation: Operation, stream: str = "", sub: str | None = None
    ) -> None:
        try:
            self.access.check(caller, operation, stream, sub)
        except UnauthorizedError as error:
            raise HttpError(403, f"UnauthorizedError: {error}") from None

    async def _partitions(self, stream: str, missing: str = "Topic") -> int:
        """The stream's partition count (0: not partitioned); 404 if it does not exist."""
        try:
            return int(await self.streams.partitions(stream))
        except (NoSuchStreamError, StoreNoSuchStream):
            raise HttpError(404, f"{missing} {topic_of(stream)} not found") from None

    async def _each(self, stream: str) -> list[str]:
        """The streams an operation on a topic acts on: its partitions, or itself."""
        count = await self._partitions(stream)
        return [partition_name(stream, i) for i in range(count)] if count else [stream]

    async def _unpartitioned(self, stream: str, ask: str) -> None:
        count = await self._partitions(stream)
        if count:
            raise HttpError(
                404, f"Topic {topic_of(stream)} not found: it is a partitioned topic of {count} "
                f"partitions ({ask})"
            )  # fmt: skip

    async def _owner_elsewhere(self, request: Request, stream: str) -> Response | None:
        """307 to the stream's owner, when another broker that serves this port owns it
        (Pulsar's redirect; ?authoritative=true: asked there already, answer here)."""
        if request.query.get("authoritative") == "true":
            return None
        owner = await self.broker.registry.owner(stream)
        if owner is None or owner.broker_id == self.broker.broker_id or not owner.http_url:
            return None
        query = urlencode({**request.query, "authoritative": "true"})
        target = f"{owner.http_url}{request.path}?{query}"
        body = {"reason": f"broker {owner.broker_id} owns this topic"}
        return Response(307, json.dumps(body).encode(), headers=[("Location", target)])

    # -- the cluster, its tenants and namespaces ----------------------------------------

    async def clusters(self, request: Request, caller: Caller) -> Response:
        self._check(caller, Operation.LOOKUP)
        return json_response(200, [CLUSTER])

    async def cluster(self, request: Request, caller: Caller, cluster: str) -> Response:
        self._check(caller, Operation.LOOKUP)
        if cluster != CLUSTER:
            raise HttpError(404, f"Cluster {cluster} does not exist (this one is {CLUSTER})")
        me = self.broker.info
        tls = me.http_url.startswith("https:")
        return json_response(200, {
            "serviceUrl": "" if tls else me.http_url, "serviceUrlTls": me.http_url if tls else "",
            "brokerServiceUrl": me.pulsar_url, "brokerServiceUrlTls": me.pulsar_url_tls,
        })  # fmt: skip

    async def brokers(self, request: Request, caller: Caller, cluster: str) -> Response:
        self._check(caller, Operation.LOOKUP)
        if cluster != CLUSTER:
            raise HttpError(404, f"Cluster {cluster} does not exist (this one is {CLUSTER})")
        live = await self.broker.registry.live()
        return json_response(200, [b.http_url.split("://", 1)[-1] or b.address for b in live])

    async def health(self, request: Request, caller: Caller) -> Response:
        self._check(caller, Operation.LOOKUP)
        return Response(200, b"ok", "text/plain")

    async def _known(self) -> dict[str, set[str]]:
        """Tenants and their namespaces: public/default, and those streams are in."""
        found: dict[str, set[str]] = {"public": {"default"}}
        for stream in await self.streams.list():
            tenant, namespace = namespace_of(stream)
            found.setdefault(tenant, set()).add(namespace)
        return found

    async def tenants(self, request: Request, caller: Caller) -> Response:
        self._check(caller, Operation.LOOKUP)
        return json_response(200, sorted(await self._known()))

    async def _tenant(self, caller: Caller, tenant: str) -> set[str]:
        self._check(caller, Operation.LOOKUP)
        namespaces = (await self._known()).get(tenant)
        if namespaces is None:
            raise HttpError(404, f"Tenant {tenant} does not exist")
        return namespaces

    async def tenant(self, request: Request, caller: Caller, tenant: str) -> Response:
        await self._tenant(caller, tenant)
        return json_response(200, {"adminRoles": [], "allowedClusters": [CLUSTER]})

    async def namespaces(self, request: Request, caller: Caller, tenant: str) -> Response:
        names = await self._tenant(caller, tenant)
        return json_response(200, sorted(f"{tenant}/{ns}" for ns in names))

    async def _namespace(self, tenant: str, namespace: str) -> None:
        """412 for an invalid name, 404 for a namespace no stream is in (but the default)."""
        check_namespace(tenant, namespace)
        if namespace not in (await self._known()).get(tenant, set()):
            raise HttpError(404, "Namespace does not exist")

    async def dedup(
        self, request: Request, caller: Caller, tenant: str, namespace: str
    ) -> Response:
        check_namespace(tenant, namespace)
        self._check(caller, Operation.READ)
        await self._namespace(tenant, namespace)
        return json_response(200, True)  # (a broker always deduplicates)

    async def set_dedup(
        self, request: Request, caller: Caller, tenant: str, namespace: str
    ) -> Response:
        check_namespace(tenant, namespace)
        self._check(caller, Operation.ADMINISTER)
        await self._namespace(tenant, namespace)
        if request.method == "POST":
            enabled = json_body(request, None)
            if not isinstance(enabled, bool):
                raise HttpError(400, "the body is true or false")
            if not enabled:
                raise HttpError(
                    412, "streamlib brokers always deduplicate (by producer name and sequence "
                    "id); it cannot be turned off"
                )  # fmt: skip
        return _no_content()  # (DELETE: back to the broker's default, which it is)

    # -- topics -------------------------------------------------------------------------

    async def _listed(self, caller: Caller, tenant: str, namespace: str) -> dict[str, int]:
        """The namespace's streams and their partition counts (0: not partitioned)."""
        check_namespace(tenant, namespace)
        self._check(caller, Operation.LOOKUP)
        await self._namespace(tenant, namespace)
        streams = await self.streams.list()
        present = set(streams)
        found = {}
        for stream in streams:
            if namespace_of(stream) != (tenant, namespace):
                continue
            count = 0
            if partition_name(stream, 0) in present:  # (a partitioned one's record, maybe)
                try:
                    count = int(await self.streams.partitions(stream))
                except (NoSuchStreamError, StoreNoSuchStream):
                    continue  # (deleted meanwhile)
            found[stream] = count
        return found

    async def topics(
        self, request: Request, caller: Caller, tenant: str, namespace: str
    ) -> Response:
        found = await self._listed(caller, tenant, namespace)
        # As Pulsar lists them: topics and partitions, not a partitioned topic's name.
        return json_response(200, sorted(topic_of(s) for s, n in found.items() if not n))

    async def namespace_topics(
        self, request: Request, caller: Caller, tenant: str, namespace: str
    ) -> Response:
        """(What clients with an http:// service URL ask for a pattern subscription.)"""
        if request.query.get("mode", "PERSISTENT").upper() == "NON_PERSISTENT":
            return json_response(200, [])
        return await self.topics(request, caller, tenant, namespace)

    async def partitioned(
        self, request: Request, caller: Caller, tenant: str, namespace: str
    ) -> Response:
        found = await self._listed(caller, tenant, namespace)
        return json_response(200, sorted(topic_of(s) for s, n in found.items() if n))

    async def _exists(self, stream: str) -> bool:
        try:
            await self.streams.partitions(stream)
        except (NoSuchStreamError, StoreNoSuchStream):
            return False
        return True

    async def create_topic(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.ADMINISTER, stream)
        if await self._exists(stream):
            raise HttpError(409, "This topic already exists")
        await self.streams.create(stream)
        return _no_content()

    async def create_partitioned(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        if _PARTITION in names["topic"]:
            raise HttpError(412, "Partitioned Topic Name should not contain '-partition-'")
        self._check(caller, Operation.ADMINISTER, stream)
        body = json_body(request, None)
        count = body.get("partitions") if isinstance(body, dict) else body
        if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_PARTITIONS:
            raise HttpError(406, f"The number of partitions should be more than 0 and less than "
                            f"or equal to {MAX_PARTITIONS}, got {count!r:.40}")  # fmt: skip
        if await self._exists(stream):
            raise HttpError(409, "This topic already exists")
        await self.streams.create(stream, partitions=count)
        return _no_content()

    async def partitions(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.LOOKUP, stream)
        try:
            count = int(await self.streams.partitions(stream))
        except (NoSuchStreamError, StoreNoSuchStream):
            # (A client about to create it asks checkAllowAutoCreation: it is made unpartitioned.)
            auto = request.query.get("checkAllowAutoCreation") == "true"
            if not (auto and may_create(caller, self.broker.allow_auto_create)):
                raise HttpError(404, f"Topic {topic_of(stream)} not found") from None
            count = 0
        return json_response(200, {"partitions": count, "properties": {}, "deleted": False})

    async def add_partitions(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.ADMINISTER, stream)
        if not await self._partitions(stream, "Partitioned Topic"):
            raise HttpError(404, f"Partitioned Topic {topic_of(stream)} not found")
        raise HttpError(405, "streamlib brokers cannot add partitions to a partitioned topic "
                        "yet: create a new partitioned topic with the count wanted")  # fmt: skip

    async def delete_topic(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.ADMINISTER, stream)
        if await self._partitions(stream):
            raise HttpError(405, f"Topic {topic_of(stream)} is a partitioned topic: delete it "
                            "with DELETE .../partitions")  # fmt: skip
        redirect = await self._owner_elsewhere(request, stream)
        if redirect is not None:
            return redirect
        await self._delete(stream, [stream], request.query.get("force") == "true")
        return _no_content()

    async def delete_partitioned(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.ADMINISTER, stream)
        count = await self._partitions(stream, "Partitioned Topic")
        if not count:
            raise HttpError(404, f"Partitioned Topic {topic_of(stream)} not found")
        parts = [partition_name(stream, i) for i in range(count)]
        await self._delete(stream, parts, request.query.get("force") == "true")
        return _no_content()

    async def _delete(self, stream: str, parts: list[str], force: bool) -> None:
        """Delete the stream (and its partitions): refused (412) while this broker serves
        producers of it or any of its subscriptions has consumers, unless forced (this
        broker's clients of it are disconnected: it stops serving it first)."""
        for part in parts if not force else ():
            owned = self.broker.owned.get(part)
            if owned is not None and owned.producers:
                raise HttpError(412, f"Topic has active producers/subscriptions: "
                                f"{len(owned.producers)} producers")  # fmt: skip
            try:
                subs = await self.streams.registry.list_cursors(part)
            except (NoSuchStreamError, StoreNoSuchStream):
                continue
            for sub in subs:
                if await self.streams.consumers(part, sub):
                    raise HttpError(412, "Topic has active producers/subscriptions: "
                                    f"subscription {sub} has consumers")  # fmt: skip
        for part in parts:
            await self.broker.unload(part)
        await self.streams.delete(stream)

    # -- stats --------------------------------------------------------------------------

    def _live(self, stream: str) -> shapes.Live | None:
        owned = self.broker.owned.get(stream)
        if owned is None or owned.gone is not None:
            return None
        live = shapes.Live([(p.name, p.access_mode) for p in owned.producers.values()])
        for name, dispatcher in owned.subscriptions.items():
            names = [s.name for s in dispatcher.sessions.values()]
            live.subscriptions[name] = (dispatcher.dispatch.kind.value, names)
        return live

    async def _topic_stats(self, stream: str) -> dict[str, Any]:
        raw = await self.streams.stats(stream)
        owner = await self.broker.registry.owner(stream)
        return shapes.topic_stats(raw, self._live(stream), owner.broker_id if owner else "")

    async def stats(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.READ, stream)
        await self._unpartitioned(stream, "ask its partitioned-stats")
        redirect = await self._owner_elsewhere(request, stream)
        if redirect is not None:
            return redirect
        return json_response(200, await self._topic_stats(stream))

    async def partitioned_stats(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.READ, stream)
        count = await self._partitions(stream, "Partitioned Topic")
        if not count:
            raise HttpError(404, f"Partitioned Topic {topic_of(stream)} not found")
        by_partition = {}
        for index in range(count):
            part = partition_name(stream, index)
            try:
                by_partition[part] = await self._topic_stats(part)
            except (NoSuchStreamError, StoreNoSuchStream):
                continue
        per_partition = request.query.get("perPartition", "true") != "false"
        return json_response(200, shapes.partitioned_stats(by_partition, per_partition))

    async def internal_stats(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.READ, stream)
        await self._unpartitioned(stream, "ask a partition's")
        # (the owner answers, as Pulsar's: it writes the stream, so it knows its end at
        # once -- another broker knows it as the bookies do, a quiet writer's LAC later)
        redirect = await self._owner_elsewhere(request, stream)
        if redirect is not None:
            return redirect
        raw = await self.streams.stats(stream, count_messages=False)
        cursors = {
            sub: (tuple(acks.mark_delete), [(tuple(a), tuple(b)) for a, b in acks.ranges])
            for sub, acks in (await self.streams.cursor_states(stream)).items()
        }
        return json_response(200, shapes.internal_stats(raw, cursors))  # type: ignore[arg-type]

    # -- subscriptions ------------------------------------------------------------------

    async def subscriptions(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.READ, stream)
        found: set[str] = set()
        for part in await self._each(stream):
            try:
                found.update(await self.streams.registry.list_cursors(part))
            except (NoSuchStreamError, StoreNoSuchStream):
                continue
        return json_response(200, sorted(found))

    async def create_subscription(
        self, request: Request, caller: Caller, sub: str, **names: str
    ) -> Response:
        stream = topic_stream(**names)
        # (As a consumer's subscribe makes one: what the gRPC front end allows a consumer.)
        self._check(caller, Operation.CONSUME, stream, sub)
        position = message_id(json_body(request, None), LATEST)
        created = 0
        for part in await self._each(stream):
            try:
                await self.streams.create_subscription(part, sub, position)
                created += 1
            except NodeExistsError:
                continue
        if not created:
            raise HttpError(409, "Subscription already exists for topic")
        return _no_content()

    async def delete_subscription(
        self, request: Request, caller: Caller, sub: str, **names: str
    ) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.MANAGE_SUBSCRIPTION, stream, sub)
        parts = await self._each(stream)
        if len(parts) == 1 and (redirect := await self._owner_elsewhere(request, stream)):
            return redirect
        deleted = 0
        for part in parts:
            if request.query.get("force") == "true":
                await self.broker.unload(part)  # (its consumers here are disconnected)
            try:
                await self.streams.unsubscribe(part, sub)
                deleted += 1
            except NoSuchSubscriptionError:
                continue
            except ConsumerBusyError:
                raise HttpError(412, "Subscription has active connected consumers") from None
        if not deleted:
            raise HttpError(404, f"Subscription {sub} not found for topic {topic_of(stream)}")
        return _no_content()

    async def reset_to_time(
        self, request: Request, caller: Caller, sub: str, timestamp: str, **names: str
    ) -> Response:
        stream = topic_stream(**names)
        if not timestamp.isdigit():
            raise HttpError(400, f"the timestamp is epoch milliseconds, got {timestamp!r:.40}")
        self._check(caller, Operation.MANAGE_SUBSCRIPTION, stream, sub)
        return await self._reset(request, stream, sub, int(timestamp), partitioned_ok=True)

    async def reset_to_position(
        self, request: Request, caller: Caller, sub: str, **names: str
    ) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.MANAGE_SUBSCRIPTION, stream, sub)
        body = json_body(request, None)
        if body is None:
            raise HttpError(400, "the body is the message id to reset to: "
                            '{"ledgerId": L, "entryId": E}')  # fmt: skip
        return await self._reset(request, stream, sub, message_id(body, LATEST))

    async def _reset(
        self,
        request: Request,
        stream: str,
        sub: str,
        target: MessageId | int,
        partitioned_ok: bool = False,
    ) -> Response:
        """Move the subscription (each partition's: a time only) so the message at target
        (a position, or the first published at or after a time) comes next. On the
        broker that serves the subscription its consumers are disconnected and resume
        from there (Pulsar's reset); elsewhere the cursor is written."""
        parts = await self._each(stream)
        if parts != [stream] and not partitioned_ok:
            raise HttpError(405, "Reset-cursor at position is not allowed for partitioned-topic")
        if parts == [stream] and (redirect := await self._owner_elsewhere(request, stream)):
            return redirect
        reset = 0
        for part in parts:
            owned = self.broker.owned.get(part)
            dispatcher = owned.subscriptions.get(sub) if owned is not None else None
            try:
                if owned is not None and dispatcher is not None:
                    await owned.seek(sub, dispatcher, 0, target)  # (0: no session's own)
                elif isinstance(target, int):
                    await self.streams.reset_cursor_to_time(part, sub, target)
                else:
                    await self.streams.reset_cursor(part, sub, target)
                reset += 1
            except NoSuchSubscriptionError:
                continue
        if not reset:
            raise HttpError(404, f"Subscription {sub} not found for topic {topic_of(stream)}")
        return _no_content()

    # -- compaction, deduplication of a topic -------------------------------------------

    async def compact(self, request: Request, caller: Caller, **names: str) -> Response:
        """Pulsar's trigger: the compaction runs in the background (on this broker; its
        status: compaction_status); 409 while one runs here. A partitioned topic is
        compacted partition by partition, as Pulsar's admin does."""
        stream = topic_stream(**names)
        self._check(caller, Operation.ADMINISTER, stream)
        for part in await self._each(stream):
            running = self._compactions.get(part)
            if running is not None and not running.done():
                raise HttpError(409, f"Compaction already in progress for {topic_of(part)}")
        for part in await self._each(stream):
            self._compactions[part] = self.broker._spawn(self.streams.compact(part))
        if len(self._compactions) > MAX_COMPACTIONS_KEPT:  # (bounded: the finished go)
            for name in [n for n, t in self._compactions.items() if t.done()]:
                del self._compactions[name]
        return _no_content()

    async def compaction_status(self, request: Request, caller: Caller, **names: str) -> Response:
        """Pulsar's LongRunningProcessStatus of the last compaction asked of this broker:
        RUNNING, SUCCESS, ERROR (lastError), or -- none asked here -- SUCCESS when the
        stream has a compacted view, else NOT_RUN."""
        stream = topic_stream(**names)
        self._check(caller, Operation.READ, stream)
        await self._unpartitioned(stream, "compaction status")
        task = self._compactions.get(stream)
        if task is None:
            md, _ = await self.streams.read(stream)
            done = md.HasField("compaction")
            return json_response(200, {"status": "SUCCESS" if done else "NOT_RUN", "lastError": ""})
        if not task.done():
            return json_response(200, {"status": "RUNNING", "lastError": ""})
        error = None if task.cancelled() else task.exception()
        if task.cancelled() or error is not None:
            why = "cancelled" if error is None else f"{type(error).__name__}: {error}"
            return json_response(200, {"status": "ERROR", "lastError": why})
        return json_response(200, {"status": "SUCCESS", "lastError": ""})

    async def topic_dedup(self, request: Request, caller: Caller, **names: str) -> Response:
        stream = topic_stream(**names)
        self._check(caller, Operation.READ, stream)
        await self._partitions(stream)
        return json_response(200, True)

    # -- lookup -------------------------------------------------------------------------

    async def lookup(self, request: Request, caller: Caller, **names: str) -> Response:
        """The broker serving the topic (Pulsar's LookupData). One that does not exist
        yet, where the caller may have it created, and a partitioned topic's name (its
        partitions are looked up one by one) are answered with this broker; neither is
        taken over for it."""
        stream = topic_stream(**names)
        self._check(caller, Operation.LOOKUP, stream)
        info = self.broker.info
        try:
            if not await self.streams.partitions(stream):
                info = await self.broker.lookup(stream)
        except (NoSuchStreamError, StoreNoSuchStream):
            if not may_create(caller, self.broker.allow_auto_create):
                raise HttpError(404, "Topic not found.") from None
        tls = info.http_url.startswith("https:")
        return json_response(200, {
            "brokerUrl": info.pulsar_url, "brokerUrlTls": info.pulsar_url_tls,
            "httpUrl": info.http_url, "httpUrlTls": info.http_url if tls else "",
            "nativeUrl": info.pulsar_url, "brokerUrlSsl": "",
        })  # fmt: skip
