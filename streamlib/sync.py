"""A blocking facade over the asyncio client, for scripts and Spark workers.

    client = streamlib.connect("sqlite:///tmp/sandbox/meta.db")
    writer = client.ledgers.create()
    writer.append(b"hello")

One event loop runs in a daemon thread per connected client. Every method of a
streamlib object runs on that loop's thread (coroutines as blocking calls, plain
methods too, since they may schedule work on the loop); async iterators become plain
iterators; returned streamlib objects are wrapped the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="streamlib-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a plain function on the loop thread (it may use the running loop)."""

        async def on_loop() -> Any:
            return fn(*args, **kwargs)

        return self.run(on_loop())

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


def _wants_wrapping(value: object) -> bool:
    cls = type(value)
    if not cls.__module__.startswith(("streamlib.", "metadata.")):
        return False
    return any(
        inspect.iscoroutinefunction(v) or inspect.isasyncgenfunction(v) for v in vars(cls).values()
    )


class SyncProxy:
    """The blocking view of one async streamlib object."""

    def __init__(self, target: object, runner: _LoopThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_runner", runner)

    def _wrap(self, value: Any) -> Any:
        return SyncProxy(value, self._runner) if _wants_wrapping(value) else value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if inspect.iscoroutinefunction(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(self._runner.run(attr(*args, **kwargs)))

            return call
        if inspect.isasyncgenfunction(attr):

            def iterate(*args: Any, **kwargs: Any) -> Iterator[Any]:
                return self._iterate(attr(*args, **kwargs))

            return iterate
        if callable(attr) and not isinstance(attr, type):

            def plain(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(self._runner.call(attr, *args, **kwargs))

            return plain
        return self._wrap(attr)

    def _iterate(self, agen: AsyncIterator[Any]) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._wrap(self._runner.run(agen.__anext__()))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                self._runner.run(aclose())

    def __repr__(self) -> str:
        return f"<sync {self._target!r}>"

    def __enter__(self) -> SyncProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncClient(SyncProxy):
    def close(self) -> None:
        try:
            self._runner.run(self._target.close())  # type: ignore[attr-defined]
        finally:
            self._runner.stop()


def connect(uri: str, **options: Any) -> SyncClient:
    """Connect a blocking client (see streamlib.Client.connect for the options)."""
    from streamlib.client import Client

    runner = _LoopThread()
    try:
        client = runner.run(Client.connect(uri, **options))
    except BaseException:
        runner.stop()
        raise
    return SyncClient(client, runner)
