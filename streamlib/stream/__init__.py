"""Streams: the managed log of ledgers (writer, rolls, retention) and the pub/sub API on
top of it (producer, consumer, reader, their entry format and subscription types)."""
