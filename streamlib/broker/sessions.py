"""What a broker holds for each producer and consumer connected to it, and how a
session ends when the broker lets the stream go."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from streamlib.protocol.dispatch import Kind
from streamlib.protocol.errors import (
    StreamlibError,
)

if TYPE_CHECKING:
    from streamlib.broker.dispatcher import Handed


class StreamGone(StreamlibError):
    """The broker no longer serves this stream (unloaded, or taken over elsewhere)."""

    retriable = True


@dataclass
class ProducerSession:
    name: str
    access_mode: str
    principal: str | None = None  # who opened it: only they may resume it
    fenced: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None


@dataclass(frozen=True)
class Done:
    what: str  # seek | unsubscribe
    error: BaseException | None = None


@dataclass
class ConsumerSession:
    cid: int
    name: str
    kind: Kind
    principal: str | None = None  # who opened it: only they may resume it
    # Deliveries to send: filled by the dispatcher, drained by the RPC (a Done: a seek or
    # unsubscribe it asked for is done; an error: the session ends with it).
    outbox: asyncio.Queue[list[Handed] | Done | BaseException] = field(
        default_factory=asyncio.Queue
    )
    active: bool = True
