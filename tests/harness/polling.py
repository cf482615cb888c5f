"""Waiting, in a test, for something another part of the system does."""

from __future__ import annotations

import time
from collections.abc import Callable

from twisted.internet import reactor, task


async def eventually(
    condition: Callable[[], object], timeout: float = 5.0, what: str = "condition"
) -> None:
    """Let the reactor run until ``condition()`` is true; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await task.deferLater(reactor, 0.01, lambda: None)
