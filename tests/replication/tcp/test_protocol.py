"""The direct TCP replication protocol, in memory: StringTransport and Clock.

Handshakes on both ends, authentication, relaying, keepalive, pausing, bad
input, and the promise that lost_connection follows each new_connection once.
"""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import REGISTRY
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial import unittest

from synapse_lite.replication.tcp import reconnect
from synapse_lite.replication.tcp.commands import (
    MAX_LINE_LENGTH,
    Command,
    CommandEncodeError,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    UserSyncCommand,
    command_line,
    parse_command_from_line,
)
from synapse_lite.replication.tcp.connection import ReplicationConnection
from synapse_lite.replication.tcp.protocol import (
    MAX_QUEUED_COMMANDS,
    ConnectionState,
    ReplicationProtocol,
)
from synapse_lite.replication.tcp.tcp_client import (
    ClientReplicationProtocol,
    ReplicationClientFactory,
)
from synapse_lite.replication.tcp.tcp_server import (
    CHECK_RETRY_SECONDS,
    ReplicationServerFactory,
    ServerReplicationProtocol,
)
from tests.replication.tcp.recording_receiver import RecordingReceiver

RDATA_LINE = 'RDATA events w1 5 ["ev", 1]'
LOGGER = "synapse_lite.replication.tcp"


def lines(transport: StringTransport) -> list[str]:
    """What was written to ``transport`` since the last call, as lines."""
    data = transport.value()
    transport.clear()
    assert data == b"" or data.endswith(b"\n"), data
    return data.decode("utf-8").splitlines()


def feed(proto: ReplicationProtocol, *items: str | bytes) -> None:
    for item in items:
        proto.dataReceived(item.encode("utf-8") + b"\n" if isinstance(item, str) else item)


def lose(proto: ReplicationProtocol) -> None:
    proto.connectionLost(Failure(ConnectionDone()))


