"""Bind and advertised addresses (BookKeeper's ``advertisedAddress``).

A server binds one address (``--host``, maybe a wildcard) and registers another, the
one other hosts dial. Registering the bind address breaks as soon as it is a wildcard:
``0.0.0.0:3181`` sends every client on another host to itself. The rule:

- ``--advertised-address HOST[:PORT]`` given: that (PORT defaults to the bound port);
- else a concrete bind host: the bind host;
- else (a wildcard bind): the local address of the interface that reaches the metadata
  store's first host (for a ZooKeeper URI), else of the default route; a host with
  neither is refused with a message asking for ``--advertised-address``.

A bookie's id is a name, not an address: it is kept in the bookie's cookie, so a bookie
whose address changes (a new IP after a restart) keeps its id, registers the new
address, and clients dial that.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from bookie.errors import BookieError

WILDCARDS = {"", "0.0.0.0", "::", "[::]", "*"}


class AddressError(BookieError):
    """No address other hosts can dial could be found or parsed."""


def split_host_port(address: str, default_port: int | None = None) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` -> (host, port)."""
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""  # a bare name, IPv4 or IPv6 address
    if not host:
        raise AddressError(f"address {address!r} has no host")
    if not port_text:
        if default_port is None:
            raise AddressError(f"address {address!r} has no port")
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise AddressError(f"address {address!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise AddressError(f"address {address!r}: port {port} is out of range")
    return host, port


def join_host_port(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass  # a name
    return f"{host}:{port}"


def is_wildcard(host: str) -> bool:
    return host.strip() in WILDCARDS


def _local_address_towards(host: str, port: int) -> str | None:
    """The source address the kernel picks to reach host:port (a UDP connect sends
    nothing); None when there is no route."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, target in infos:
        with socket.socket(family, kind, proto) as s:
            try:
                s.connect(target)
            except OSError:
                continue
            local = str(s.getsockname()[0])
            if not ipaddress.ip_address(local).is_unspecified:
                return local
    return None


def _metadata_host(metadata_uri: str | None) -> tuple[str, int] | None:
    if not metadata_uri or not metadata_uri.startswith("zk://"):
        return None
    first = urlsplit(metadata_uri).netloc.rsplit("@", 1)[-1].split(",")[0]
    try:
        return split_host_port(first, 2181)
    except AddressError:
        return None


def primary_address(metadata_uri: str | None) -> str | None:
    """The address other hosts most likely reach this one by (see the module doc)."""
    target = _metadata_host(metadata_uri)
    if target is not None:
        local = _local_address_towards(*target)
        if local is not None and not ipaddress.ip_address(local).is_loopback:
            return local
    # No packets are sent: a UDP connect only asks the routing table.
    return _local_address_towards("192.0.2.1", 9)


def advertised_address(
    bind_host: str,
    bound_port: int,
    advertised: str | None,
    metadata_uri: str | None,
    *,
    what: str = "--advertised-address",
) -> str:
    """The ``host:port`` to register for a server bound to ``bind_host:bound_port``."""
    if advertised:
        host, port = split_host_port(advertised, bound_port)
        if is_wildcard(host):
            raise AddressError(f"{what} {advertised!r} is a wildcard; give an address others dial")
        return join_host_port(host, port)
    if not is_wildcard(bind_host):
        return join_host_port(bind_host.strip("[]"), bound_port)
    found = primary_address(metadata_uri)
    if found is None:
        raise AddressError(
            f"bound to the wildcard address {bind_host or '*'} and no address of this host "
            f"was found that others can dial (no route to the metadata store or a default "
            f"route): start it with {what} HOST[:PORT]"
        )
    return join_host_port(found, bound_port)
