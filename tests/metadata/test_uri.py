"""Metadata URIs: each backend's form, and typed errors for everything else."""

from __future__ import annotations

import pytest

import metadata
from metadata.uri import MetadataURI, redact_uri


def test_zookeeper_uri_with_several_hosts_chroot_and_digest_auth():
    parsed = metadata.parse_uri("zk://10.0.0.1:2181,10.0.0.2:2182/streamlib/prod?auth=digest:u:p")
    assert parsed == MetadataURI("zk", "10.0.0.1:2181,10.0.0.2:2182", "/streamlib/prod", ("u", "p"))


def test_a_printed_uri_never_shows_the_zookeeper_password():
    uri = "zk://h:2181/c?operation_timeout_s=3&auth=digest:admin:s3cret"
    assert redact_uri(uri) == "zk://h:2181/c?operation_timeout_s=3&auth=digest:admin:PASSWORD"
    assert redact_uri("sqlite:///var/lib/meta.db") == "sqlite:///var/lib/meta.db"


def test_zookeeper_uri_without_chroot_uses_the_root():
    assert metadata.parse_uri("zk://127.0.0.1:2181").path == "/"


def test_sqlite_uri_names_an_absolute_file():
    assert (
        metadata.parse_uri("sqlite:///var/lib/streamlib/meta.db").path
        == "/var/lib/streamlib/meta.db"
    )


def test_memory_uri_with_and_without_a_shared_name():
    assert metadata.parse_uri("memory://").path == ""
    assert metadata.parse_uri("memory://cluster-1").path == "cluster-1"


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "zk:/127.0.0.1:2181",
        "127.0.0.1:2181",
        "zk://",
        "zk://127.0.0.1/chroot",
        "zk://127.0.0.1:99999/chroot",
        "zk://127.0.0.1:port/chroot",
        "zk://127.0.0.1:2181/bad//chroot",
        "zk://127.0.0.1:2181/x?auth=sasl:u:p",
        "sqlite://relative/meta.db",
        "sqlite:///",
        "memory://bad/name",
        None,
    ],
    ids=repr,
)
async def test_malformed_uris_raise_invalid_uri(uri):
    with pytest.raises(metadata.InvalidURIError):
        await metadata.connect(uri)


@pytest.mark.parametrize("uri", ["etcd://127.0.0.1:2379", "http://x", "mysql:///db"])
async def test_unknown_schemes_raise_unknown_scheme(uri):
    with pytest.raises(metadata.UnknownSchemeError, match="unknown metadata scheme"):
        await metadata.connect(uri)


async def test_sqlite_store_in_a_missing_directory_is_a_typed_error(tmp_path):
    with pytest.raises(metadata.StoreIOError):
        await metadata.connect(f"sqlite://{tmp_path}/no/such/dir/meta.db")


async def test_a_file_that_is_not_a_database_is_a_typed_error(tmp_path):
    (tmp_path / "meta.db").write_bytes(b"this is not an sqlite database" * 100)
    with pytest.raises(metadata.StoreIOError):
        await metadata.connect(f"sqlite://{tmp_path}/meta.db")


async def test_unreachable_zookeeper_is_a_connection_loss():
    with pytest.raises(metadata.ConnectionLossError):
        await metadata.connect("zk://127.0.0.1:1/x", connect_timeout_s=0.5)


@pytest.mark.parametrize(
    "uri, options",
    [
        ("memory://", {"poll_interval_s": 1}),
        ("sqlite:///tmp/never-created/meta.db", {"operation_timeout_s": 1}),
        ("sqlite:///tmp/never-created/meta.db", {"synchronous": "sometimes"}),
        ("memory://", {"session_timeout_s": 0}),
    ],
)
async def test_unknown_or_bad_options_are_typed_errors(uri, options):
    with pytest.raises(metadata.MetadataError):
        await metadata.connect(uri, **options)
