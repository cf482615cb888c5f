"""Direct TCP replication over real sockets on 127.0.0.1: one listener, real clients.

What the in-memory tests cannot show: the relay through a real main process,
authentication refused on a real connection, reconnecting after the connection
is killed, and flow control (pause, queue, resume) under 10,000 lines.
"""

from __future__ import annotations

from typing import Any, cast

from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.trial import unittest

from synapse_lite.replication.tcp.commands import (
    Command,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
)
from synapse_lite.replication.tcp.tcp_client import ReplicationClientFactory
from tests.replication.tcp.recording_receiver import (
    RecordingReceiver,
    listening_server,
    wait_until,
)

SECRET = "s3cret"
# The reactor's zope interfaces defeat mypy without its zope plugin.
reactor: Any = _reactor


def of_type(receiver: RecordingReceiver, cls: type[Command]) -> list[Any]:
    return [cmd for cmd in receiver.commands if isinstance(cmd, cls)]


class RealSocketTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.server, self.port = listening_server(self, SECRET)
        self.server_receiver = cast(RecordingReceiver, self.server.receiver)

    def start_client(
        self, name: str, secret: str = SECRET
    ) -> tuple[ReplicationClientFactory, RecordingReceiver]:
        receiver = RecordingReceiver()
        factory = ReplicationClientFactory(
            "hs.test", name, secret, receiver, reactor, initial_delay=0.05, max_delay=1
        )
        factory.connect(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port))

        async def stop() -> None:
            await factory.stop()
            await wait_until(
                lambda: factory.current_connection is None, what=f"{name} to disconnect"
            )

        self.addCleanup(stop)
        return factory, receiver

    async def start_connected_client(
        self, name: str
    ) -> tuple[ReplicationClientFactory, RecordingReceiver]:
        before = len(self.server.connections)
        factory, receiver = self.start_client(name)
        await wait_until(
            lambda: (
                len(self.server.connections) == before + 1
                and self.server.connections[-1].peer_name == name
            ),
            what=f"{name} to connect",
        )
        return factory, receiver

    async def test_relay_reaches_server_and_other_client_not_sender(self) -> None:
        a, a_receiver = await self.start_connected_client("worker_a")
        b, b_receiver = await self.start_connected_client("worker_b")
        server_a = self.server.connections[0]

        rdata = RdataCommand("events", "worker_a", 7, ["ev", {"room": "!r:hs.test"}])
        a.send_command(rdata)
        await wait_until(lambda: of_type(b_receiver, RdataCommand) == [rdata], what="relay to B")
        self.assertEqual(self.server_receiver.commands_on(server_a)[-1], rdata)

        # B answers; once A has that, A would have had its own RDATA back first
        # if the server echoed it (one connection, in order).
        marker = RemoteServerUpCommand("marker.example")
        b.send_command(marker)
        await wait_until(lambda: marker in a_receiver.commands, what="marker at A")
        self.assertEqual(of_type(a_receiver, RdataCommand), [])

    async def test_server_broadcast_reaches_every_client(self) -> None:
        _, a_receiver = await self.start_connected_client("worker_a")
        _, b_receiver = await self.start_connected_client("worker_b")
        position = PositionCommand("events", "master", 10, 12)
        self.server.send_command(position)
        await wait_until(
            lambda: position in a_receiver.commands and position in b_receiver.commands,
            what="broadcast",
        )

    async def test_wrong_secret_is_refused(self) -> None:
        _, good_receiver = await self.start_connected_client("worker_good")
        with self.assertLogs("synapse_lite.replication.tcp", "WARNING") as logs:
            bad, bad_receiver = self.start_client("worker_bad", secret="guess")
            await wait_until(lambda: bool(bad_receiver.connections("lost")), what="refusal")
            bad.stop()
        output = "\n".join(logs.output)
        self.assertIn("wrong replication secret", output)
        self.assertIn("sent ERROR 'bad secret'", output)
        # The server never announced it, and relayed nothing from it.
        self.assertEqual(len(self.server_receiver.connections("new")), 1)
        self.assertEqual(len(self.server.connections), 1)
        self.assertEqual(good_receiver.commands, [])

    async def test_killed_connection_is_lost_and_comes_back(self) -> None:
        a, a_receiver = await self.start_connected_client("worker_a")
        first = a.current_connection
        assert first is not None
        first_on_server = self.server.connections[0]

        first.transport.abortConnection()  # type: ignore[union-attr]
        await wait_until(
            lambda: (
                len(a_receiver.connections("new")) == 2
                and len(self.server.connections) == 1
                and self.server.connections[0] is not first_on_server
            ),
            what="reconnection",
        )
        self.assertEqual(a_receiver.connections("lost"), [first])
        self.assertEqual(self.server_receiver.connections("lost"), [first_on_server])
        self.assertIsNot(a.current_connection, first)

        # And commands flow again, both ways.
        position = PositionCommand("events", "master", 1, 2)
        self.server.send_command(position)
        await wait_until(lambda: position in a_receiver.commands, what="broadcast after reconnect")
        a.send_command(RemoteServerUpCommand("back.example"))
        await wait_until(
            lambda: RemoteServerUpCommand("back.example") in self.server_receiver.commands,
            what="command after reconnect",
        )

    async def test_ten_thousand_rdata_in_order(self) -> None:
        a, _ = await self.start_connected_client("worker_a")
        _, b_receiver = await self.start_connected_client("worker_b")
        count = 10_000
        row = ["ev", "x" * 100]
        for token in range(1, count + 1):
            a.send_command(RdataCommand("events", "worker_a", token, row))

        def tokens(receiver: RecordingReceiver) -> list[int]:
            return [cmd.token for cmd in of_type(receiver, RdataCommand)]

        await wait_until(
            lambda: len(tokens(self.server_receiver)) == count and len(tokens(b_receiver)) == count,
            timeout=60,
            what="10,000 RDATA",
        )
        expected = list(range(1, count + 1))
        self.assertEqual(tokens(self.server_receiver), expected)
        self.assertEqual(tokens(b_receiver), expected)
