"""The bookie wire protocol: bookie.proto and its generated code, shared by the bookie
server and every client. Imports nothing of ours but its own generated modules."""
