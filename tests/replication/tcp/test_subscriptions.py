"""Subscriptions by role, on real sockets and a real Redis.

A process receives nothing of a stream it does not read: the main process
relays over TCP only what a worker subscribed to, and over Redis each stream
has its own channel. Watched on the wire: every line (TCP) or message
(Redis) that reaches the process is recorded before anything skips it.
And a process that starts reading a stream (its role changed on reload: it
restarts and subscribes anew) catches up what it missed from the
positions announced to it.
"""

from __future__ import annotations

import uuid
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import RedisConfig
from synapse_lite.replication.streams import Stream
from synapse_lite.replication.tcp.commands import (
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    claim_stream,
)
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.replication.tcp.tcp_client import ReplicationClientFactory
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from tests.harness.services import redis_address, require_redis
from tests.replication.tcp.fakes import FakePositions, FakeRows, fake_stream
from tests.replication.tcp.fakes import RecordingReceiver as RowsReceiver
from tests.replication.tcp.recording_receiver import (
    RecordingReceiver,
    listening_server,
    wait_until,
)

SECRET = "s3cret"
reactor: Any = _reactor

CACHES_ROW = BUILTIN_STREAMS["caches"].encode_row(
    BUILTIN_STREAMS["caches"].parse_row(["get_user_by_access_token", ["t"], 1])
)


def receipt(n: int) -> Any:
    return BUILTIN_STREAMS["receipts"].parse_row(["!r:x", "m.read", f"@u{n}:x", "$e", None, {}])


def receipt_wire(n: int) -> list[Any]:
    return BUILTIN_STREAMS["receipts"].encode_row(receipt(n))


def streams_of(lines: list[bytes]) -> set[bytes]:
    return {stream for line in lines if (stream := claim_stream(line)) is not None}


class _Process:
    """A follower: a command handler over a receipts and a caches stream.

    The receipts stream's positions and rows are the test's, shared by the
    process before and after its restart: it starts again where it was when
    it last read the stream (the worst case: a real restart starts from the
    database's positions), and the rows are what its catch-up reads."""

    def __init__(
        self, name: str, follows: list[str] | None, positions: FakePositions, rows: FakeRows
    ) -> None:
        self.rows = rows
        receipts = Stream(BUILTIN_STREAMS["receipts"], positions, rows, name)
        caches, _, _ = fake_stream(BUILTIN_STREAMS["caches"], local=name)
        streams = {"receipts": receipts, "caches": caches}
        self.receiver = RowsReceiver(streams)
        self.handler = ReplicationCommandHandler(
            instance_name=name,
            clock=Clock(reactor),
            streams=streams,
            receiver=self.receiver,  # type: ignore[arg-type]
            followed_streams=follows,
        )

    def applied(self, stream: str) -> list[tuple[int, int]]:
        """(token, rows) of each batch applied to ``stream``."""
        return [(t, len(rows)) for s, _, t, rows in self.receiver.applied if s == stream]


class _SubscriptionTests:
    """The two tests, over a transport the subclass starts."""

    async def start(self, name: str, receiver: Any, follows: list[str] | None) -> Any:
        """A process connected and subscribed, as ``(its bus, every line or
        message it receives from then on, recorded before anything skips
        it)``; it is stopped at the end of the test."""
        raise NotImplementedError

    async def gone(self, name: str) -> None:
        """Wait until ``name``, stopped, is disconnected."""

    async def test_a_process_receives_nothing_of_a_stream_it_does_not_read(self) -> None:
        case: Any = self
        writer, _ = await self.start("persister1", RecordingReceiver(), None)
        _, media_lines = await self.start("media1", RecordingReceiver(), ["caches"])
        reader = RecordingReceiver()
        _, reader_lines = await self.start("synchrotron1", reader, ["events", "caches"])

        for token in range(1, 6):
            writer.send_command(RdataCommand("events", "persister1", token, ["ev", token]))
        writer.send_command(PositionCommand("receipts", "persister1", 1, 1))
        writer.send_command(RdataCommand("caches", "persister1", 1, CACHES_ROW))
        marker = RemoteServerUpCommand("marker.example")
        writer.send_command(marker)
        await wait_until(
            lambda: (
                any(line.startswith(b"REMOTE_SERVER_UP") for line in media_lines)
                and marker in reader.commands
            ),
            what="the marker at both",
        )
        case.assertEqual(streams_of(media_lines), {b"caches"})
        case.assertEqual(streams_of(reader_lines), {b"events", b"caches"})
        events = [c for c in reader.commands if isinstance(c, RdataCommand)]
        case.assertEqual([c.token for c in events if c.stream_name == "events"], [1, 2, 3, 4, 5])

    async def test_a_process_that_starts_reading_a_stream_catches_up(self) -> None:
        case: Any = self
        writer, _ = await self.start("stream_writer1", RecordingReceiver(), None)
        positions, rows = FakePositions("media1"), FakeRows()
        before = _Process("media1", ["caches"], positions, rows)
        bus, lines = await self.start("media1", before.handler, ["caches"])
        for token in (1, 2, 3):
            rows.add("stream_writer1", token, receipt(token))
            writer.send_command(
                RdataCommand("receipts", "stream_writer1", token, receipt_wire(token))
            )
        writer.send_command(PositionCommand("caches", "stream_writer1", 0, 4))
        await wait_until(lambda: before.applied("caches") == [(4, 0)], what="the caches position")
        case.assertEqual(streams_of(lines), {b"caches"})
        case.assertEqual(before.applied("receipts"), [])
        case.assertEqual(positions.received_position("stream_writer1"), 0)
        await bus.stop()
        await self.gone("media1")

        # Its role changed on reload: it restarts, reading receipts now.
        after = _Process("media1", ["receipts", "caches"], positions, rows)
        await self.start("media1", after.handler, ["receipts", "caches"])
        # The writer answers REPLICATE with its position, as its streamer does.
        writer.send_command(PositionCommand("receipts", "stream_writer1", 3, 3))
        await wait_until(
            lambda: positions.received_position("stream_writer1") == 3, what="the catch-up"
        )
        # The rows it missed, then the position itself.
        case.assertEqual(after.applied("receipts"), [(1, 1), (2, 1), (3, 1), (3, 0)])
        writer.send_command(RdataCommand("receipts", "stream_writer1", 4, receipt_wire(4)))
        await wait_until(lambda: (4, 1) in after.applied("receipts"), what="a new row")


