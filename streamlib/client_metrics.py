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
from streamlib.stream.consumer import Consumer
from streamlib.stream.producer import Producer


def stats(things: Iterable[object]) -> dict[str, Any]:
    """Per producer (by stream) and consumer (by stream/subscription): its counts."""
    producers: dict[str, dict[str, Any]] = {}
    consumers: dict[str, dict[str, Any]] = {}
    for thing in things:
        if isinstance(thing, Producer):
            mean = thing.latency_sum_s / thing.sent if thing.sent else 0.0
            producers[thing.stream] = {
                "sent": thing.sent,
                "send_errors": thing.send_errors,
                "pending": thing.pending_messages,
                "mean_send_latency_ms": round(mean * 1000, 3),
            }
        elif isinstance(thing, Consumer):
            consumers[f"{thing.stream}/{thing.subscription}"] = {
                "received": thing.received,
                "acknowledged": thing.acknowledged,
                "negatively_acknowledged": thing.negatively_acknowledged,
                "dead_lettered": thing.dead_lettered,
                "active": thing.is_active,
            }
    return {"producers": producers, "consumers": consumers}


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
        for thing in list(self._things()):
            if isinstance(thing, Producer):
                sent.add_metric([thing.stream], thing.sent)
                errors.add_metric([thing.stream], thing.send_errors)
                pending.add_metric([thing.stream], thing.pending_messages)
                latency.add_metric([thing.stream], thing.sent, thing.latency_sum_s)
            elif isinstance(thing, Consumer):
                labels = [thing.stream, thing.subscription]
                received.add_metric(labels, thing.received)
                acked.add_metric(labels, thing.acknowledged)
                nacked.add_metric(labels, thing.negatively_acknowledged)
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
