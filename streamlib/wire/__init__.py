"""The stream service's wire: the messages its clients (streamlib/service) and its
brokers (streamlib/broker) exchange (broker.proto), and the conversions both sides
need (convert.py). It sits below both and imports neither."""
