"""The Redis replication bus against a real Redis.

Each test uses its own server name, so its own channel: runs in parallel on one
Redis do not hear each other. Connections are killed from the Redis side with
CLIENT KILL ID, found by the names the bus gives its connections.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

import txredisapi
from prometheus_client import REGISTRY
from twisted.internet import reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.trial import unittest

from synapse_lite.config.homeserver import RedisConfig
from synapse_lite.replication.tcp import redis as redis_module
from synapse_lite.replication.tcp import redis_connections
from synapse_lite.replication.tcp.commands import (
    MAX_LINE_LENGTH,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
)
from synapse_lite.replication.tcp.redis import RedisReplicationBus, mac_key, signed_message
from tests.harness.services import redis_address, require_redis
from tests.replication.tcp.recording_receiver import RecordingReceiver, wait_until

LOGGER = "synapse_lite.replication.tcp.redis"
SECRET = "redis-test-secret"


def signed(sender: str, line: bytes, secret: str = SECRET, deployment: str = "dep1") -> bytes:
    """``line`` as a process of ``deployment`` holding ``secret`` publishes it."""
    return signed_message(mac_key(secret), deployment, sender, line)


# The reactor's zope interfaces defeat mypy.
any_reactor: Any = reactor


def bad_lines() -> float:
    value = REGISTRY.get_sample_value(
        "synapse_lite_replication_bad_lines_total", {"transport": "redis"}
    )
    return value or 0.0


def metric_value(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class RedisBusTestCase(unittest.TestCase):
    def setUp(self) -> None:
        require_redis()
        host, port = redis_address()
        self.config = RedisConfig(host=host, port=port)
        self.server_name = f"test-{uuid.uuid4().hex}.example"

    def make_bus(
        self,
        instance_name: str,
        deployment_id: str = "dep1",
        followed_streams: list[str] | None = None,
    ) -> tuple[RedisReplicationBus, RecordingReceiver]:
        receiver = RecordingReceiver()
        bus = RedisReplicationBus.from_config(
            self.config,
            server_name=self.server_name,
            instance_name=instance_name,
            receiver=receiver,
            reactor=reactor,
            initial_delay=0.05,
            max_delay=0.5,
            deployment_id=deployment_id,
            followed_streams=followed_streams,
            secret=SECRET,
        )
        bus.start()
        self.addCleanup(bus.stop)
        return bus, receiver

    async def started_bus(
        self,
        instance_name: str,
        deployment_id: str = "dep1",
        followed_streams: list[str] | None = None,
    ) -> tuple[RedisReplicationBus, RecordingReceiver]:
        bus, receiver = self.make_bus(instance_name, deployment_id, followed_streams)
        await wait_until(
            lambda: bool(receiver.connections("new")) and bus.publisher_connected,
            what=f"{instance_name} to subscribe and connect",
        )
        return bus, receiver

    async def raw_redis(self) -> Any:
        host, port = redis_address()
        conn = await txredisapi.Connection(host, port, reconnect=False)
        self.addCleanup(conn.disconnect)
        return conn

    async def kill(self, bus: RedisReplicationBus, role: str) -> None:
        """Kill one of ``bus``'s connections from the Redis side."""
        raw = await self.raw_redis()
        name = redis_connections.client_name(bus.channel, bus.instance_name, role)
        ids: list[str] = []

        async def find() -> bool:
            clients = await raw.execute_command("CLIENT", "LIST")
            ids[:] = [
                field.split("=", 1)[1]
                for line in clients.splitlines()
                if f" name={name} " in line
                for field in line.split()
                if field.startswith("id=")
            ]
            return bool(ids)

        for _ in range(500):  # the name is set just after connecting
            if await find():
                break
            await task.deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(len(ids), 1, f"one connection named {name}")
        killed = await raw.execute_command("CLIENT", "KILL", "ID", ids[0])
        self.assertEqual(killed, 1)

    async def test_command_reaches_other_process_and_comes_back(self) -> None:
        a, a_receiver = await self.started_bus("worker1")
        b, b_receiver = await self.started_bus("worker2")
        # B announced itself with REPLICATE, which A heard.
        await wait_until(lambda: ReplicateCommand() in a_receiver.commands, what="REPLICATE")

        cmd = PositionCommand("events", "worker1", 1, 5)
        other = RemoteServerUpCommand("other.example")
        a.send_command(cmd)
        a.send_command(other)
        await wait_until(
            lambda: other in b_receiver.commands and other in a_receiver.commands,
            what="delivery",
        )
        # Echoes reach the publisher too, except its own RDATA and POSITION,
        # which the bus drops without parsing them; the bus is the connection.
        self.assertIn(("command", b, cmd), b_receiver.events)
        self.assertNotIn(cmd, a_receiver.commands)
        self.assertIn(("command", a, other), a_receiver.events)
        self.assertEqual(a_receiver.connections("new"), [a])

    async def test_lines_of_streams_not_followed_are_skipped_unparsed(self) -> None:
        bus, receiver = await self.started_bus("router", followed_streams=["caches"])
        raw = await self.raw_redis()
        for message in [
            b"RDATA events main 6 [not json",
            b"POSITION events main 5 6",
            b'RDATA caches main 3 ["f", ["k"], 1]',
            b"REMOTE_SERVER_UP ok.example",
        ]:
            await raw.publish(bus.channel, signed("main", message))
        await wait_until(
            lambda: RemoteServerUpCommand("ok.example") in receiver.commands,
            what="the last message",
        )
        self.assertEqual(
            [type(c).__name__ for c in receiver.commands if not isinstance(c, ReplicateCommand)],
            ["RdataCommand", "RemoteServerUpCommand"],
        )

    async def test_bad_messages_are_logged_and_dropped(self) -> None:
        bus, receiver = await self.started_bus("worker1")
        raw = await self.raw_redis()
        bad = [
            signed("worker2", b"garbage"),
            signed("worker2", b"\xff\xfe not UTF-8"),
            signed("worker2", b"REMOTE_SERVER_UP " + b"x" * MAX_LINE_LENGTH),
            signed("worker2", b"POSITION events w 1 1e3"),
            signed("worker2", b"RDATA events w 1 [" + b"[" * 5000),
            signed("worker2", b"PING 12345"),
            b"",
            # No sender: refused before it is parsed.
            b"REMOTE_SERVER_UP bare.example",
        ]
        before = bad_lines()
        with self.assertLogs(LOGGER, "WARNING") as logs:
            for message in bad:
                await raw.publish(bus.channel, message)
            await raw.publish(bus.channel, signed("worker2", b"REMOTE_SERVER_UP ok.example"))
            await wait_until(
                lambda: RemoteServerUpCommand("ok.example") in receiver.commands,
                what="the good message",
            )
        dropped = [line for line in logs.output if "dropping a message" in line]
        self.assertEqual(len(dropped), len(bad), "\n".join(logs.output))
        self.assertIn("invalid UTF-8: b'\\xff\\xfe not UTF-8'", dropped[1])
        self.assertIn("no sender", dropped[-1])
        self.assertLess(len(dropped[2]), 600)  # only the start of a long message
        self.assertEqual(bad_lines(), before + len(bad))
        data = [c for c in receiver.commands if not isinstance(c, ReplicateCommand)]
        self.assertEqual(data, [RemoteServerUpCommand("ok.example")])
        self.assertEqual(receiver.connections("lost"), [])

    async def test_another_deployment_on_the_channel_is_refused_and_reported(self) -> None:
        """Same server name, no prefix, another database: both keep working,
        each refuses and reports the other."""
        with self.assertLogs(LOGGER, "ERROR") as logs:
            a, a_receiver = await self.started_bus("persister1", "depA")
            b, b_receiver = await self.started_bus("persister1", "depB")
            b.send_command(PositionCommand("events", "persister1", 0, 10**6))
            b.send_command(RemoteServerUpCommand("from-b.example"))
            own = RemoteServerUpCommand("from-a.example")
            a.send_command(own)
            await wait_until(lambda: own in a_receiver.commands, what="A's own echo")
            await wait_until(lambda: bool(a.problems()) and bool(b.problems()), what="reports")
        output = "\n".join(logs.output)
        self.assertIn("Another deployment (depB, process persister1)", output)
        self.assertIn("Another deployment (depA, process persister1)", output)
        self.assertNotIn(RemoteServerUpCommand("from-b.example"), a_receiver.commands)
        self.assertNotIn(own, b_receiver.commands)
        self.assertIn(
            "foreign replication traffic from deployment depB (process persister1)",
            a.problems()[0],
        )
        self.assertIn("deployment depA", b.problems()[0])

    async def test_a_message_without_a_valid_mac_moves_nothing(self) -> None:
        """Issue 34: Redis cannot tell who published, so every message is
        signed with the replication secret. Unsigned (the envelope before
        issue 34), signed with another secret, or altered after signing:
        refused and counted, never handed on."""
        a, a_receiver = await self.started_bus("worker1")
        raw = await self.raw_redis()
        good = signed("worker2", b"POSITION events worker2 0 5")
        before = metric_value(
            "synapse_lite_replication_claims_refused_total",
            {"stream": "unknown", "reason": "bad_mac"},
        )
        with self.assertLogs("synapse_lite.replication.claims", "WARNING") as logs:
            await raw.publish(a.channel, b"@dep1 worker2 POSITION events worker2 0 7")
            await raw.publish(a.channel, signed("worker2", b"POSITION events worker2 0 8", "x"))
            await raw.publish(a.channel, good.replace(b" 0 5", b" 0 9"))
            await raw.publish(a.channel, good.replace(b"worker2 ", b"worker3 ", 1))
            await raw.publish(a.channel, good)
            await wait_until(
                lambda: PositionCommand("events", "worker2", 0, 5) in a_receiver.commands,
                what="the signed message",
            )
        self.assertIn("(bad_mac): a message whose MAC does not match", logs.output[0])
        positions = [c for c in a_receiver.commands if isinstance(c, PositionCommand)]
        self.assertEqual(positions, [PositionCommand("events", "worker2", 0, 5)])
        self.assertEqual(
            metric_value(
                "synapse_lite_replication_claims_refused_total",
                {"stream": "unknown", "reason": "bad_mac"},
            ),
            before + 4,
        )

    async def test_claims_for_another_writer_are_dropped(self) -> None:
        a, a_receiver = await self.started_bus("worker1")
        raw = await self.raw_redis()
        with self.assertLogs("synapse_lite.replication.claims", "WARNING") as logs:
            await raw.publish(a.channel, signed("worker2", b"POSITION events persister1 0 5"))
            await raw.publish(a.channel, signed("worker2", b"POSITION events worker2 0 5"))
            await wait_until(
                lambda: PositionCommand("events", "worker2", 0, 5) in a_receiver.commands,
                what="worker2's own claim",
            )
        self.assertIn("(wrong_sender): POSITION for writer persister1", logs.output[0])
        self.assertNotIn(PositionCommand("events", "persister1", 0, 5), a_receiver.commands)

    async def test_subscriber_reconnects_after_being_killed(self) -> None:
        a, a_receiver = await self.started_bus("worker1")
        b, b_receiver = await self.started_bus("worker2")

        def replicates_at_b() -> int:
            return b_receiver.commands.count(ReplicateCommand())

        await wait_until(lambda: replicates_at_b() >= 1, what="B's own REPLICATE")
        replicates_before = replicates_at_b()

        await self.kill(a, "sub")
        await wait_until(lambda: len(a_receiver.connections("new")) == 2, what="resubscription")
        self.assertEqual(
            [kind for kind, _, _ in a_receiver.events if kind != "command"][-3:],
            [
                "new",
                "lost",
                "new",
            ],
        )
        # A asks everyone for positions again, and hears B again.
        await wait_until(lambda: replicates_at_b() > replicates_before, what="A's REPLICATE")
        cmd = RemoteServerUpCommand("after.example")
        b.send_command(cmd)
        await wait_until(lambda: cmd in a_receiver.commands, what="delivery after reconnect")

    async def test_publishing_while_publisher_is_down_is_queued(self) -> None:
        a, a_receiver = await self.started_bus("worker1")
        _b, b_receiver = await self.started_bus("worker2")

        await self.kill(a, "pub")
        await wait_until(lambda: not a.publisher_connected, what="publisher loss")
        sent = [PositionCommand("events", "worker1", i, i + 1) for i in range(5)]
        for cmd in sent:
            a.send_command(cmd)
        self.assertEqual(a.pending_count, 5)

        await wait_until(
            lambda: all(cmd in b_receiver.commands for cmd in sent), what="queued delivery"
        )
        received = [c for c in b_receiver.commands if isinstance(c, PositionCommand)]
        self.assertEqual(received, sent)
        # Losing the publisher alone is not losing the bus.
        self.assertEqual(a_receiver.connections("lost"), [])

    async def test_overflow_drops_the_queue_and_resyncs(self) -> None:
        self.patch(redis_module, "MAX_PENDING_COMMANDS", 5)
        a, a_receiver = await self.started_bus("worker1")
        _b, b_receiver = await self.started_bus("worker2")
        await wait_until(
            lambda: ReplicateCommand() in b_receiver.commands, what="B's own REPLICATE"
        )
        replicates_before = b_receiver.commands.count(ReplicateCommand())

        await self.kill(a, "pub")
        await wait_until(lambda: not a.publisher_connected, what="publisher loss")
        with self.assertLogs(LOGGER, "ERROR"):
            for i in range(6):
                a.send_command(PositionCommand("events", "worker1", i, i + 1))
        # Announced lost at once; the queue is gone; what follows is dropped.
        self.assertEqual(a_receiver.connections("lost"), [a])
        self.assertEqual(a.pending_count, 0)
        a.send_command(PositionCommand("events", "worker1", 100, 101))
        self.assertEqual(a.pending_count, 0)

        # Once the publisher is back, the bus is announced anew (the handler
        # re-announces its positions) and asks everyone for theirs.
        await wait_until(lambda: len(a_receiver.connections("new")) == 2, what="re-announce")
        await wait_until(
            lambda: b_receiver.commands.count(ReplicateCommand()) > replicates_before,
            what="REPLICATE after the resync",
        )
        self.assertEqual([c for c in b_receiver.commands if isinstance(c, PositionCommand)], [])

    async def test_unencodable_command_is_dropped(self) -> None:
        bus, _ = await self.started_bus("worker1")
        with self.assertLogs(LOGGER, "ERROR"):
            bus.send_command(RdataCommand("events", "worker1", 1, ["x" * MAX_LINE_LENGTH]))
        self.assertEqual(bus.pending_count, 0)

    async def test_stop_loses_the_connection_once(self) -> None:
        bus, receiver = await self.started_bus("worker1")
        await bus.stop()
        self.assertEqual(receiver.connections("lost"), [bus])
        bus.send_command(ReplicateCommand())  # dropped, no error
        await bus.stop()
        self.assertEqual(receiver.connections("lost"), [bus])


