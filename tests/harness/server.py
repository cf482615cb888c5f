"""Homeservers inside the test process, on a throwaway database.

``make_config`` writes a valid multi-process config; ``make_homeserver`` builds
one process of it (schema, stores, ID generators). ``connect_loopback`` wires
processes' replication handlers together in memory, through the real wire
format, for tests of replication logic without sockets.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import yaml
from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.app.composition import build_homeserver
from synapse_lite.config.homeserver import HomeServerConfig, read_homeserver_config
from synapse_lite.replication.tcp.commands import (
    Command,
    ReplicateCommand,
    command_line,
    parse_command_from_line,
)
from synapse_lite.server import HomeServer
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from synapse_lite.streams.definition import StreamCatalog
from tests.harness.databases import TestDatabase, create_test_database


def make_config(
    test_db: TestDatabase,
    workers: list[str] = (),  # type: ignore[assignment]
    stream_writers: dict[str, Any] | None = None,
    resources: tuple[str, ...] = ("client", "replication"),
    streams: StreamCatalog = BUILTIN_STREAMS,
    **extra: Any,
) -> HomeServerConfig:
    """A config with the given workers, every process with one listener of
    ``resources`` on a port nobody will bind (in-process tests do not listen;
    they serve the processes' resources on ports of their own)."""
    data_dir = tempfile.mkdtemp(prefix="synapse_lite_hs_")
    data: dict[str, Any] = {
        "server_name": "test.local",
        "data_dir": data_dir,
        "database": test_db.config(),
        "worker_replication_secret": "test-secret",
        "listeners": [{"port": 18000, "resources": list(resources)}],
        "workers": {
            name: {"listeners": [{"port": 18001 + i, "resources": list(resources)}]}
            for i, name in enumerate(workers)
        },
        "stream_writers": stream_writers or {},
        "position_log": True,
    }
    data.update(extra)
    path = os.path.join(data_dir, "homeserver.yaml")
    with open(path, "w") as f:
        # Written out too, for the tools that read a config file (the audit).
        yaml.safe_dump(data, f)
    return read_homeserver_config(data, path, streams)


def make_homeserver(
    testcase: unittest.TestCase, config: HomeServerConfig, instance_name: str = "main"
) -> HomeServer:
    """One process of ``config``, built (database loaded) with its background
    loops running, but no listener or replication transport: tests connect
    processes in memory (:func:`connect_loopback`, :class:`LoopbackBus`)."""
    hs = build_homeserver(config, instance_name, reactor)
    hs.loops.startService()
    testcase.addCleanup(hs.service.stopService)
    return hs


class DatabaseTestCase(unittest.TestCase):
    """A test with a fresh database (``self.test_db``), holding the current
    schema unless the class sets ``with_schema = False`` (tests of the schema
    itself need it empty)."""

    with_schema = True

    def setUp(self) -> None:
        self.test_db = create_test_database(with_schema=self.with_schema)
        self.addCleanup(self.test_db.drop)


class LoopbackConnection:
    """One end of an in-memory replication link. Commands go through
    ``to_line``/``parse_command_from_line`` and arrive on a later reactor turn,
    like on a socket."""

    # Point to point: nobody in between checks claims for us.
    vouches_for_claims = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.peer: LoopbackConnection | None = None
        self.receiver: Any = None
        self.sent: list[Command] = []
        self.open = True

    def send_command(self, cmd: Command) -> None:
        if not self.open or self.peer is None:
            return
        self.sent.append(cmd)
        parsed = parse_command_from_line(command_line(cmd))
        peer = self.peer
        reactor.callLater(0, peer._deliver, parsed)

    def _deliver(self, cmd: Command) -> None:
        if self.open:
            self.receiver.on_command(self, cmd)

    def describe(self) -> str:
        return f"loopback:{self.name}"

    def close(self) -> None:
        for end in (self, self.peer):
            if end is not None and end.open:
                end.open = False
                end.receiver.lost_connection(end)


def connect_loopback(a: HomeServer, b: HomeServer) -> LoopbackConnection:
    """Connect two processes; returns ``a``'s end (``.peer`` is ``b``'s)."""
    end_a = LoopbackConnection(f"{a.instance_name}->{b.instance_name}")
    end_b = LoopbackConnection(f"{b.instance_name}->{a.instance_name}")
    end_a.peer, end_b.peer = end_b, end_a
    end_a.receiver, end_b.receiver = a.replication, b.replication
    a.replication.new_connection(end_a)
    b.replication.new_connection(end_b)
    return end_a


class BusEndpoint:
    """One process's connection to an in-memory bus (like Redis pub/sub)."""

    vouches_for_claims = False

    def __init__(self, bus: LoopbackBus, hs: HomeServer) -> None:
        self.bus = bus
        self.hs = hs
        self.open = True

    def send_command(self, cmd: Command) -> None:
        if self.open:
            self.bus.publish(self, cmd)

    def describe(self) -> str:
        return f"bus:{self.hs.instance_name}"


class LoopbackBus:
    """Every command published reaches every other process (and, with
    ``echo``, the publisher too, as Redis does)."""

    def __init__(self, echo: bool = False) -> None:
        self.echo = echo
        self.endpoints: list[BusEndpoint] = []
        self.published: list[tuple[str, Command]] = []

    def join(self, hs: HomeServer) -> BusEndpoint:
        endpoint = BusEndpoint(self, hs)
        self.endpoints.append(endpoint)
        hs.replication.new_connection(endpoint)
        # As the transports do: ask everyone else to announce their positions.
        endpoint.send_command(ReplicateCommand())
        return endpoint

    def leave(self, endpoint: BusEndpoint) -> None:
        endpoint.open = False
        self.endpoints.remove(endpoint)
        endpoint.hs.replication.lost_connection(endpoint)

    def publish(self, sender: BusEndpoint, cmd: Command) -> None:
        self.published.append((sender.hs.instance_name, cmd))
        parsed = parse_command_from_line(command_line(cmd))
        for endpoint in list(self.endpoints):
            if endpoint is sender and not self.echo:
                continue
            reactor.callLater(0, self._deliver, endpoint, parsed)

    @staticmethod
    def _deliver(endpoint: BusEndpoint, cmd: Command) -> None:
        if endpoint.open:
            endpoint.hs.replication.on_command(endpoint, cmd)
