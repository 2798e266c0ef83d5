"""The stream service's server side: brokers that own streams (server.py: the gRPC
front end and ownership; owned.py: a stream's writer, producers and subscriptions'
dispatch; admin.py, access.py, dedup.py). Clients are streamlib/service; both speak
streamlib/wire. Architecture 4a and the README's "Stream service" section.

It must never import the client side (streamlib/service, streamlib/client.py) except
the command line's `unload`, which is a client's call.
"""
