"""Evidence that a process is gone, gathered on this host (the rules that weigh it are
streamlib.protocol.ownership's): who this process is, whether another of this host
still runs, and whether an address refuses connections.

A host is its boot (``/proc/sys/kernel/random/boot_id``) and its pid namespace: two
processes that agree on both see the same pids. Network namespaces do not change it
(hosts made of them share the pids), and a reboot or a container does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os

from streamlib.protocol.ownership import Incarnation, Probe, Process, process_state

PROBE_TIMEOUT_S = 0.5  # a connection not refused by then is silence, not evidence


@functools.cache
def this_host() -> str:
    """This host's identity; "" when /proc cannot tell (then no process evidence is
    gathered here at all): no /proc, or a /proc of another pid namespace (its "self" is
    not this process)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return ""
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()  # noqa: SIM115
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{namespace}"


def start_time(pid: int) -> int | None:
    """When process `pid` of this host started (clock ticks after boot); None only if it
    is provably not running: no such process (ESRCH), or a zombie. A process this one
    may not see (EPERM, a /proc that hides it, a read that failed -- out of descriptors,
    say) counts as running, with an unknown start time (-1)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:  # (EPERM among them: it exists)
        return -1
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        state, started = fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return -1
    # After the command's closing parenthesis: state is field 3, starttime field 22.
    return None if state in (b"Z", b"X") else started


def identity() -> tuple[str, int, int]:
    """(host, pid, start time) of this process, for its registrations and locks."""
    pid = os.getpid()
    return this_host(), pid, max(0, start_time(pid) or 0)


def process_of(owner: Incarnation) -> Process:
    """What this host knows of `owner`'s process."""
    if not this_host() or owner.host != this_host() or not owner.pid:
        return Process.ELSEWHERE
    started = start_time(owner.pid)
    return process_state(owner, this_host(), started is not None, started)


async def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """Connect to HOST:PORT and hang up: REFUSED only for a refusal (an RST)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return Probe.SILENT
    host = host.removeprefix("[").removesuffix("]")
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except ConnectionRefusedError:
        return Probe.REFUSED
    except (OSError, TimeoutError):
        return Probe.SILENT
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Probe.ANSWERED
