"""A ReplicationCommandReceiver for tests that records what it is told, in order."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from twisted.internet import reactor, task

from synapse_lite.replication.tcp.commands import Command
from synapse_lite.replication.tcp.connection import ReplicationConnection
from synapse_lite.replication.tcp.tcp_server import ReplicationServerFactory


class RecordingReceiver:
    """Records ``("new", conn, None)``, ``("lost", conn, None)`` and
    ``("command", conn, cmd)`` events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ReplicationConnection, Command | None]] = []
        #: Reads of a socket begun and ended (``read_started``, ``read_done``).
        self.reads_started = 0
        self.reads_done = 0

    def new_connection(self, connection: ReplicationConnection) -> None:
        self.events.append(("new", connection, None))

    def lost_connection(self, connection: ReplicationConnection) -> None:
        self.events.append(("lost", connection, None))

    def on_command(self, connection: ReplicationConnection, cmd: Command) -> None:
        self.events.append(("command", connection, cmd))

    def read_started(self) -> None:
        self.reads_started += 1

    def read_done(self) -> None:
        self.reads_done += 1

    @property
    def commands(self) -> list[Command]:
        return [cmd for kind, _, cmd in self.events if cmd is not None]

    def commands_on(self, connection: ReplicationConnection) -> list[Command]:
        return [cmd for _, conn, cmd in self.events if cmd is not None and conn is connection]

    def connections(self, kind: str) -> list[ReplicationConnection]:
        """Connections of every ``kind`` ("new" or "lost") event, in order."""
        return [conn for k, conn, _ in self.events if k == kind]


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``predicate`` on the real reactor until it holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await task.deferLater(reactor, 0.01, lambda: None)


def listening_server(case: Any, secret: str | None) -> tuple[ReplicationServerFactory, Any]:
    """A main process's replication listener on 127.0.0.1 (any free port),
    recording what it receives in ``.receiver``; closed, with every
    connection, at the end of ``case``."""
    server = ReplicationServerFactory("hs.test", secret, RecordingReceiver(), reactor)
    port = cast(Any, reactor).listenTCP(0, server, interface="127.0.0.1")
    case.addCleanup(port.stopListening)
    # Cleanups run last-in first-out: clients stop, then this waits for the
    # server ends to close too, so the reactor is left clean.
    case.addCleanup(wait_until, lambda: not server.open_protocols, what="server connections")
    return server, port
