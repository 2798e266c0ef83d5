"""Programs of the official Pulsar Python client (pulsar-client) that the Pulsar tests
run in processes of their own, and the tests' side of them: `Program` starts
driver.py and sends it one JSON command at a time (see driver.py for the commands).

What a test asserts is what pulsar-client did, as its program printed it; the
program's stderr (pulsar-client's own log) is kept beside the test's brokers' logs and
shown when a command fails."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).with_name("driver.py")
ANSWER_TIMEOUT_S = 90.0  # a command's answer: longer than pulsar-client's own timeouts
MAX_ANSWER_BYTES = 64 << 20


def payload(seed: int, size: int) -> bytes:
    """The bytes driver.py sends for {"seed": seed, "size": size}."""
    return random.Random(seed).randbytes(size)


class ProgramError(AssertionError):
    """A command the program answered with an error (its class name: .error)."""

    def __init__(self, op: str, answer: dict[str, Any], log: str) -> None:
        self.error = answer.get("error", "")
        self.message = answer.get("message", "")
        super().__init__(f"{op}: {self.error}: {self.message}\n--- pulsar-client's log:\n{log}")


class Program:
    """One pulsar-client process. `run(op, ...)` answers or raises ProgramError;
    `attempt(op, ...)` returns the answer, an error included."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self._ids = itertools.count()

    @classmethod
    async def start(cls, log: Path) -> Program:
        with log.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(DRIVER),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                limit=MAX_ANSWER_BYTES,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        return cls(proc, log)

    def log_tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def new_id(self, kind: str) -> str:
        return f"{kind}{next(self._ids)}"

    async def attempt(self, op: str, timeout_s: float = ANSWER_TIMEOUT_S, **fields: Any) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
        await self.proc.stdin.drain()
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        except TimeoutError:
            raise AssertionError(
                f"{op}: no answer in {timeout_s} s\n--- pulsar-client's log:\n{self.log_tail()}"
            ) from None
        if not line:
            raise AssertionError(f"{op}: the program exited\n{self.log_tail()}")
        return json.loads(line)  # type: ignore[no-any-return]

    async def run(self, op: str, timeout_s: float = ANSWER_TIMEOUT_S, **fields: Any) -> dict:
        answer = await self.attempt(op, timeout_s, **fields)
        if "error" in answer:
            raise ProgramError(op, answer, self.log_tail())
        return answer

    # -- the commands tests use most, by name ------------------------------------------

    async def client(self, url: str, **options: Any) -> str:
        found = self.new_id("client")
        await self.run("client", id=found, url=url, **options)
        return found

    async def producer(self, client: str, topic: str, **options: Any) -> tuple[str, dict]:
        found = self.new_id("producer")
        return found, await self.run("producer", id=found, client=client, topic=topic, **options)

    async def send(self, producer: str, messages: list[dict[str, Any]]) -> list[list[int]]:
        return (await self.run("send", producer=producer, messages=messages))["ids"]  # type: ignore[no-any-return]

    async def send_async(self, producer: str, messages: list[dict[str, Any]]) -> list[list[int]]:
        """send_async and flush: the ids in the order the messages were given (each
        callback Ok)."""
        answer = await self.run("send", producer=producer, messages=messages, mode="async")
        callbacks = answer["callbacks"]
        assert [c[1] for c in callbacks] == ["Ok"] * len(messages), callbacks
        return [c[2] for c in sorted(callbacks)]

    async def subscribe(self, client: str, topic: Any, subscription: str, **options: Any) -> str:
        found = self.new_id("consumer")
        await self.run("subscribe", id=found, client=client, topic=topic,
                       subscription=subscription, **options)  # fmt: skip
        return found

    async def reader(self, client: str, topic: str, start: Any, **options: Any) -> str:
        found = self.new_id("reader")
        await self.run("reader", id=found, client=client, topic=topic, start=start, **options)
        return found

    async def receive(self, consumer: str, count: int, timeout_ms: int = 15_000,
                      ack: str = "individual") -> list[dict]:  # fmt: skip
        """Exactly count messages (an AssertionError if they do not come in time)."""
        answer = await self.run("receive", id=consumer, count=count, timeout_ms=timeout_ms,
                                ack=ack)  # fmt: skip
        got = answer["messages"]
        assert len(got) == count, (
            f"{len(got)} of {count} messages came: {[m.get('data') for m in got]}\n"
            f"--- pulsar-client's log:\n{self.log_tail()}"
        )
        return got  # type: ignore[no-any-return]

    async def drain(self, consumer: str, timeout_ms: int = 1500, ack: str = "individual") -> list:
        """Whatever comes until nothing does for timeout_ms."""
        answer = await self.run("receive", id=consumer, timeout_ms=timeout_ms, ack=ack)
        return answer["messages"]  # type: ignore[no-any-return]

    async def close(self, some_id: str) -> None:
        await self.run("close", id=some_id)

    async def stop(self) -> None:
        """Exit (its clients closed), or be killed after a bounded wait."""
        if self.proc.returncode is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "exit"}\n')
                await self.proc.stdin.drain()
                await asyncio.wait_for(self.proc.wait(), 15)
            except (TimeoutError, ConnectionError):
                pass
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


class Programs:
    """`async with Programs(log_dir) as start:` -- `await start()` starts a program;
    each is stopped when the block ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Program] = []

    async def start(self) -> Program:
        program = await Program.start(self.log_dir / f"pulsar-client-{len(self.started)}.log")
        self.started.append(program)
        return program

    async def __aenter__(self) -> Callable[[], Awaitable[Program]]:
        return self.start

    async def __aexit__(self, *exc: object) -> None:
        for program in self.started:
            await program.stop()
