"""The docs' examples run against the integration tests' cluster of bookie processes."""

from tests.integration.conftest import cluster

__all__ = ["cluster"]
