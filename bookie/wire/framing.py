"""Frames of the framed add stream (bookie.proto, FramedHello): a 4-byte big-endian
length, then that many bytes of one protobuf message.

Shared by the bookie's framed listener and the client's framed add stream, so both
read and bound frames the same way. Imports nothing of ours but the generated code.
"""

from __future__ import annotations

import asyncio
import socket

FRAMED_VERSION = 1
HEADER_BYTES = 4
# A hello is a version and a token: a JWT is a few hundred bytes. A first frame that
# claims more is junk (an HTTP request's "GET " reads as ~1.2 GB) and is not read.
MAX_HELLO_BYTES = 64 << 10
# The StreamReader limit of both ends: asyncio's default (64 KiB) pauses the socket each
# time 128 KiB wait unread, and a reader waiting for a frame of megabytes (a big add
# batch) resumes it again and again. Per connection about twice this may wait unread.
STREAM_LIMIT_BYTES = 1 << 20
# Past this a frame's header and message are written apart: one more send beats
# copying megabytes into one buffer.
_JOIN_MAX_BYTES = 256 << 10


class FrameError(Exception):
    """The peer broke the framing: a frame over the limit, or the stream ended inside
    a frame. The connection cannot go on (the next frame's start is unknown)."""


def frame(message: bytes) -> bytes:
    """One frame holding message (a serialized protobuf)."""
    return len(message).to_bytes(HEADER_BYTES, "big") + message


def write_frame(writer: asyncio.StreamWriter, message: bytes) -> None:
    """Write one frame holding message (see _JOIN_MAX_BYTES)."""
    if len(message) <= _JOIN_MAX_BYTES:
        writer.write(len(message).to_bytes(HEADER_BYTES, "big") + message)
    else:
        writer.write(len(message).to_bytes(HEADER_BYTES, "big"))
        writer.write(message)


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """The next frame's message; None at a clean end of the stream (between frames).
    FrameError for a frame over max_bytes (nothing of it is read) or a cut one."""
    try:
        head = await reader.readexactly(HEADER_BYTES)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError("the stream ended inside a frame header") from None
        return None
    size = int.from_bytes(head, "big")
    if size > max_bytes:
        raise FrameError(f"a frame of {size} bytes is over the limit of {max_bytes} bytes")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as e:
        raise FrameError(
            f"the stream ended inside a frame ({len(e.partial)} of {size} bytes)"
        ) from None


def set_keepalive(writer: asyncio.StreamWriter, idle_s: float, timeout_s: float) -> None:
    """TCP keepalive: a peer gone without a FIN is found within idle_s + timeout_s."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the OS defaults apply
        interval = max(1, int(timeout_s / 3))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(idle_s)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
