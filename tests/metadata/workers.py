"""Helper processes for the multi-process metadata tests.

python tests/metadata/workers.py cas URI PATH COUNT        -> prints won versions, one a line
python tests/metadata/workers.py ids URI COUNT BATCH       -> prints ids
python tests/metadata/workers.py ephemeral URI PATH TIMEOUT -> prints "ready", then waits
"""

from __future__ import annotations

import asyncio
import sys

import metadata
from metadata.services import LedgerIdGenerator


async def cas(uri: str, path: str, count: int) -> None:
    store = await metadata.connect(uri)
    won: list[int] = []
    try:
        while len(won) < count:
            current = await store.get(path)
            value = int.from_bytes(current.data, "big") + 1
            try:
                await store.set(path, value.to_bytes(8, "big"), version=current.version)
            except metadata.BadVersionError:
                continue
            won.append(current.version)
    finally:
        await store.close()
    print("\n".join(map(str, won)), flush=True)


async def ids(uri: str, count: int, batch: int) -> None:
    store = await metadata.connect(uri)
    try:
        generator = LedgerIdGenerator(store, batch_size=batch)
        found = [await generator.next_id() for _ in range(count)]
    finally:
        await store.close()
    print("\n".join(map(str, found)), flush=True)


async def ephemeral(uri: str, path: str, timeout_s: float) -> None:
    store = await metadata.connect(uri, session_timeout_s=timeout_s)
    await store.create(path, b"mine", ephemeral=True, make_parents=True)
    print("ready", flush=True)
    await asyncio.Event().wait()  # until the test kills us


def main() -> None:
    command, uri, *rest = sys.argv[1:]
    if command == "cas":
        asyncio.run(cas(uri, rest[0], int(rest[1])))
    elif command == "ids":
        asyncio.run(ids(uri, int(rest[0]), int(rest[1])))
    elif command == "ephemeral":
        asyncio.run(ephemeral(uri, rest[0], float(rest[1])))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