def metric(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class ScriptedEndpoint:
    """A client endpoint whose connection attempts the test answers, one at a
    time, on a ``task.Clock``: refused, or made on a ``StringTransport``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.pending: list[tuple[Any, defer.Deferred[Any]]] = []
        #: Seconds waited before each attempt after the first.
        self.waits: list[float] = []
        self._last_attempt: float | None = None

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        now = self.clock.seconds()
        if self._last_attempt is not None:
            self.waits.append(round(now - self._last_attempt, 3))
        self._last_attempt = now
        d: defer.Deferred[Any] = defer.Deferred()
        self.pending.append((factory, d))
        return d

    def refuse(self) -> None:
        _, d = self.pending.pop(0)
        d.errback(Failure(ConnectionRefusedError()))

    def accept(self) -> tuple[Any, StringTransport]:
        factory, d = self.pending.pop(0)
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 9093))
        transport = StringTransport()
        proto.makeConnection(transport)
        d.callback(proto)
        self._last_attempt = None
        return proto, transport

    def next_attempt_in(self) -> float:
        [call] = self.clock.getDelayedCalls()
        delay: float = round(call.getTime() - self.clock.seconds(), 3)
        return delay


class ServerTestCase(unittest.TestCase):
    secret: str | None = None

    def setUp(self) -> None:
        self.clock = Clock()
        self.receiver = RecordingReceiver()
        self.factory = ReplicationServerFactory("hs.test", self.secret, self.receiver, self.clock)
        self.port = 40000

    def connect(self) -> tuple[ServerReplicationProtocol, StringTransport]:
        self.port += 1
        peer = IPv4Address("TCP", "10.1.2.3", self.port)
        proto = self.factory.buildProtocol(peer)
        transport = StringTransport(peerAddress=peer)
        proto.makeConnection(transport)
        return proto, transport

    def connect_authenticated(
        self, name: str | None = None
    ) -> tuple[ServerReplicationProtocol, StringTransport]:
        proto, transport = self.connect()
        if self.secret is not None:
            feed(proto, f"AUTH {self.secret}")
        if name is not None:
            feed(proto, f"NAME {name}")
        lines(transport)
        return proto, transport


class CheckedRelayTestCase(ServerTestCase):
    """The main process checks each claim before relaying it, and relays and
    hands on in the order received, whatever waits for a check."""

    def setUp(self) -> None:
        super().setUp()
        #: What the check answers, per (stream, token); a Deferred is answered
        #: by the test. Unlisted commands are believed at once.
        self.answers: dict[tuple[str, int | None], bool | defer.Deferred[bool]] = {}
        self.checked: list[tuple[Command, str]] = []

        def check(cmd: Command, sender: str) -> bool | defer.Deferred[bool]:
            self.checked.append((cmd, sender))
            if isinstance(cmd, PositionCommand):
                return self.answers.get((cmd.stream_name, cmd.new_token), True)
            if isinstance(cmd, RdataCommand):
                return self.answers.get((cmd.stream_name, cmd.token), True)
            return True

        self.factory = ReplicationServerFactory(
            "hs.test", None, self.receiver, self.clock, check_claim=check
        )
        self.w1, _ = self.connect_authenticated("w1")
        self.w2, _ = self.connect_authenticated("w2")
        _, self.follower = self.connect_authenticated("sync")
        self.receiver.commands.clear()

    def test_a_refused_claim_is_neither_relayed_nor_handed_on(self) -> None:
        self.answers[("events", 7)] = False
        feed(self.w1, "POSITION events w1 0 7", "POSITION events w1 0 5")
        self.assertEqual(lines(self.follower), ["POSITION events w1 0 5"])
        self.assertEqual(self.receiver.commands, [PositionCommand("events", "w1", 0, 5)])
        self.assertEqual(self.checked[0][1], "w1 (10.1.2.3:40001)")

    def test_commands_behind_a_check_wait_for_it_in_order(self) -> None:
        answer: defer.Deferred[bool] = defer.Deferred()
        self.answers[("events", 9)] = answer
        feed(self.w1, "POSITION events w1 0 9")
        # Another writer's claim and a command that is no claim, received after.
        feed(self.w2, "POSITION receipts w2 0 3", "USER_SYNC w2 @u:hs DEV start 100")
        self.assertEqual(lines(self.follower), [])
        self.assertEqual(self.receiver.commands, [])
        answer.callback(True)
        self.assertEqual(
            lines(self.follower),
            [
                "POSITION events w1 0 9",
                "POSITION receipts w2 0 3",
                "USER_SYNC w2 @u:hs DEV start 100",
            ],
        )
        self.assertEqual(
            [type(c).__name__ for c in self.receiver.commands],
            ["PositionCommand", "PositionCommand", "UserSyncCommand"],
        )

    def test_a_claim_refused_after_its_check_releases_the_rest(self) -> None:
        answer: defer.Deferred[bool] = defer.Deferred()
        self.answers[("events", 9)] = answer
        feed(self.w1, "POSITION events w1 0 9", "POSITION events w1 0 4")
        answer.callback(False)
        self.assertEqual(lines(self.follower), ["POSITION events w1 0 4"])

    def test_a_failed_check_is_retried_and_holds_the_queue(self) -> None:
        self.answers[("events", 9)] = defer.fail(RuntimeError("database unreachable"))
        with self.assertLogs(LOGGER, "WARNING") as logs:
            feed(self.w1, "POSITION events w1 0 9")
        self.assertIn("database unreachable", logs.output[0])
        feed(self.w2, "POSITION receipts w2 0 3")
        self.assertEqual(lines(self.follower), [])
        self.answers[("events", 9)] = True
        self.clock.advance(CHECK_RETRY_SECONDS)
        self.assertEqual(
            lines(self.follower), ["POSITION events w1 0 9", "POSITION receipts w2 0 3"]
        )

    def watch_order(self, follower: StringTransport) -> list[str]:
        """What happens, in order: the follower's writes (one entry per
        write) and the receiver's commands and ends of reads."""
        order: list[str] = []
        write = follower.write
        on_command = self.receiver.on_command
        read_done = self.receiver.read_done

        def record_write(data: bytes) -> None:
            order.append("write " + data.decode().replace("\n", "|"))
            write(data)

        def record_command(connection: ReplicationConnection, cmd: Command) -> None:
            order.append(f"delivered {cmd.NAME}")
            on_command(connection, cmd)

        def record_read_done() -> None:
            order.append("read done")
            read_done()

        follower.write = record_write  # type: ignore[method-assign]
        self.receiver.on_command = record_command  # type: ignore[method-assign]
        self.receiver.read_done = record_read_done  # type: ignore[method-assign]
        return order

    def test_what_one_read_relays_leaves_in_one_write_before_the_read_is_done(self) -> None:
        """Rows are applied here at the end of the read (``read_done``):
        the relay goes first, as one write to each connection."""
        order = self.watch_order(self.follower)
        self.w1.dataReceived(b"POSITION events w1 0 5\nPOSITION events w1 5 6\n")
        self.assertEqual(
            order,
            [
                "delivered POSITION",
                "delivered POSITION",
                "write POSITION events w1 0 5|POSITION events w1 5 6|",
                "read done",
            ],
        )

    def test_commands_released_by_a_check_are_relayed_before_they_are_delivered(self) -> None:
        answer: defer.Deferred[bool] = defer.Deferred()
        self.answers[("events", 9)] = answer
        feed(self.w1, "POSITION events w1 0 9")
        feed(self.w2, "POSITION receipts w2 0 3")
        order = self.watch_order(self.follower)
        answer.callback(True)
        self.assertEqual(
            order,
            [
                "write POSITION events w1 0 9|POSITION receipts w2 0 3|",
                "delivered POSITION",
                "delivered POSITION",
            ],
        )

    def test_an_error_written_while_output_is_held_is_sent_before_the_close(self) -> None:
        follower = self.factory.connections[-1]
        follower.hold_output()
        follower.send_error_and_close("going away")
        self.assertEqual(lines(self.follower), ["ERROR going away"])
        self.assertTrue(self.follower.disconnecting)

    def test_shutdown_drops_what_waits(self) -> None:
        self.answers[("events", 9)] = defer.fail(RuntimeError("database unreachable"))
        with self.assertLogs(LOGGER, "WARNING"):
            feed(self.w1, "POSITION events w1 0 9")
        self.factory.close_all()
        checks = len(self.checked)
        self.clock.advance(CHECK_RETRY_SECONDS)
        self.assertEqual(len(self.checked), checks)


