"""A broker's stream writer tells the bookies a quiet stream's LAC (`streamlib broker
--quiet-lac-ms`, streamlib/ledger/driver.py's Context.quiet_lac_s): a direct-mode reader
tailing a stream the broker writes sees each last message although nothing follows it
(an entry's LAC otherwise travels only with the next add), while the broker's consumers
get it from the broker's local tail."""

from __future__ import annotations

import pytest

from streamlib.stream.positions import EARLIEST

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("quiet_lac_ms", ["0", "300"])  # (at once, the default; later)
async def test_a_direct_reader_sees_the_last_message_of_a_quiet_broker_stream(
    cluster, quiet_lac_ms
):
    cluster.start_bookies(3)
    cluster.start_brokers(1, extra=["--quiet-lac-ms", quiet_lac_ms])
    service = await cluster.service_client()
    producer = await service.create_producer("quiet")
    consumer = await service.subscribe("quiet", "s", "earliest")
    direct = await cluster.client()
    reader = await direct.create_reader("quiet", EARLIEST)
    for i in range(3):
        sent = await producer.send(b"only %d" % i)  # then nothing: the writer goes quiet
        message = await consumer.receive(timeout=30)
        assert (message.message_id, message.data) == (sent, b"only %d" % i)
        consumer.acknowledge(message)
        # No add follows to carry this entry's LAC: the quiet writer's explicit LAC does.
        read = await reader.read_next(timeout=30)
        assert (read.message_id, read.data) == (sent, b"only %d" % i)
