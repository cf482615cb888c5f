"""One OS process run by the launcher: spawned, its output relayed line by
line, its health polled, and stopped with a signal (then killed if it hangs)."""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, protocol, task
from twisted.python.failure import Failure

from synapse_lite.app.admin_client import AdminRequestError, http_request
from synapse_lite.app.launch_plan import ProcessSpec

logger = logging.getLogger(__name__)

#: Lines of each process's output kept to show when it fails.
TAIL_LINES = 20
#: How often /health is asked while waiting for a process to come up.
HEALTH_POLL_SECONDS = 0.05
#: Longest a partial line (no newline yet) is held before being relayed.
MAX_PARTIAL_LINE_BYTES = 65536

#: A line the process's own logger wrote: "2024-01-01 10:00:00,123 NAME ...".
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (\S+) ")


class _LineRelay(protocol.ProcessProtocol):
    """Splits a child's stdout and stderr into lines and hands each one on."""

    def __init__(self, on_line: Callable[[str], None], on_end: Callable[[Failure], None]):
        self._on_line = on_line
        self._on_end = on_end
        self._partial: dict[int, bytes] = {1: b"", 2: b""}

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        buffered = self._partial.get(childFD, b"") + data
        *lines, rest = buffered.split(b"\n")
        if len(rest) > MAX_PARTIAL_LINE_BYTES:
            lines.append(rest)
            rest = b""
        self._partial[childFD] = rest
        for line in lines:
            self._on_line(line.decode("utf-8", errors="replace").rstrip("\r"))

    def processEnded(self, reason: Failure) -> None:
        for fd, rest in self._partial.items():
            if rest:
                self._on_line(rest.decode("utf-8", errors="replace"))
            self._partial[fd] = b""
        self._on_end(reason)


def describe_exit(reason: Failure | None) -> str:
    """'exit code 1' or 'signal 9 (SIGKILL)'."""
    value = getattr(reason, "value", None)
    sig = getattr(value, "signal", None)
    if sig:
        try:
            return f"signal {sig} ({signal.Signals(sig).name})"
        except ValueError:
            return f"signal {sig}"
    return f"exit code {getattr(value, 'exitCode', None)}"


class ChildProcess:
    """One run of one process of the plan."""

    def __init__(self, spec: ProcessSpec, reactor: Any, write_line: Callable[[str], None]):
        self.spec = spec
        self._reactor = reactor
        self._write_line = write_line
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.pid: int | None = None
        self.started_at = 0.0
        self.exit_reason: Failure | None = None
        self._end_waiters: list[defer.Deferred[None]] = []
        self._transport: Any = None
        #: Set when the launcher stops it on purpose (its exit is no death).
        self.expected_exit = False

    @property
    def running(self) -> bool:
        return self._transport is not None and self.exit_reason is None

    @property
    def exit_code(self) -> int | None:
        return getattr(getattr(self.exit_reason, "value", None), "exitCode", None)

    @property
    def exit_signal(self) -> int | None:
        return getattr(getattr(self.exit_reason, "value", None), "signal", None)

    def spawn(self, env: dict[str, str]) -> None:
        relay = _LineRelay(self._relay, self._ended)
        self._transport = self._reactor.spawnProcess(
            relay, self.spec.argv[0], list(self.spec.argv), env=env, path=os.getcwd()
        )
        self.pid = self._transport.pid
        self.started_at = time.monotonic()

    def _relay(self, line: str) -> None:
        self.tail.append(line)
        match = _LOG_LINE.match(line)
        if match is None or match.group(1) != self.spec.name:
            # Not from its logger (a traceback's continuation, a print): name it.
            line = f"{self.spec.name} | {line}"
        self._write_line(line)

    def _ended(self, reason: Failure) -> None:
        self.exit_reason = reason
        waiters, self._end_waiters = self._end_waiters, []
        for waiter in waiters:
            if not waiter.called:
                waiter.callback(None)

    def when_ended(self) -> defer.Deferred[None]:
        """Fires once the process has exited (at once if it has)."""
        waiter: defer.Deferred[None] = defer.Deferred()
        if self.exit_reason is not None or self._transport is None:
            waiter.callback(None)
        else:
            self._end_waiters.append(waiter)
        return waiter

    def signal(self, sig: int) -> None:
        if self.running:
            try:
                self._transport.signalProcess(sig)
            except Exception:  # already gone (ProcessExitedAlready)
                pass

    async def stop(self, timeout: float) -> Failure | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; the exit reason."""
        if self.running:
            self.signal(signal.SIGTERM)
            try:
                await self.when_ended().addTimeout(timeout, self._reactor)
            except defer.TimeoutError:
                logger.warning(
                    "%s (pid %s) did not stop within %.0f s: killing it",
                    self.spec.name,
                    self.pid,
                    timeout,
                )
                self.signal(signal.SIGKILL)
                await self.when_ended()
        return self.exit_reason

    async def wait_healthy(self, timeout: float) -> None:
        """Return once /health answers 200; :class:`ProcessFailedToStart` if the
        process exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        url = self.spec.health_url
        while True:
            if not self.running:
                raise ProcessFailedToStart(self, f"exited with {describe_exit(self.exit_reason)}")
            try:
                code, _ = await http_request(self._reactor, "GET", url, timeout=1)
                if code == 200:
                    return
            except AdminRequestError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise ProcessFailedToStart(self, f"did not answer {url} within {timeout:.0f} s")
            await task.deferLater(self._reactor, HEALTH_POLL_SECONDS, lambda: None)


class ProcessFailedToStart(Exception):
    """A process exited or did not become healthy while starting."""

    def __init__(self, child: ChildProcess, why: str) -> None:
        super().__init__(f"{child.spec.name} {why}")
        self.child = child

    def report(self) -> str:
        """The message, with the tail of the process's output."""
        tail = "\n".join(f"    {line}" for line in self.child.tail) or "    (no output)"
        return f"{self} (pid {self.child.pid}). Its last output:\n{tail}"