class ServerWithoutSecretTestCase(ServerTestCase):
    def test_handshake(self) -> None:
        proto, transport = self.connect()
        self.assertEqual(lines(transport), ["SERVER hs.test", "PING 0"])
        self.assertEqual(self.receiver.events, [("new", proto, None)])
        self.assertEqual(proto.state, ConnectionState.ESTABLISHED)
        feed(proto, "NAME worker1")
        self.assertEqual(proto.describe(), "worker1 (10.1.2.3:40001)")

    def test_auth_not_needed_is_ignored(self) -> None:
        proto, transport = self.connect()
        lines(transport)
        feed(proto, "AUTH whatever", "NAME w1", RDATA_LINE)
        self.assertEqual(lines(transport), [])
        self.assertEqual(self.receiver.commands, [parse_command_from_line(RDATA_LINE)])

    def test_relay_to_others_not_sender(self) -> None:
        a, ta = self.connect_authenticated("w1")
        _, tb = self.connect_authenticated()
        c, tc = self.connect_authenticated()
        # Relayed exactly as received (the JSON keeps its spaces).
        feed(a, RDATA_LINE)
        self.assertEqual(lines(ta), [])
        self.assertEqual(lines(tb), [RDATA_LINE])
        self.assertEqual(lines(tc), [RDATA_LINE])
        self.assertEqual(self.receiver.commands_on(a), [parse_command_from_line(RDATA_LINE)])

        feed(c, "REMOTE_SERVER_UP other.example", "REPLICATE")
        self.assertEqual(lines(ta), ["REMOTE_SERVER_UP other.example", "REPLICATE"])
        self.assertEqual(lines(tb), ["REMOTE_SERVER_UP other.example", "REPLICATE"])
        self.assertEqual(lines(tc), [])
        self.assertEqual(
            self.receiver.commands_on(c),
            [RemoteServerUpCommand("other.example"), ReplicateCommand()],
        )

    def test_a_worker_of_another_deployment_is_refused_and_reported(self) -> None:
        self.factory.deployment_id = "depA"
        proto, transport = self.connect()
        self.assertEqual(lines(transport)[0], "SERVER hs.test @depA")
        with self.assertLogs("synapse_lite.replication.claims", "ERROR") as logs:
            feed(proto, "NAME persister1 @depB", "POSITION events persister1 0 5")
        self.assertIn("another deployment (depB", logs.output[0])
        self.assertIn("ERROR another deployment", lines(transport))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.receiver.commands, [])
        self.assertIn("deployment depB", self.factory.problems()[0])
        ok, ok_transport = self.connect()
        feed(ok, "NAME persister1 @depA")
        self.assertFalse(ok_transport.disconnecting)

    def test_claims_for_another_writer_are_neither_believed_nor_relayed(self) -> None:
        """Only a writer speaks for itself: w2's connection cannot move w1."""
        a, _ = self.connect_authenticated("w2")
        _, tb = self.connect_authenticated("w1")
        unnamed, _ = self.connect_authenticated()
        before = metric(
            "synapse_lite_replication_claims_refused_total",
            {"stream": "events", "reason": "wrong_sender"},
        )
        with self.assertLogs("synapse_lite.replication.claims", "WARNING") as logs:
            feed(a, RDATA_LINE, "POSITION events w1 0 1000")
            feed(unnamed, "POSITION events w1 0 1000")
        self.assertEqual(lines(tb), [])
        self.assertEqual(self.receiver.commands, [])
        self.assertIn(
            "(wrong_sender): RDATA for writer w1 of events on the connection of w2", logs.output[0]
        )
        self.assertEqual(
            metric(
                "synapse_lite_replication_claims_refused_total",
                {"stream": "events", "reason": "wrong_sender"},
            ),
            before + 3,
        )
        # Its own claims go through.
        feed(a, "POSITION events w2 0 4")
        self.assertEqual(lines(tb), ["POSITION events w2 0 4"])
        self.assertEqual(self.receiver.commands, [PositionCommand("events", "w2", 0, 4)])

    def test_a_name_held_by_a_live_connection_is_refused(self) -> None:
        """Issue 34: one live connection per instance name. A second NAME w1
        (an impostor with the secret, w1 started twice, w1 back while its old
        connection lingers) is refused; the first keeps speaking for w1, and
        once it is lost the name is free again. Nobody takes the listening
        process's own name, and a connection cannot rename itself."""
        real, real_transport = self.connect_authenticated("w1")
        _, tb = self.connect_authenticated("w2")
        before = metric(
            "synapse_lite_replication_claims_refused_total",
            {"stream": "unknown", "reason": "duplicate_name"},
        )
        impostor, it = self.connect_authenticated()
        with self.assertLogs("synapse_lite.replication.tcp.tcp_server", "ERROR") as logs:
            feed(impostor, "NAME w1", "POSITION events w1 0 1000")
        self.assertIn(
            "naming itself w1: already connected from w1 (10.1.2.3:40001)", logs.output[0]
        )
        self.assertIn("ERROR instance name w1 is taken", lines(it))
        self.assertTrue(it.disconnecting)
        self.assertEqual(lines(tb), [])
        lose(impostor)
        feed(real, "POSITION events w1 0 4")
        self.assertEqual(lines(tb), ["POSITION events w1 0 4"])
        self.assertEqual(self.receiver.commands, [PositionCommand("events", "w1", 0, 4)])
        self.assertFalse(real_transport.disconnecting)

        for name in ("main", "w2"):
            other, ot = self.connect_authenticated()
            with self.assertLogs("synapse_lite.replication.tcp.tcp_server", "ERROR"):
                feed(other, f"NAME {name}")
            self.assertTrue(ot.disconnecting, name)
        feed(real, "NAME w1")  # the same name again: harmless
        self.assertFalse(real_transport.disconnecting)
        with self.assertLogs("synapse_lite.replication.tcp.tcp_server", "ERROR"):
            feed(real, "NAME w3")
        self.assertTrue(real_transport.disconnecting)
        self.assertEqual(
            metric(
                "synapse_lite_replication_claims_refused_total",
                {"stream": "unknown", "reason": "duplicate_name"},
            ),
            before + 4,
        )
        # The real w1 is gone: its restart gets the name.
        lose(real)
        again, at = self.connect_authenticated("w1")
        self.assertFalse(at.disconnecting)
        self.assertEqual(again.peer_name, "w1")

    def test_connection_commands_are_not_relayed(self) -> None:
        a, _ = self.connect_authenticated()
        _, tb = self.connect_authenticated()
        with self.assertLogs(LOGGER, "WARNING") as logs:
            feed(a, "PING 123", "NAME w1", "ERROR something odd")
        self.assertIn("w1 (10.1.2.3:40001) sent ERROR 'something odd'", logs.output[0])
        self.assertEqual(lines(tb), [])
        self.assertEqual(self.receiver.commands, [])

    def test_broadcast_reaches_every_connection(self) -> None:
        a, ta = self.connect_authenticated()
        b, tb = self.connect_authenticated()
        self.factory.send_command(PositionCommand("events", "master", 3, 7))
        self.assertEqual(lines(ta), ["POSITION events master 3 7"])
        self.assertEqual(lines(tb), ["POSITION events master 3 7"])
        self.assertEqual(self.factory.connections, (a, b))

    def test_lost_connections_leave_the_broadcast(self) -> None:
        a, ta = self.connect_authenticated()
        b, tb = self.connect_authenticated()
        lose(a)
        self.factory.send_command(ReplicateCommand())
        self.assertEqual(lines(ta), [])
        self.assertEqual(lines(tb), ["REPLICATE"])
        self.assertEqual(self.factory.connections, (b,))

    def test_client_only_command_is_refused(self) -> None:
        proto, transport = self.connect_authenticated()
        with self.assertLogs(LOGGER, "WARNING"):
            feed(proto, "SERVER hs.test", RDATA_LINE)
        self.assertEqual(lines(transport), ["ERROR invalid command: SERVER"])
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.receiver.commands, [])


