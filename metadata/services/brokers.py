"""Brokers (the stream service): each live broker's registration, and who owns a stream.

A live broker holds an ephemeral node with its address and load; ownership of a stream
is an ephemeral node too (the lease): it belongs to the owner's session, so a broker
that dies or loses its session loses its streams, and another may take them. A lease
is only "leader suggestion" (protocol.txt, "Ledgers to logs"): the broker that acquires
one must still take the stream over by fencing before it serves it, which is what keeps
a deposed owner that still runs from acknowledging anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from metadata.errors import (
    BadVersionError,
    InvalidValueError,
    NodeExistsError,
    NoNodeError,
    TransactionError,
)
from metadata.services._base import Service, validate_name
from metadata.store import CheckVersion, Create, Delete, Set


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: str
    address: str  # host:port clients dial (the advertised address)
    owned: int = 0  # streams it owns: what lookup balances on
    pid: int = 0
    # Pulsar's binary protocol and admin REST ports, when the broker serves them (empty:
    # it does not): what a Pulsar lookup answers with (streamlib/pulsar/).
    pulsar_url: str = ""  # pulsar://host:port
    pulsar_url_tls: str = ""  # pulsar+ssl://host:port
    http_url: str = ""  # http(s)://host:port of the admin REST port
    # Which process this is (streamlib.protocol.ownership.Incarnation): random per
    # process, its host (boot and pid namespace) and start time -- what evidence that
    # the process is gone is weighed against.
    incarnation: str = ""
    host: str = ""
    started: int = 0
    # Its load report (streamlib/broker/load.py; streamlib/protocol/load.py weighs it),
    # renewed every --load-report-interval: per second over the last interval. Absent
    # (0) in a lease, and from a broker that does not report.
    msgs_in_rate: float = 0.0
    msgs_out_rate: float = 0.0
    bytes_in_rate: float = 0.0
    bytes_out_rate: float = 0.0
    cpu_percent: float = 0.0  # the process's, of one core
    reported: float = 0.0  # wall-clock time of the report (0: none yet)
    # Its busiest streams: (stream, msgs/s, bytes/s), in + out -- what may be shed.
    stream_rates: tuple[tuple[str, float, float], ...] = ()

    def encode(self) -> bytes:
        # (as json.dumps(asdict(self)) writes it, without asdict's deep copy: a broker
        # writes its registration each time the streams it owns change)
        values = {name: getattr(self, name) for name in _FIELD_NAMES}
        return json.dumps(values, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> BrokerInfo:
        try:
            raw = json.loads(data)
            return cls(
                str(raw["broker_id"]),
                str(raw["address"]),
                int(raw["owned"]),
                int(raw.get("pid", 0)),
                str(raw.get("pulsar_url", "")),
                str(raw.get("pulsar_url_tls", "")),
                str(raw.get("http_url", "")),
                str(raw.get("incarnation", "")),
                str(raw.get("host", "")),
                int(raw.get("started", 0)),
                float(raw.get("msgs_in_rate", 0.0)),
                float(raw.get("msgs_out_rate", 0.0)),
                float(raw.get("bytes_in_rate", 0.0)),
                float(raw.get("bytes_out_rate", 0.0)),
                float(raw.get("cpu_percent", 0.0)),
                float(raw.get("reported", 0.0)),
                tuple(
                    (str(name), float(msgs), float(size))
                    for name, msgs, size in raw.get("stream_rates", ())
                ),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise InvalidValueError(f"not a broker registration: {data[:80]!r}") from error


_FIELD_NAMES = tuple(field.name for field in fields(BrokerInfo))


def same_process(a: BrokerInfo, b: BrokerInfo) -> bool:
    """Whether two registrations or leases name one broker process (by its incarnation;
    by its id for one that predates incarnations)."""
    if a.incarnation or b.incarnation:
        return a.incarnation == b.incarnation
    return a.broker_id == b.broker_id


class BrokerRegistry(Service):
    @property
    def live_directory(self) -> str:
        """Where live brokers register (watch its children for brokers that come and go)."""
        return self.path("brokers", "available")

    def _live_path(self, broker_id: str) -> str:
        return self.path("brokers", "available", validate_name("broker", broker_id))

    def owner_path(self, stream: str) -> str:
        return self.path("brokers", "owners", validate_name("stream", stream))

    async def register(self, info: BrokerInfo) -> None:
        """Announce a live broker (NodeExistsError while another session holds the id)."""
        await self.ensure(self.path("brokers", "available"))
        try:
            await self.store.create(self._live_path(info.broker_id), info.encode(), ephemeral=True)
        except NodeExistsError:
            raise NodeExistsError(
                f"broker {info.broker_id} is registered by another live session; "
                "wait for it to expire or stop the other process"
            ) from None

    async def update(self, info: BrokerInfo) -> None:
        await self.store.set(self._live_path(info.broker_id), info.encode())

    async def registered(self, broker_id: str) -> tuple[BrokerInfo, int] | None:
        """The live registration under `broker_id` and its version, if there is one."""
        try:
            node = await self.store.get(self._live_path(broker_id))
        except NoNodeError:
            return None
        return BrokerInfo.decode(node.data), node.version

    async def evict(self, info: BrokerInfo, version: int) -> bool:
        """Delete a registration whose process is gone (streamlib.protocol.ownership):
        the one read, at `version`. (A registration gone and made again meanwhile, at
        the same version, would go too: its broker registers again within a third of
        its session -- Broker._keep_registered -- and until then is only not assigned
        new streams.)"""
        try:
            await self.store.delete(self._live_path(info.broker_id), version=version)
        except (NoNodeError, BadVersionError):
            return False
        return True

    async def unregister(self, broker_id: str) -> None:
        try:
            await self.store.delete(self._live_path(broker_id))
        except NoNodeError:
            pass

    async def live(self) -> list[BrokerInfo]:
        """Every live broker, by id."""
        try:
            ids = await self.store.children(self.path("brokers", "available"))
        except NoNodeError:
            return []
        found: list[BrokerInfo] = []
        for broker_id in sorted(ids):
            try:
                found.append(
                    BrokerInfo.decode((await self.store.get(self._live_path(broker_id))).data)
                )
            except NoNodeError:
                continue  # gone meanwhile
        return found

    async def try_own(self, stream: str, info: BrokerInfo) -> bool:
        """Take the lease on `stream` for this session's broker; False if another holds
        it. Each lease taken also bumps the stream's epoch node (brokers/epochs/STREAM,
        persistent), in the same transaction: what an eviction checks (evict_lease)."""
        await self.ensure(self.path("brokers", "owners"))
        await self.ensure(self.path("brokers", "epochs"))
        try:
            await self.store.create(self._epoch_path(stream))
        except NodeExistsError:
            pass  # (every lease after the first)
        try:
            await self.store.transaction(
                [
                    Create(self.owner_path(stream), info.encode(), ephemeral=True),
                    Set(self._epoch_path(stream), b""),
                ]
            )
        except TransactionError as error:
            if isinstance(error.cause, NodeExistsError):
                return False
            raise error.cause from None
        return True

    async def lease(self, stream: str) -> tuple[BrokerInfo | None, int]:
        """The lease's holder (None: nobody) and the stream's epoch (-1: none) -- the
        epoch read first, so a holder read after it was taken at that epoch or later."""
        try:
            epoch = (await self.store.get(self._epoch_path(stream))).version
        except NoNodeError:
            epoch = -1
        return await self.owner(stream), epoch

    async def evict_lease(self, stream: str, epoch: int) -> bool:
        """Delete `stream`'s lease, whose holder's process is gone, if no lease was taken
        since `epoch` (read by lease() with that holder): a stale read -- another evictor
        came first, and the next owner holds a new lease -- deletes nothing. (A lease is
        always at version 0: its own version cannot tell.)"""
        if epoch < 0:
            return False  # (a lease from before epochs: wait for its session)
        try:
            await self.store.transaction(
                [CheckVersion(self._epoch_path(stream), epoch), Delete(self.owner_path(stream))]
            )
        except TransactionError:
            return False  # (the lease changed or went)
        return True

    def _epoch_path(self, stream: str) -> str:
        return self.path("brokers", "epochs", validate_name("stream", stream))

    async def forget_stream(self, stream: str) -> None:
        """A deleted stream's epoch node goes too."""
        try:
            await self.store.delete(self._epoch_path(stream))
        except NoNodeError:
            pass

    async def owner(self, stream: str) -> BrokerInfo | None:
        try:
            return BrokerInfo.decode((await self.store.get(self.owner_path(stream))).data)
        except NoNodeError:
            return None

    async def release(self, stream: str, info: BrokerInfo) -> None:
        """Give up the lease, if this incarnation of the broker holds it (another process
        of the same id -- a replacement started while this one was cut off -- keeps its
        own)."""
        try:
            node = await self.store.get(self.owner_path(stream))
        except NoNodeError:
            return
        if not same_process(BrokerInfo.decode(node.data), info):
            return
        try:
            await self.store.delete(self.owner_path(stream), version=node.version)
        except NoNodeError:
            pass
