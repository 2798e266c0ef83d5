"""A client's own metrics: what its producers and consumers did, counted in plain
attributes on the hot paths and read only when asked (client.stats(), or a Prometheus
scrape of client.metrics_registry), so counting costs nothing per message.

    client.stats()   # {"producers": {stream: {...}}, "consumers": {"stream/sub": {...}}}
    prometheus_client.generate_latest(client.metrics_registry)
    client.serve_metrics(9464)        # an HTTP endpoint on 127.0.0.1:9464
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from streamlib.protocol.errors import BadRequestError
from streamlib.stream.admin import partition_name
from streamlib.stream.consumer import Consumer
from streamlib.stream.positions import EARLIEST, MessageId
from streamlib.stream.producer import Producer
from streamlib.stream.reader import Feed, Reader
from streamlib.stream.table_view import TableView

_PRODUCER_COUNTS = ("sent", "send_errors", "pending_messages", "latency_sum_s")
_CONSUMER_COUNTS = ("received", "acknowledged", "negatively_acknowledged", "dead_lettered")


def _summed(
    things: Iterable[object],
) -> tuple[dict[str, dict[str, Any]], dict[Any, dict[str, Any]]]:
    """Counts per stream (producers) and per (stream, subscription) (consumers), summed
    over every one the client made: a stream's producer closed and made again counts
    once with its predecessors, as one series."""
    producers: dict[str, dict[str, Any]] = {}
    consumers: dict[Any, dict[str, Any]] = {}
    for thing in things:
        if isinstance(thing, Producer):
            into = producers.setdefault(thing.stream, dict.fromkeys(_PRODUCER_COUNTS, 0))
            for name in _PRODUCER_COUNTS:
                into[name] += getattr(thing, name)
        elif isinstance(thing, Consumer):
            key = (thing.stream, thing.subscription)
            into = consumers.setdefault(key, {**dict.fromkeys(_CONSUMER_COUNTS, 0),
                                              "active": False})  # fmt: skip
            for name in _CONSUMER_COUNTS:
                into[name] += getattr(thing, name)
            into["active"] = into["active"] or thing.is_active
    return producers, consumers


def stats(things: Iterable[object]) -> dict[str, Any]:
    """Per producer (by stream) and consumer (by stream/subscription): its counts."""
    producers, consumers = _summed(things)
    return {
        "producers": {
            stream: {
                "sent": c["sent"],
                "send_errors": c["send_errors"],
                "pending": c["pending_messages"],
                "mean_send_latency_ms": round(
                    c["latency_sum_s"] / c["sent"] * 1000 if c["sent"] else 0.0, 3
                ),
            }
            for stream, c in producers.items()
        },
        "consumers": {f"{stream}/{sub}": c for (stream, sub), c in consumers.items()},
    }


class ClientCollector(Collector):
    """The Prometheus view of stats(): counters per stream and subscription."""

    def __init__(self, things: Callable[[], Iterable[object]]) -> None:
        self._things = things

    def collect(self) -> Iterator[Any]:
        sent = CounterMetricFamily(
            "streamlib_client_messages_sent", "Messages sent and durable", labels=["stream"]
        )
        errors = CounterMetricFamily(
            "streamlib_client_send_errors", "Messages whose send failed", labels=["stream"]
        )
        pending = GaugeMetricFamily(
            "streamlib_client_pending_messages", "Messages sent, not yet durable", labels=["stream"]
        )
        latency = SummaryMetricFamily(
            "streamlib_client_send_latency_seconds", "Send to durable", labels=["stream"]
        )
        received = CounterMetricFamily(
            "streamlib_client_messages_received",
            "Messages a consumer delivered",
            labels=["stream", "subscription"],
        )
        acked = CounterMetricFamily(
            "streamlib_client_messages_acknowledged",
            "Messages acknowledged",
            labels=["stream", "subscription"],
        )
        nacked = CounterMetricFamily(
            "streamlib_client_messages_negatively_acknowledged",
            "Messages negatively acknowledged",
            labels=["stream", "subscription"],
        )
        producers, consumers = _summed(list(self._things()))
        for stream, c in producers.items():
            sent.add_metric([stream], c["sent"])
            errors.add_metric([stream], c["send_errors"])
            pending.add_metric([stream], c["pending_messages"])
            latency.add_metric([stream], c["sent"], c["latency_sum_s"])
        for (stream, subscription), c in consumers.items():
            labels = [stream, subscription]
            received.add_metric(labels, c["received"])
            acked.add_metric(labels, c["acknowledged"])
            nacked.add_metric(labels, c["negatively_acknowledged"])
        yield from (sent, errors, pending, latency, received, acked, nacked)


class MetricsServer:
    """A client's /metrics endpoint (client.serve_metrics): one at a time, stopped with
    the client."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._server: Any = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        from prometheus_client import start_http_server

        if self._server is not None:
            raise BadRequestError("this client serves its metrics already")
        server, _thread = start_http_server(port, addr=addr, registry=self._registry)
        self._server = server
        return int(server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def registry_for(things: Callable[[], Iterable[object]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClientCollector(things))
    return registry


class ClientParts:
    """What both clients (direct mode's, the stream service's) keep alike: the
    producers, consumers and readers they made, closed with them, and their counts."""

    def __init__(self) -> None:
        self._open: list[Any] = []  # producers / consumers / readers to close with us
        #: The client's metrics for Prometheus.
        self.metrics_registry = registry_for(lambda: self._open)
        self._metrics = MetricsServer(self.metrics_registry)

    def _keep(self, thing: Any, listener: Callable[..., object] | None = None) -> Any:
        """Keep what was made (to close it with the client); start its listener."""
        self._open.append(thing)
        if listener is not None:
            thing.listen(listener)
        return thing

    async def _reader(
        self, stream: str, partitions: int, feed: Feed, start: MessageId, inclusive: bool
    ) -> Reader:
        """A reader of `stream` over `feed` from `start` (kept): refused for a
        partitioned stream, which is read partition by partition."""
        if partitions:
            raise BadRequestError(
                f"stream {stream!r} is partitioned: read each partition "
                f"({partition_name(stream, 0)}, ...), or subscribe to {stream!r}"
            )
        after = await feed.restart(start, inclusive)
        reader = Reader(feed, stream, EARLIEST if after is None else after, inclusive)
        self._open.append(reader)
        return reader

    async def create_table_view(self, stream: str, schema: Any = None) -> TableView:
        """pulsar-client's TableView: a live read-only mapping of the latest value of
        every key of `stream` (decoded with `schema`), kept by a compacted reader; it
        returns once it holds every key up to the end of the stream now. See
        streamlib/stream/table_view.py."""
        view = await TableView.create(self, stream, schema)
        self._open.append(view)
        return view

    def stats(self) -> dict[str, Any]:
        """What this client's producers (by stream) and consumers (by
        "stream/subscription") did: sent, send errors, pending, mean send latency;
        received, acknowledged, negatively acknowledged, dead-lettered, active."""
        return stats(self._open)

    def serve_metrics(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve metrics_registry for Prometheus on http://addr:port/ (0: any free port);
        the port. Stops with the client."""
        return self._metrics.serve(port, addr)

    async def _close_parts(self) -> None:
        self._metrics.stop()
        for thing in reversed(self._open):
            try:
                await thing.close()
            except Exception:  # (closing the rest matters more than one's failure)
                pass
        self._open.clear()