class ServerWithSecretTestCase(ServerTestCase):
    secret = "s3cret"

    def test_auth_then_handshake(self) -> None:
        proto, transport = self.connect()
        self.assertEqual(lines(transport), ["SERVER hs.test"])
        self.assertEqual(self.receiver.events, [])
        feed(proto, "AUTH s3cret")
        self.assertEqual(lines(transport), ["PING 0"])
        self.assertEqual(self.receiver.events, [("new", proto, None)])
        feed(proto, "NAME w1", RDATA_LINE)
        self.assertEqual(self.receiver.commands, [parse_command_from_line(RDATA_LINE)])

    def assert_refused(self, first: str, error: str) -> None:
        other, tother = self.connect_authenticated()
        proto, transport = self.connect()
        lines(transport)
        with self.assertLogs(LOGGER, "WARNING") as logs:
            feed(proto, first, RDATA_LINE, "AUTH s3cret", RDATA_LINE)
        self.assertIn(f"10.1.2.3:{self.port}", "\n".join(logs.output))
        self.assertNotIn("s3cret", "\n".join(logs.output))
        self.assertEqual(lines(transport), [f"ERROR {error}"])
        self.assertTrue(transport.disconnecting)
        self.assertEqual(proto.state, ConnectionState.CLOSED)
        # Nothing reached the receiver or the other worker.
        self.assertEqual(self.receiver.events, [("new", other, None)])
        self.assertEqual(lines(tother), [])
        self.assertEqual(self.factory.connections, (other,))
        lose(proto)
        self.assertEqual(self.receiver.events, [("new", other, None)])

    def test_wrong_secret(self) -> None:
        self.assert_refused("AUTH wrong", "bad secret")

    def test_wrong_secret_of_another_length(self) -> None:
        self.assert_refused("AUTH s3cret-and-more ünïcode", "bad secret")

    def test_name_before_auth(self) -> None:
        self.assert_refused("NAME w1", "authentication required")

    def test_data_before_auth(self) -> None:
        self.assert_refused(RDATA_LINE, "authentication required")

    def test_ping_before_auth(self) -> None:
        self.assert_refused("PING 5", "authentication required")

    def test_unauthenticated_connections_get_no_broadcast_or_relay(self) -> None:
        a, _ = self.connect_authenticated("w1")
        _, tb = self.connect_authenticated()
        _, tpending = self.connect()
        lines(tpending)
        self.factory.send_command(ReplicateCommand())
        feed(a, RDATA_LINE)
        self.assertEqual(lines(tpending), [])
        self.assertEqual(lines(tb), ["REPLICATE", RDATA_LINE])

    def test_auth_timeout(self) -> None:
        _, transport = self.connect()
        lines(transport)
        self.clock.advance(24)
        self.assertEqual(lines(transport), [])
        with self.assertLogs(LOGGER, "WARNING"):
            self.clock.advance(1)
        self.assertEqual(lines(transport), ["ERROR authentication timeout"])
        self.assertTrue(transport.disconnecting)

    def test_empty_secret_is_a_mistake(self) -> None:
        with self.assertRaises(ValueError):
            ReplicationServerFactory("hs.test", "", self.receiver, self.clock)


class ClientTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.receiver = RecordingReceiver()

    def connect(
        self, secret: str | None = None
    ) -> tuple[ReplicationClientFactory, ClientReplicationProtocol, StringTransport]:
        factory = ReplicationClientFactory("hs.test", "worker1", secret, self.receiver, self.clock)
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 9093))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 9093))
        proto.makeConnection(transport)
        return factory, proto, transport

    def test_handshake_with_secret(self) -> None:
        seen_at_announce: list[list[str]] = []

        class Receiver(RecordingReceiver):
            def new_connection(self, connection: ReplicationConnection) -> None:
                seen_at_announce.append(transport.value().decode().splitlines())
                super().new_connection(connection)

        self.receiver = Receiver()
        factory = ReplicationClientFactory("hs.test", "worker1", "pw", self.receiver, self.clock)
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 9093))
        transport = StringTransport()
        proto.makeConnection(transport)
        self.assertEqual(lines(transport), ["AUTH pw", "NAME worker1", "PING 0", "REPLICATE"])
        # The receiver hears of the connection before REPLICATE goes out.
        self.assertEqual(seen_at_announce, [["AUTH pw", "NAME worker1", "PING 0"]])
        self.assertIs(factory.current_connection, proto)

    def test_handshake_without_secret(self) -> None:
        _, proto, transport = self.connect()
        self.assertEqual(lines(transport), ["NAME worker1", "PING 0", "REPLICATE"])
        self.assertEqual(self.receiver.events, [("new", proto, None)])

    def test_every_data_command_accepted_from_server(self) -> None:
        _, proto, transport = self.connect()
        lines(transport)
        data_lines = [
            RDATA_LINE,
            "POSITION events w2 1 2",
            "REPLICATE",
            "USER_SYNC i @u:x None start 5",
            "CLEAR_USER_SYNC i",
            "FEDERATION_ACK fed 3",
            'USER_IP @u:x ["t","ip","ua",null,5]',
            "REMOTE_SERVER_UP other.example",
        ]
        feed(proto, "SERVER hs.test", "PING 1", *data_lines)
        self.assertEqual(lines(transport), [])
        self.assertEqual(self.receiver.commands, [parse_command_from_line(x) for x in data_lines])

    def test_the_commands_of_one_read_come_between_read_started_and_read_done(self) -> None:
        order: list[str] = []

        class Receiver(RecordingReceiver):
            def read_started(self) -> None:
                order.append("started")

            def read_done(self) -> None:
                order.append("done")

            def on_command(self, connection: ReplicationConnection, cmd: Command) -> None:
                order.append(cmd.NAME)

        self.receiver = Receiver()
        _, proto, _ = self.connect()
        feed(proto, b"SERVER hs.test\nRDATA events w1 1 [1]\nRDATA events w1 2 [2]\nPOSI")
        feed(proto, b"TION events w1 2 3\n")
        self.assertEqual(
            order, ["started", "RDATA", "RDATA", "done", "started", "POSITION", "done"]
        )

    def test_lines_of_streams_not_followed_are_skipped_unparsed(self) -> None:
        """The router follows the caches stream alone: the others' rows are not
        decoded (not even a malformed one), and they still count as traffic."""
        factory = ReplicationClientFactory(
            "hs.test", "router", None, self.receiver, self.clock, followed_streams=["caches"]
        )
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 9093))
        transport = StringTransport()
        proto.makeConnection(transport)
        feed(proto, "SERVER hs.test", "PING 1")
        lines(transport)
        before = metric("synapse_lite_replication_commands_received_total", {"command": "RDATA"})
        caches = 'RDATA caches main 3 ["f", ["k"], 1]'
        feed(
            proto,
            RDATA_LINE,
            "RDATA events w1 6 [not json",
            "POSITION events w1 5 6",
            caches,
            "POSITION caches main 2 3",
            "REMOTE_SERVER_UP other.example",
        )
        self.assertEqual(
            self.receiver.commands,
            [
                parse_command_from_line(caches),
                PositionCommand("caches", "main", 2, 3),
                RemoteServerUpCommand("other.example"),
            ],
        )
        self.assertEqual(proto.state, ConnectionState.ESTABLISHED)
        self.assertEqual(
            metric("synapse_lite_replication_commands_received_total", {"command": "RDATA"}),
            before + 3,
        )
        # A malformed line of a followed stream is still refused.
        with self.assertLogs(LOGGER, "WARNING"):
            feed(proto, "RDATA caches main 4 [not json")
        self.assertEqual(proto.state, ConnectionState.CLOSED)

    def test_wrong_remote(self) -> None:
        _, proto, transport = self.connect()
        lines(transport)
        with self.assertLogs(LOGGER, "WARNING"):
            feed(proto, "SERVER elsewhere.test", RDATA_LINE)
        self.assertEqual(lines(transport), ["ERROR Wrong remote"])
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.receiver.commands, [])
        lose(proto)
        self.assertEqual(self.receiver.events, [("new", proto, None), ("lost", proto, None)])

    def test_a_main_process_of_another_deployment_is_refused_and_reported(self) -> None:
        factory = ReplicationClientFactory(
            "hs.test", "worker1", None, self.receiver, self.clock, deployment_id="depA"
        )
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 9093))
        transport = StringTransport()
        proto.makeConnection(transport)
        self.assertEqual(lines(transport)[0], "NAME worker1 @depA")
        with self.assertLogs("synapse_lite.replication.claims", "ERROR") as logs:
            feed(proto, "SERVER hs.test @depB", RDATA_LINE)
        self.assertIn("another deployment (depB", logs.output[0])
        self.assertEqual(lines(transport), ["ERROR another deployment"])
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.receiver.commands, [])
        self.assertIn("foreign replication traffic from deployment depB", factory.problems()[0])
        # The same deployment (or a main process naming none) is fine.
        _, proto, transport = self.connect()
        feed(proto, "SERVER hs.test @depA")
        self.assertFalse(transport.disconnecting)

    def test_server_must_name_itself_first(self) -> None:
        _, proto, transport = self.connect()
        lines(transport)
        with self.assertLogs(LOGGER, "WARNING"):
            feed(proto, RDATA_LINE)
        self.assertEqual(lines(transport), ["ERROR expected SERVER first"])
        self.assertEqual(self.receiver.commands, [])

    def test_server_only_commands_refused(self) -> None:
        _, proto, transport = self.connect()
        feed(proto, "SERVER hs.test")
        lines(transport)
        with self.assertLogs(LOGGER, "WARNING"):
            feed(proto, "AUTH x")
        self.assertEqual(lines(transport), ["ERROR invalid command: AUTH"])

    def test_names_and_secret_checked_up_front(self) -> None:
        for server, client, secret in [
            ("hs.test", "two words", None),
            ("hs test", "w1", None),
            ("hs.test", "w1", "multi\nline"),
            ("hs.test", "w1", ""),
        ]:
            with self.assertRaises(CommandEncodeError):
                ReplicationClientFactory(server, client, secret, self.receiver, self.clock)

    def test_bus_sends_on_current_connection_only(self) -> None:
        factory, proto, transport = self.connect()
        lines(transport)
        factory.send_command(ReplicateCommand())
        self.assertEqual(lines(transport), ["REPLICATE"])
        lose(proto)
        self.assertIsNone(factory.current_connection)
        factory.send_command(ReplicateCommand())  # dropped, no error
        self.assertEqual(lines(transport), [])

    def test_a_refused_attempt_is_logged_with_its_reason(self) -> None:
        factory = ReplicationClientFactory("hs.test", "w1", None, self.receiver, self.clock)
        endpoint = ScriptedEndpoint(self.clock)
        with self.assertLogs("synapse_lite.replication.tcp.tcp_client", "INFO") as logs:
            factory.connect(cast(Any, endpoint))
            endpoint.refuse()
        self.assertIn("could not connect to replication server hs.test", logs.output[0])
        self.assertIn("refused", logs.output[0])
        self.successResultOf(factory.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_backoff_grows_and_resets_when_accepted(self) -> None:
        """Through ClientService on the test's clock: refused attempts wait
        0.2, 0.4, 0.8, ... up to max_delay; a connection the main process
        closes before accepting it (no PING) counts as one more failure; once
        a connection is accepted, the next wait starts from 0.2 again."""
        self.patch(reconnect.random, "uniform", lambda low, high: 1.0)
        factory = ReplicationClientFactory(
            "hs.test", "w1", None, self.receiver, self.clock, initial_delay=0.2, max_delay=3
        )
        endpoint = ScriptedEndpoint(self.clock)
        factory.connect(cast(Any, endpoint))
        for _ in range(6):
            endpoint.refuse()
            self.clock.advance(endpoint.next_attempt_in())
        self.assertEqual(endpoint.waits, [0.2, 0.4, 0.8, 1.6, 3, 3])
        # Made, then closed before the main process accepted it: a failure.
        proto, transport = endpoint.accept()
        feed(proto, "SERVER hs.test")
        lose(proto)
        self.assertEqual(endpoint.next_attempt_in(), 3)
        self.clock.advance(3)
        proto, transport = endpoint.accept()
        feed(proto, "SERVER hs.test", "PING 1")  # accepted
        self.assertIs(factory.current_connection, proto._protocol)
        lose(proto)
        self.assertIsNone(factory.current_connection)
        self.assertEqual(endpoint.next_attempt_in(), 0.2)
        self.clock.advance(0.2)
        proto, transport = endpoint.accept()
        stopped = factory.stop()
        self.assertTrue(transport.disconnecting)
        lose(proto)
        self.successResultOf(stopped)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(endpoint.pending, [])


class LifecycleTestCase(unittest.TestCase):
    """Framing, keepalive and flow control, on the server end (no secret)."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.receiver = RecordingReceiver()
        self.factory = ReplicationServerFactory("hs.test", None, self.receiver, self.clock)
        self.proto = self.factory.buildProtocol(IPv4Address("TCP", "10.0.0.9", 5555))
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "10.0.0.9", 5555))
        self.proto.makeConnection(self.transport)
        # The worker whose rows the tests send (only w1 may claim w1's positions).
        feed(self.proto, "NAME w1")
        lines(self.transport)

    def test_ping_every_five_seconds_when_idle(self) -> None:
        self.clock.advance(5)
        self.assertEqual(lines(self.transport), ["PING 5000"])
        self.clock.advance(3)
        self.proto.send_command(ReplicateCommand())
        self.assertEqual(lines(self.transport), ["REPLICATE"])
        # Something went out 2 s ago: no PING needed yet.
        self.clock.advance(2)
        self.assertEqual(lines(self.transport), [])
        self.clock.advance(5)
        self.assertEqual(lines(self.transport), ["PING 15000"])

    def test_ping_timeout(self) -> None:
        feed(self.proto, "PING 0")
        self.clock.advance(20)
        lines(self.transport)
        self.assertEqual(self.proto.state, ConnectionState.ESTABLISHED)
        with self.assertLogs(LOGGER, "WARNING"):
            self.clock.advance(5)
        self.assertEqual(lines(self.transport), ["ERROR ping timeout"])
        self.assertTrue(self.transport.disconnecting)

    def test_anything_received_keeps_it_alive(self) -> None:
        feed(self.proto, "PING 0")
        self.clock.advance(20)
        feed(self.proto, RDATA_LINE)
        self.clock.advance(20)
        self.assertEqual(self.proto.state, ConnectionState.ESTABLISHED)
        with self.assertLogs(LOGGER, "WARNING"):
            self.clock.advance(5)
        self.assertEqual(self.proto.state, ConnectionState.CLOSED)

    def test_no_timeout_for_a_peer_that_never_pinged(self) -> None:
        self.clock.advance(300)
        self.assertEqual(self.proto.state, ConnectionState.ESTABLISHED)

    def test_lingering_close_is_aborted(self) -> None:
        self.proto.close()
        self.assertTrue(self.transport.disconnecting)
        self.assertFalse(self.transport.disconnected)
        self.assertIsNone(self.transport.producer)
        self.clock.advance(24)
        self.assertFalse(self.transport.disconnected)
        with self.assertLogs(LOGGER, "WARNING"):
            self.clock.advance(1)
        self.assertTrue(self.transport.disconnected)

    def test_pause_queues_and_resume_flushes_in_order(self) -> None:
        self.assertIs(self.transport.producer, self.proto)
        self.proto.pauseProducing()
        self.assertEqual(self.proto.state, ConnectionState.PAUSED)
        sent = [PositionCommand("events", "master", i, i + 1) for i in range(5)]
        for cmd in sent:
            self.proto.send_command(cmd)
        self.factory.send_command(ReplicateCommand())
        self.clock.advance(10)  # no PING queued behind them while paused
        self.assertEqual(lines(self.transport), [])
        self.proto.resumeProducing()
        self.assertEqual(lines(self.transport), [command_line(c) for c in sent] + ["REPLICATE"])
        self.assertEqual(self.proto.state, ConnectionState.ESTABLISHED)

    def test_resume_stops_flushing_if_paused_again(self) -> None:
        self.proto.pauseProducing()
        for i in range(4):
            self.proto.send_command(PositionCommand("events", "master", i, i + 1))
        writes = 0
        original_write = self.transport.write

        def write(data: bytes) -> None:
            nonlocal writes
            original_write(data)
            writes += 1
            if writes == 2:
                self.proto.pauseProducing()

        self.transport.write = write  # type: ignore[method-assign]
        self.proto.resumeProducing()
        self.assertEqual(len(lines(self.transport)), 2)
        self.proto.resumeProducing()
        self.assertEqual(
            lines(self.transport), ["POSITION events master 2 3", "POSITION events master 3 4"]
        )

    def test_queue_bound(self) -> None:
        self.proto.pauseProducing()
        with self.assertLogs(LOGGER, "WARNING"):
            for i in range(MAX_QUEUED_COMMANDS + 1):
                self.proto.send_command(PositionCommand("events", "master", i, i + 1))
        self.assertEqual(lines(self.transport), ["ERROR Failed to keep up"])
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(self.proto.state, ConnectionState.CLOSED)
        self.proto.send_command(ReplicateCommand())  # dropped
        self.assertEqual(lines(self.transport), [])

    def assert_refused(self, data: bytes, error: str) -> None:
        bad_before = metric("synapse_lite_replication_bad_lines_total", {"transport": "tcp"})
        with self.assertLogs(LOGGER, "WARNING") as logs:
            self.proto.dataReceived(data)
        self.assertIn("10.0.0.9:5555", "\n".join(logs.output))
        self.assertEqual(lines(self.transport), [f"ERROR {error}"])
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(self.receiver.commands, [])
        bad_after = metric("synapse_lite_replication_bad_lines_total", {"transport": "tcp"})
        self.assertEqual(bad_after, bad_before + 1)

    def test_invalid_utf8(self) -> None:
        self.assert_refused(b"PING \xff\xfe\n" + RDATA_LINE.encode() + b"\n", "invalid UTF-8")

    def test_line_too_long(self) -> None:
        self.assert_refused(
            b"PING " + b"x" * MAX_LINE_LENGTH + b"\n",
            f"line too long (over {MAX_LINE_LENGTH} bytes)",
        )

    def test_line_too_long_without_newline(self) -> None:
        self.assert_refused(
            b"RDATA " + b"x" * MAX_LINE_LENGTH, f"line too long (over {MAX_LINE_LENGTH} bytes)"
        )

    def test_garbage(self) -> None:
        self.assert_refused(
            b"HELLO world\n" + RDATA_LINE.encode() + b"\n",
            "failed to parse line: unknown command 'HELLO'",
        )

    def test_bad_token(self) -> None:
        self.assert_refused(
            b"POSITION events w1 1 1e3\n",
            "failed to parse line: new_token must be a decimal integer, got '1e3'",
        )

    def test_longest_line_accepted(self) -> None:
        line = b"PING " + b"x" * (MAX_LINE_LENGTH - 5)
        self.proto.dataReceived(line[:7000])
        self.proto.dataReceived(line[7000:] + b"\n")
        self.assertEqual(self.proto.state, ConnectionState.ESTABLISHED)

    def test_blank_lines_ignored(self) -> None:
        self.proto.dataReceived(b"\n\n  \n" + RDATA_LINE.encode() + b"\n\n")
        self.assertEqual(lines(self.transport), [])
        self.assertEqual(len(self.receiver.commands), 1)

    def test_lines_split_across_reads(self) -> None:
        data = (RDATA_LINE + "\nPOSITION events w1 5 6\n").encode()
        for i in range(len(data)):
            self.proto.dataReceived(data[i : i + 1])
        self.assertEqual(
            self.receiver.commands,
            [parse_command_from_line(RDATA_LINE), PositionCommand("events", "w1", 5, 6)],
        )

    def test_counts_commands_by_name(self) -> None:
        def counts() -> tuple[float, float]:
            return (
                metric("synapse_lite_replication_commands_received_total", {"command": "RDATA"}),
                metric("synapse_lite_replication_commands_sent_total", {"command": "REPLICATE"}),
            )

        before = counts()
        feed(self.proto, RDATA_LINE, RDATA_LINE)
        self.proto.send_command(ReplicateCommand())
        after = counts()
        self.assertEqual((after[0] - before[0], after[1] - before[1]), (2, 1))

    def test_receiver_errors_are_logged_not_fatal(self) -> None:
        class Failing(RecordingReceiver):
            def on_command(self, connection: ReplicationConnection, cmd: Command) -> None:
                super().on_command(connection, cmd)
                raise RuntimeError("handler bug")

        failing = Failing()
        self.proto._receiver = failing
        with self.assertLogs(LOGGER, "ERROR") as logs:
            feed(self.proto, RDATA_LINE, "REPLICATE")
        self.assertIn("handler bug", "\n".join(logs.output))
        self.assertEqual(self.proto.state, ConnectionState.ESTABLISHED)
        self.assertEqual(len(failing.commands), 2)

    def test_unencodable_command_is_dropped(self) -> None:
        with self.assertLogs(LOGGER, "ERROR"):
            self.proto.send_command(UserSyncCommand("i", "@u:x", "None", True, 1))
        self.assertEqual(lines(self.transport), [])
        self.assertEqual(self.proto.state, ConnectionState.ESTABLISHED)


class LostConnectionOnceTestCase(unittest.TestCase):
    """Whatever way a connection ends, lost_connection follows new_connection once."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.receiver = RecordingReceiver()
        self.factory = ReplicationServerFactory("hs.test", None, self.receiver, self.clock)

    def connect(self) -> tuple[ServerReplicationProtocol, StringTransport]:
        proto = self.factory.buildProtocol(IPv4Address("TCP", "10.0.0.9", 5555))
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport

    def assert_once(self, proto: ReplicationProtocol) -> None:
        self.assertEqual(self.receiver.events, [("new", proto, None), ("lost", proto, None)])
        self.assertEqual(self.factory.connections, ())

    def test_peer_closes(self) -> None:
        proto, _ = self.connect()
        lose(proto)
        self.assert_once(proto)

    def test_we_close(self) -> None:
        proto, _ = self.connect()
        proto.close()
        proto.close()
        lose(proto)
        self.assert_once(proto)

    def test_bad_line(self) -> None:
        proto, _ = self.connect()
        with self.assertLogs(LOGGER, "WARNING"):
            feed(proto, "garbage", "more garbage")
        lose(proto)
        self.assert_once(proto)

    def test_ping_timeout_then_abort(self) -> None:
        proto, _ = self.connect()
        feed(proto, "PING 1")
        with self.assertLogs(LOGGER, "WARNING"):
            self.clock.advance(60)
        lose(proto)
        self.assert_once(proto)

    def test_receiver_raising_on_lost(self) -> None:
        class Failing(RecordingReceiver):
            def lost_connection(self, connection: ReplicationConnection) -> None:
                super().lost_connection(connection)
                raise RuntimeError("handler bug")

        self.receiver = Failing()
        self.factory.receiver = self.receiver
        proto, _ = self.connect()
        with self.assertLogs(LOGGER, "ERROR"):
            lose(proto)
        self.assert_once(proto)

    def test_never_announced_never_lost(self) -> None:
        factory = ReplicationServerFactory("hs.test", "pw", self.receiver, self.clock)
        proto = factory.buildProtocol(IPv4Address("TCP", "10.0.0.9", 5555))
        proto.makeConnection(StringTransport())
        lose(proto)
        self.assertEqual(self.receiver.events, [])

    def test_timers_stop_with_the_connection(self) -> None:
        proto, _ = self.connect()
        proto.close()
        lose(proto)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_close_all(self) -> None:
        _, ta = self.connect()
        _, tb = self.connect()
        self.factory.close_all()
        self.assertTrue(ta.disconnecting and tb.disconnecting)
