"""Waiting, in a test, for something another part of the system does."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

from twisted.internet import reactor, task


async def eventually(
    condition: Callable[[], object],
    timeout: float = 5.0,
    what: str = "condition",
    interval: float = 0.01,
) -> None:
    """Let the reactor run until ``condition()`` is true (awaiting it if it
    returns an awaitable, such as an HTTP check); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await task.deferLater(reactor, interval, lambda: None)
