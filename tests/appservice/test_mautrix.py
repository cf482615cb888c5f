"""End to end with a real application service framework: a bridge built on
mautrix-python (``mautrix_bridge.py``, its own process, asyncio and aiohttp)
against the homeserver on real sockets. Skipped without mautrix."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from twisted.internet import protocol, reactor

from synapse_lite.appservice.sender import ApplicationServiceSender
from tests.appservice.registrations import irc_registration, write_registrations
from tests.harness.client_api import ClientApi, q, start_cluster
from tests.harness.polling import eventually
from tests.harness.processes import free_port
from tests.harness.server import DatabaseTestCase

try:
    import mautrix  # noqa: F401

    HAVE_MAUTRIX = True
except ImportError:
    HAVE_MAUTRIX = False

SCRIPT = os.path.join(os.path.dirname(__file__), "mautrix_bridge.py")


class BridgeProcess(protocol.ProcessProtocol):
    """The bridge's stdout as parsed lines; commands to its stdin."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self._buffer = b""
        self.ended = False

    def outReceived(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip().startswith(b"{"):
                self.lines.append(json.loads(line))

    def processEnded(self, reason: Any) -> None:
        self.ended = True

    def command(self, line: str) -> None:
        assert self.transport is not None
        self.transport.write(line.encode() + b"\n")

    def seen(self, key: str) -> list[Any]:
        return [line[key] for line in self.lines if key in line]

    def bodies(self) -> list[str]:
        return [
            e["content"].get("body", "")
            for e in self.seen("event")
            if e["type"] == "m.room.message"
        ]


async def start_bridge(
    testcase: DatabaseTestCase | Any, hs_url: str, port: int, server_name: str = "test.local"
) -> BridgeProcess:
    """Run ``mautrix_bridge.py`` against ``hs_url``, listening on ``port``,
    until it says it is ready (its bot registered); killed at the test's
    cleanup."""
    bridge = BridgeProcess()
    any_reactor: Any = reactor
    argv = [sys.executable, SCRIPT, hs_url, str(port), server_name]
    transport = any_reactor.spawnProcess(bridge, sys.executable, argv, env=os.environ)

    def end() -> None:
        if not bridge.ended:
            transport.signalProcess("KILL")

    testcase.addCleanup(end)
    await eventually(lambda: bridge.seen("ready"), timeout=30, what="the bridge to start")
    return bridge


class MautrixBridgeTestCase(DatabaseTestCase):
    if not HAVE_MAUTRIX:
        skip = "mautrix is not installed (pip install mautrix)"

    async def test_bridge_round_trip(self) -> None:
        await self.round_trip()

    async def test_bridge_round_trip_sent_by_a_worker(self) -> None:
        """The same with the transactions sent by a worker of its own
        (``appservice_instances: [as1]``), the bridge talking to the main
        process."""
        servers = await self.round_trip(workers=["as1"], appservice_instances=["as1"])
        senders = [
            name
            for name, server in servers.items()
            if any(isinstance(loop, ApplicationServiceSender) for loop in server.loops._loops)
        ]
        self.assertEqual(senders, ["as1"])

    async def round_trip(self, workers: list[str] = [], **config: Any) -> dict[str, Any]:  # noqa: B006
        port = free_port()
        servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=workers,
            app_service_config_files=write_registrations(
                irc_registration(f"http://127.0.0.1:{port}")
            ),
            **config,
        )
        base = clients["main"].base_url
        bridge = await start_bridge(self, base, port)

        # The bridge's bot and a puppet join alice's room; the puppet speaks.
        alice = await ClientApi(self, base).register("alice")
        room_id = await alice.create_room(preset="public_chat")
        bridge.command(f"join {room_id}")
        await eventually(lambda: bridge.seen("sent") or bridge.seen("error"), timeout=10)
        self.assertEqual(bridge.seen("error"), [])
        messages = await alice.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=10")
        said = [(e["sender"], e["content"].get("body")) for e in messages["chunk"]]
        self.assertIn(("@_irc_puppet:test.local", "hi from irc"), said)

        # Alice's messages reach the bridge in transactions, in order.
        await alice.send(room_id, "hello bridge")
        await eventually(lambda: "hello bridge" in bridge.bodies(), timeout=10, what="delivery")

        # The bridge is down for a while: nothing is lost, nothing repeated.
        bridge.command("down")
        await eventually(lambda: bridge.seen("down"), timeout=10)
        for i in range(3):
            await alice.send(room_id, f"while down {i}")
        bridge.command("up")
        await eventually(lambda: bridge.seen("up"), timeout=10)
        await eventually(
            lambda: "while down 2" in bridge.bodies(), timeout=20, what="the missed messages"
        )
        self.assertEqual(
            [b for b in bridge.bodies() if b != "hi from irc"],
            ["hello bridge", "while down 0", "while down 1", "while down 2"],
        )

        # Queries: an unknown alias and user in the namespace are made by the bridge.
        answer = await alice.ok("GET", "/directory/room/" + q("#_irc_chan:test.local"))
        self.assertEqual(bridge.seen("made_alias")[0], "#_irc_chan:test.local")
        self.assertTrue(answer["room_id"].startswith("!"))
        await alice.ok("GET", "/profile/" + q("@_irc_ghost:test.local"))
        self.assertEqual(bridge.seen("made_user"), ["@_irc_ghost:test.local"])
        self.assertEqual(bridge.seen("error"), [])
        return servers
