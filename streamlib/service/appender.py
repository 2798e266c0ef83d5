"""A producer's appender through the stream service: the entries its Producer builds
(streamlib/stream/producer.py: batching, compression, chunks, schemas are done there,
as in direct mode) go to the stream's owner, which stores each as it is.

Entries not yet acknowledged are sent again, in order, with the same bytes, whenever
the connection is opened again (the broker died, lost the stream, unloaded it): the
owner's deduplication drops what the old owner had written, so an entry is stored
exactly once across a failover, and is answered with where it went.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from typing import Any

from streamlib.protocol.errors import BrokerUnavailableError, ClientClosedError, StreamlibError
from streamlib.service.connection import EOF, Brokers, Session, read
from streamlib.stream.positions import MessageId
from streamlib.wire import broker_pb2 as pb
from streamlib.wire.convert import error_from_pb, id_from_pb

SEND_BATCH_BYTES = 1 << 20  # entries per gRPC message: about this many bytes
SEND_BATCH_ENTRIES = 1000


class SchemaChecked(StreamlibError):
    """(internal) The producer checked the stream's schema: open again at once."""

    retriable = True


class _Entry:
    __slots__ = ("future", "send")

    def __init__(self, send: pb.EntrySend, future: asyncio.Future[tuple[int, int]]) -> None:
        self.send = send
        self.future = future


class ServiceAppender(Session):
    creates_stream = True

    def __init__(
        self, brokers: Brokers, stream: str, name: str, access_mode: str, schema: Any
    ) -> None:
        super().__init__(brokers, stream)
        self.name = stream
        self.producer_name = name  # (the broker's, once open, when not given)
        self.access_mode = access_mode
        self.schema = schema
        self._schema_checked = ("", "")  # the stream's schema ours was found compatible with
        self.last_sequence_id = -1  # the name's last, as the broker knew it at the open
        self.recent: dict[int, MessageId] = {}  # ... and where its last sends went
        # Appended and not yet acknowledged, in order; the first `_sent` of them went on
        # the current connection.
        self._pending: collections.deque[_Entry] = collections.deque()
        self._sent = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._error: BaseException | None = None

    # -- the Appender of streamlib.stream.producer --------------------------------------

    def append_entry(
        self, entry: bytes, first_sequence_id: int, last_sequence_id: int, messages: int
    ) -> asyncio.Future[tuple[int, int]]:
        if self._error is not None:
            raise self._error
        if self.closed:
            raise ClientClosedError(f"producer of {self.stream!r} is closed")
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        send = pb.EntrySend(
            entry=entry,
            first_sequence_id=first_sequence_id,
            last_sequence_id=last_sequence_id,
            messages=messages,
        )
        self._pending.append(_Entry(send, future))
        self._drained.clear()
        self._wake.set()
        return future

    async def flush(self) -> None:
        """Wait until everything appended is acknowledged (or failed)."""
        await self._drained.wait()

    async def close(self) -> None:
        if self.closed:
            return
        if self._error is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flush(), 30)
        await self.stop()
        self.fail(ClientClosedError(f"producer of {self.stream!r} is closed"))

    # -- the session --------------------------------------------------------------------

    def _check_schema(self, stored: dict[str, str]) -> None:
        """The stream has another schema: IncompatibleSchemaError unless ours reads what
        was written with it; then the next open offers ours as checked against it."""
        from streamlib.schema import SCHEMA_DEFINITION, SCHEMA_TYPE, check_against

        check_against(self.schema, stored)
        self._schema_checked = (stored[SCHEMA_TYPE], stored.get(SCHEMA_DEFINITION, ""))

    def _open_request(self) -> pb.ProduceRequest:
        opened = pb.ProducerOpen(
            stream=self.stream,
            producer_name=self.producer_name,
            access_mode=self.access_mode,
            resume=self.ready.done(),  # (again: its old session may linger there)
        )
        schema = self.schema
        if schema is not None and schema.type_name != "bytes":
            opened.schema_type = schema.type_name
            opened.schema_definition = schema.definition()
            opened.schema_checked_type, opened.schema_checked_definition = self._schema_checked
        return pb.ProduceRequest(open=opened)

    async def session(self, address: str) -> None:
        call = self.brokers.open_call(address, "produce")
        try:
            try:
                first = await self.open(call, self._open_request())
            except StreamlibError as refused:
                if getattr(refused, "remote_code", None) != "SchemaCheckNeeded":
                    raise
                self._check_schema(json.loads(str(refused).partition(": ")[2]))
                raise SchemaChecked("the schema was checked: open again") from None
            ready = first.ready
            self.producer_name = ready.producer_name
            if not self.ready.done():
                self.last_sequence_id = ready.last_sequence_id
                self.recent = {r.sequence_id: id_from_pb(r.message_id) for r in ready.recent}
                self.ready.set_result(None)
            self.up(call)
            # Everything unacknowledged goes again, in order, on this connection.
            self._sent = 0
            self._wake.set()
            sender = asyncio.get_running_loop().create_task(self._send_loop(call))
            try:
                await self._receive_loop(call)
            finally:
                self.down()
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
        finally:
            call.cancel()

    async def _send_loop(self, call: Any) -> None:
        while True:
            if self._sent >= len(self._pending):
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = pb.EntryBatch()
            size = 0
            pending = self._pending
            while (
                self._sent < len(pending)
                and len(batch.entries) < SEND_BATCH_ENTRIES
                and size < SEND_BATCH_BYTES
            ):
                send = pending[self._sent].send
                batch.entries.append(send)
                size += len(send.entry) + 32
                self._sent += 1
            await call.write(pb.ProduceRequest(entries=batch))

    async def _receive_loop(self, call: Any) -> None:
        while True:
            response = await read(call)
            if response is EOF:
                raise BrokerUnavailableError("the broker ended the producer's stream")
            which = response.WhichOneof("kind")
            if which == "receipts":
                for receipt in response.receipts.receipts:
                    m = receipt.message_id
                    self._settle(receipt.sequence_id, (m.ledger_id, m.entry_id), None)
            elif which == "failed":
                error = error_from_pb(response.failed.error)
                for sequence_id in response.failed.sequence_ids:
                    self._settle(sequence_id, None, error)
            elif which == "error":
                raise error_from_pb(response.error)

    def _settle(
        self,
        last_sequence_id: int,
        where: tuple[int, int] | None,
        error: BaseException | None,
    ) -> None:
        """The broker answered the first entry sent whose last sequence id this is (it
        answers in order; a failure may come after later entries' receipts)."""
        pending = self._pending
        for index in range(min(self._sent, len(pending))):
            entry = pending[index]
            if entry.send.last_sequence_id == last_sequence_id:
                del pending[index]
                self._sent -= 1
                if not entry.future.done():
                    if error is not None:
                        entry.future.set_exception(error)
                    else:
                        entry.future.set_result(where)  # type: ignore[arg-type]
                break
        if not pending:
            self._drained.set()

    def fail(self, error: BaseException) -> None:
        self._error = self._error or error
        for entry in self._pending:
            if not entry.future.done():
                entry.future.set_exception(error)
        self._pending.clear()
        self._sent = 0
        self._drained.set()
