"""The bookie wire protocol: bookie.proto and its generated code, shared by the bookie
server and every client. Imports nothing of ours but its own generated modules."""

from bookie.wire.bookie_pb2 import OK, AddResponse, AddResult


def add_results(response: AddResponse) -> list[AddResult]:
    """Every entry's answer in an AddResponse as AddResults: the explicit results, then
    the compact OK lists expanded (for tools and tests; the client reads `ok` as is)."""
    out = list(response.results)
    for ok in response.ok:
        out += [AddResult(ledger_id=ok.ledger_id, entry_id=e, status=OK) for e in ok.entry_ids]
    return out
