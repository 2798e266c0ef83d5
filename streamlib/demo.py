"""The end-to-end demo `streamlib sandbox --demo` runs against a fresh cluster: it
writes a replicated ledger while a second client tails it, then a third client takes
over with fencing recovery, and prints what happened at each step."""

from __future__ import annotations

import asyncio
import time

from streamlib.client import Client
from streamlib.errors import LedgerFencedError


async def _demo(uri: str, messages: int) -> None:
    writer_client = await Client.connect(uri)
    tail_client = await Client.connect(uri)
    recover_client = await Client.connect(uri)
    try:
        writer = await writer_client.ledgers.create(ensemble=3, write_quorum=3, ack_quorum=2)
        md = writer.metadata
        print(
            f"created ledger {writer.ledger_id} on {', '.join(md.last_fragment.ensemble)} "
            f"(ensemble {md.ensemble_size}, write quorum {md.write_quorum}, "
            f"ack quorum {md.ack_quorum})"
        )
        tail_handle = await tail_client.ledgers.open(writer.ledger_id, recover=False)
        seen: list[bytes] = []

        async def tail() -> None:
            async for _, payload in tail_handle.tail(0):
                seen.append(payload)
                if len(seen) == messages:
                    return

        tailing = asyncio.ensure_future(tail())
        start = time.perf_counter()
        batch = [b"message %d" % i for i in range(messages)]
        ids = await writer.append_many(batch)
        elapsed = time.perf_counter() - start
        print(
            f"appended {len(ids)} entries (ids {ids[0]}..{ids[-1]}) in {elapsed * 1000:.0f} ms; "
            f"each acknowledged once {md.ack_quorum} bookies had fsync'd it"
        )
        await asyncio.wait_for(tailing, timeout=30)
        print(
            f"a tailing reader received all {len(seen)} entries through the long-poll "
            f"({tail_handle.long_polls} polls), first {seen[0]!r}, last {seen[-1]!r}"
        )
        recovered = await recover_client.ledgers.open(writer.ledger_id)
        print(
            f"a second writer recovered the ledger with fencing: CLOSED at entry "
            f"{recovered.last_entry_id}, {recovered.metadata.length} bytes"
        )
        try:
            await writer.append(b"one more")
            raise SystemExit("the old writer was not fenced: this must never happen")
        except LedgerFencedError:
            print("the old writer's next append was refused: LedgerFencedError (fenced)")
        read_back = await recovered.read(0, recovered.last_entry_id)
        assert read_back == batch, "read back differs from what was written"
        print(f"read back {len(read_back)} entries: identical to what was written")
        await recover_client.ledgers.delete(writer.ledger_id)
        print(f"deleted ledger {writer.ledger_id}; the bookies garbage-collect its entries")
    finally:
        for client in (writer_client, tail_client, recover_client):
            await client.close()


def run_demo(metadata_uri: str, messages: int = 1000) -> int:
    asyncio.run(_demo(metadata_uri, messages))
    print("demo finished: OK")
    return 0
