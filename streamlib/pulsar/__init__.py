"""Pulsar's binary protocol on a streamlib broker: the official Pulsar clients, in any
language, produce to and consume from streams unmodified (docs/pulsar.md)."""
