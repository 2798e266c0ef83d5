"""The stream service: brokers that own streams (server.py, owned.py), and its client
(client.py). See architecture 4a and the README's "Stream service" section."""
