"""Pulsar topic names and streams, one to one.

    persistent://public/default/NAME       the stream NAME
    persistent://TENANT/NAMESPACE/NAME     the stream TENANT:NAMESPACE:NAME
    NAME-partition-I                       partition I of NAME, in both

A stream name is one path component of the metadata store ([A-Za-z0-9._:-]), so a
tenant and namespace other than Pulsar's defaults are joined to the name with ':'
(a '/' would reach into other directories); the reverse mapping splits a stream name
of three ':'-separated parts the same way. Non-persistent topics have no stream.
"""

from __future__ import annotations

from metadata.errors import InvalidNameError
from metadata.services._base import validate_name

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
PERSISTENT = "persistent://"


class InvalidTopicError(InvalidNameError):
    """A topic name that names no stream (Pulsar's InvalidTopicName)."""


def stream_of(topic: str) -> str:
    """The stream a topic name is: a full name, TENANT/NAMESPACE/NAME, or a bare NAME
    (as pulsar-client expands a short name); InvalidTopicError otherwise."""
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError(f"a topic name is a non-empty string, got {topic!r:.80}")
    rest = topic
    if "://" in topic:
        domain, _, rest = topic.partition("://")
        if domain != "persistent":
            raise InvalidTopicError(
                f"topic {topic!r:.200}: only persistent:// topics are streams (not {domain}://)"
            )
    parts = rest.split("/")
    if len(parts) == 1:
        tenant, namespace, name = DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]
    elif len(parts) == 3:
        tenant, namespace, name = parts
    elif len(parts) == 4:  # (Pulsar's old form: tenant/cluster/namespace/name)
        raise InvalidTopicError(
            f"topic {topic!r:.200}: names with a cluster (tenant/cluster/namespace/topic) "
            "are not supported"
        )
    else:
        raise InvalidTopicError(
            f"topic {topic!r:.200} is persistent://TENANT/NAMESPACE/NAME or NAME"
        )
    for kind, part in (("tenant", tenant), ("namespace", namespace)):
        if not part or ":" in part:
            raise InvalidTopicError(f"topic {topic!r:.200}: {kind} {part!r:.80} is not a name")
    # (A name that would read back as another topic: one with ':' outside Pulsar's
    # default namespace, or of three ':'-parts in it, which is another namespace's.)
    default = (tenant, namespace) == (DEFAULT_TENANT, DEFAULT_NAMESPACE)
    if (not default and ":" in name) or (default and _namespaced(name)):
        raise InvalidTopicError(
            f"topic {topic!r:.200}: its name would be another namespace's stream (':' "
            "joins a tenant, a namespace and a name)"
        )
    stream = (
        name
        if (tenant, namespace) == (DEFAULT_TENANT, DEFAULT_NAMESPACE)
        else f"{tenant}:{namespace}:{name}"
    )
    try:
        return validate_name("stream", stream)
    except InvalidNameError as error:
        raise InvalidTopicError(f"topic {topic!r:.200}: {error}") from None


def _namespaced(stream: str) -> bool:
    """Whether a stream's name is TENANT:NAMESPACE:NAME (another namespace's topic)."""
    parts = stream.split(":")
    return len(parts) == 3 and all(parts)


def topic_of(stream: str) -> str:
    """The full topic name of a stream (stream_of's inverse)."""
    parts = stream.split(":")
    if _namespaced(stream):
        return f"{PERSISTENT}{parts[0]}/{parts[1]}/{parts[2]}"
    return f"{PERSISTENT}{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}/{stream}"


def namespace_of(stream: str) -> tuple[str, str]:
    """The tenant and namespace a stream's topic is in."""
    parts = stream.split(":")
    if _namespaced(stream):
        return parts[0], parts[1]
    return DEFAULT_TENANT, DEFAULT_NAMESPACE
