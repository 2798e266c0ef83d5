"""The stream service's server side: the broker core -- ownership of streams
(ownership.py), a stream's writer and producers (owned.py), its subscriptions' dispatch
(dispatcher.py), the sessions (sessions.py), deduplication (dedup.py), the admin calls
(admin.py), load reports (load.py) and balancing (balance.py; `admin broker load|pin`:
load_admin.py) -- and its gRPC front end (server.py), admitting each caller (access.py).
Clients are streamlib/service; both speak streamlib/wire. Architecture 4a and the
README's "Stream service" section.

It must never import the client side (streamlib/service, streamlib/client.py) except
the command line's `unload`, which is a client's call.
"""
