"""The stream service's client side: connection.py (channels, lookups, reconnecting
sessions), appender.py (a producer's entries to the owner), subscription.py (a
consumer's and a reader's deliveries), admin.py (the streams' administration through a
broker), client.py (ServiceClient: streamlib.connect("streamlib://...")). The producer,
consumer and reader themselves are streamlib/stream's, shared with direct mode.

It talks to brokers only through the wire (streamlib/wire): it must never import the
server (streamlib/broker) nor the bookie.
"""