class TcpSubscriptionTestCase(_SubscriptionTests, unittest.TestCase):
    def setUp(self) -> None:
        self.server, self.port = listening_server(self, SECRET)

    async def start(self, name: str, receiver: Any, follows: list[str] | None) -> Any:
        factory = ReplicationClientFactory(
            "hs.test", name, SECRET, receiver, reactor, initial_delay=0.05, max_delay=1,
            followed_streams=follows,
        )  # fmt: skip
        factory.connect(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port))

        async def stop() -> None:
            await factory.stop()
            await wait_until(lambda: factory.current_connection is None, what=f"{name} to stop")

        self.addCleanup(stop)

        def subscribed() -> bool:
            conns = [c for c in self.server.connections if c.peer_name == name]
            return bool(conns) and (follows is None or conns[0].subscribed is not None)

        await wait_until(subscribed, what=f"{name} to connect and subscribe")
        connection = factory.current_connection
        assert connection is not None
        lines: list[bytes] = []
        receive = connection.lineReceived

        def record(line: bytes) -> None:
            lines.append(line)
            receive(line)

        connection.lineReceived = record  # type: ignore[method-assign]
        return factory, lines

    async def gone(self, name: str) -> None:
        await wait_until(
            lambda: all(c.peer_name != name for c in self.server.connections), what=f"{name} gone"
        )

    async def test_the_main_process_sends_its_own_lines_by_subscription(self) -> None:
        _, lines = await self.start("media1", RecordingReceiver(), ["caches"])
        self.server.send_command(PositionCommand("events", "main", 1, 1))
        self.server.send_command(PositionCommand("caches", "main", 1, 1))
        await wait_until(lambda: bool(lines), what="the caches position")
        self.assertEqual(lines, [b"POSITION caches main 1 1"])


class RedisSubscriptionTestCase(_SubscriptionTests, unittest.TestCase):
    def setUp(self) -> None:
        require_redis()
        host, port = redis_address()
        self.config = RedisConfig(host=host, port=port)
        self.server_name = f"test-{uuid.uuid4().hex}.example"

    async def start(self, name: str, receiver: Any, follows: list[str] | None) -> Any:
        from synapse_lite.replication.tcp.redis import RedisReplicationBus

        bus = RedisReplicationBus.from_config(
            self.config, server_name=self.server_name, instance_name=name, receiver=receiver,
            reactor=reactor, initial_delay=0.05, max_delay=0.5, deployment_id="dep1",
            followed_streams=follows, secret=SECRET,
        )  # fmt: skip
        messages: list[bytes] = []
        handle = bus.message_received

        def record(proto: Any, message: Any) -> None:
            messages.append(message.split(b" ", 3)[3])
            handle(proto, message)

        bus.message_received = record  # type: ignore[method-assign]
        bus.start()
        self.addCleanup(bus.stop)
        await wait_until(lambda: bus.announced and bus.publisher_connected, what=f"{name} up")
        return bus, messages