class SilentRedisTestCase(unittest.TestCase):
    """A "Redis" that accepts connections and never answers (no Redis needed)."""

    async def test_silent_redis_is_dropped(self) -> None:
        open_connections: list[Protocol] = []
        lost: list[Protocol] = []

        class BlackHole(Protocol):
            def connectionMade(self) -> None:
                open_connections.append(self)

            def connectionLost(self, reason: Failure = connectionDone) -> None:
                open_connections.remove(self)
                lost.append(self)

        port = any_reactor.listenTCP(0, Factory.forProtocol(BlackHole), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        clock = task.Clock()
        receiver = RecordingReceiver()
        bus = RedisReplicationBus(
            server_name="silent.example",
            instance_name="worker1",
            receiver=receiver,
            endpoint=cast(Any, TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port)),
            clock=clock,
        )
        bus.start()
        self.addCleanup(bus.stop)
        await wait_until(
            lambda: len(open_connections) == 2 and bus.publisher_connected, what="connections"
        )
        # Nothing confirms the SUBSCRIBE: given up on after the timeout.
        with self.assertLogs(LOGGER, "WARNING"):
            clock.advance(redis_connections.KEEPALIVE_TIMEOUT_SECONDS)
        await wait_until(lambda: len(lost) == 1, what="the subscriber to be dropped")
        # The publisher's keepalive PING went out at that moment; no answer either.
        with self.assertLogs("synapse_lite.replication.tcp.redis_connections", "WARNING"):
            clock.advance(redis_connections.KEEPALIVE_TIMEOUT_SECONDS)
        await wait_until(lambda: len(lost) == 2, what="the publisher to be dropped")
        self.assertFalse(bus.publisher_connected)
        # Never subscribed, so never announced to the receiver.
        self.assertEqual(receiver.events, [])


class PromptParsingTestCase(unittest.TestCase):
    """A burst of pushed messages is parsed at once (txredisapi alone would
    take one reactor turn per message) and without recursing per message."""

    def test_burst_parsed_in_one_call_in_order(self) -> None:
        from synapse_lite.replication.tcp.redis_connections import SubscriberConnection

        received: list[object] = []

        class Owner:
            def message_received(self, conn: object, message: object) -> None:
                received.append(message)

            def read_started(self) -> None:
                received.append("read")

            def read_done(self) -> None:
                received.append("done")

        connection = SubscriberConnection()
        connection.owner = Owner()  # type: ignore[assignment]
        payloads = [f"RDATA events w {i} [1]".encode() for i in range(5000)]
        burst = b"".join(
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$%d\r\n%s\r\n" % (len(p), p) for p in payloads
        )
        # Split mid-message, as TCP may.
        connection.dataReceived(burst[:123_457])
        connection.dataReceived(burst[123_457:])
        # Each read's messages between read_started and read_done.
        self.assertEqual(received.count("read"), 2)
        self.assertEqual(received[0], "read")
        self.assertEqual(received[-1], "done")
        messages = [m for m in received if m not in ("read", "done")]
        self.assertEqual(messages, [p.decode() for p in payloads])
