"""A client counts what its producers and consumers do: client.stats(), and the same as
Prometheus metrics (its registry, and an HTTP endpoint on 127.0.0.1)."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import generate_latest

import streamlib

pytestmark = pytest.mark.timeout(120)


def test_stats_and_prometheus_metrics_count_what_happened(cluster):
    cluster.start_bookies(3)
    with streamlib.connect(cluster.metadata_uri) as client:
        producer = client.create_producer("counted")
        for i in range(10):
            producer.send(b"%d" % i)
        consumer = client.subscribe("counted", "sub", "earliest")
        for i in range(10):
            message = consumer.receive(timeout=30)
            if i < 8:
                consumer.acknowledge(message)
            else:
                consumer.negative_acknowledge(message.message_id)
        stats = client.stats()
        sent = stats["producers"]["counted"]
        assert (sent["sent"], sent["send_errors"], sent["pending"]) == (10, 0, 0)
        assert sent["mean_send_latency_ms"] > 0
        got = stats["consumers"]["counted/sub"]
        assert (got["received"], got["acknowledged"], got["negatively_acknowledged"]) == (10, 8, 2)
        assert got["active"] is True

        text = generate_latest(client.metrics_registry).decode()
        assert 'streamlib_client_messages_sent_total{stream="counted"} 10.0' in text
        assert (
            'streamlib_client_messages_acknowledged_total{stream="counted",subscription="sub"} 8.0'
            in text
        )
        assert 'streamlib_client_send_latency_seconds_count{stream="counted"} 10.0' in text

        port = client.serve_metrics(0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            served = answer.read().decode()
        assert (
            'streamlib_client_messages_received_total{stream="counted",subscription="sub"} 10.0'
            in served
        )
    with pytest.raises(OSError):  # closing the client stopped the endpoint
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
