"""The three store backends (memory, sqlite, zookeeper) and the tree semantics the first
two share. Chosen by metadata.connect from the URI; nothing else imports them directly.

Must never import: streamlib or bookie (the metadata layer depends on nothing of ours).
"""
