"""Streams pinned to a broker (`streamlib admin broker pin STREAM BROKER_ID`): a lookup
assigns a pinned stream nobody owns to its broker when that one is live, and the load
manager never sheds it (it moves it to its broker instead). brokers/pins/STREAM holds
the broker's id."""

from __future__ import annotations

from metadata.errors import NodeExistsError, NoNodeError
from metadata.services._base import Service, validate_name


class BrokerPins(Service):
    def _pin_path(self, stream: str) -> str:
        return self.path("brokers", "pins", validate_name("stream", stream))

    async def pin(self, stream: str, broker_id: str) -> None:
        validate_name("broker", broker_id)
        await self.ensure(self.path("brokers", "pins"))
        try:
            await self.store.create(self._pin_path(stream), broker_id.encode())
        except NodeExistsError:
            await self.store.set(self._pin_path(stream), broker_id.encode())

    async def unpin(self, stream: str) -> bool:
        """Whether there was a pin."""
        try:
            await self.store.delete(self._pin_path(stream))
        except NoNodeError:
            return False
        return True

    async def pinned_to(self, stream: str) -> str | None:
        try:
            return (await self.store.get(self._pin_path(stream))).data.decode()
        except NoNodeError:
            return None

    async def pins(self) -> dict[str, str]:
        """Every pin: stream -> broker id."""
        try:
            streams = await self.store.children(self.path("brokers", "pins"))
        except NoNodeError:
            return {}
        found: dict[str, str] = {}
        for stream in streams:
            broker_id = await self.pinned_to(stream)
            if broker_id is not None:
                found[stream] = broker_id
        return found
