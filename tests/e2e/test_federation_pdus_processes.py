"""End to end: room events (PDUs) between two homeservers as real
processes, ``a.test`` (main process and a federation sender worker) and
``b.test`` (main process), each on its own database.

bob of b.test joins alice's room on a.test; then, in steps sharing the
servers:

* a's sender is killed (SIGKILL) while a transaction of alice's messages is
  in flight (b is paused: the PUT hangs). The restarted sender resumes at
  b.test's recorded position (``destinations.pdus_sent_upto``) and sends
  the same transaction again with the same id; b answers it from its
  record: each message reaches bob's /sync once.
* b is stopped during traffic, then started: every message sent meanwhile
  reaches bob, once, in order, without waiting out a's backoff (b's first
  request to a announces it: REMOTE_SERVER_UP).

PostgreSQL with Redis replication (a production layout; the scenario runs on
one engine: docs/testing.md, "Decisions").
"""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

from twisted.internet import reactor, task
from twisted.trial import unittest

from tests.e2e.test_federation_processes import MAIN_RESOURCES, SENDER, Server
from tests.harness.client_api import ClientApi
from tests.harness.databases import (
    END_TO_END,
    create_test_database,
    one_engine_only,
)
from tests.harness.processes import ServerProcesses, free_port, layout_config
from tests.harness.services import require_redis

#: Far longer than any step waits: only REMOTE_SERVER_UP can end a backoff in time.
BACKOFF_SECONDS = 120
DEADLINE_SECONDS = 45.0


class FederationPdusProcessesTestCase(unittest.TestCase):
    timeout = 300

    async def test_room_events_survive_a_killed_sender_and_a_stopped_peer(self) -> None:
        one_engine_only("postgres", END_TO_END)
        transport = "redis"
        require_redis()
        ports = {"a.test": free_port(), "b.test": free_port()}
        self.a = self.make_server("a.test", ports, transport, sender=True)
        self.b = self.make_server("b.test", ports, transport, sender=False)
        await self.a.processes.start()
        await self.b.processes.start()
        self.alice = await ClientApi(self, self.a.url()).register("alice")
        self.bob = await ClientApi(self, self.b.url()).register("bob")
        self.room_id = await self.alice.create_room(preset="public_chat")
        quoted = urllib.parse.quote(self.room_id)
        await self.bob.ok("POST", f"/join/{quoted}?server_name=a.test", {})
        self.since = (await self.bob.sync())["next_batch"]
        await self.alice.send(self.room_id, "hello")
        self.assertEqual(await self.bob_receives(1), ["hello"])

        await self.step_sender_killed_mid_transaction()
        await self.step_peer_down_during_traffic()

    def make_server(self, name: str, ports: dict[str, int], transport: str, sender: bool) -> Server:
        db = create_test_database()
        self.addCleanup(db.drop)
        extra: dict[str, Any] = {"federation_sender": SENDER} if sender else {}
        config = layout_config(
            db,
            {SENDER: ["replication", "health"]} if sender else {},
            {},
            transport=transport,
            server_name=name,
            listeners=[{"port": ports[name], "resources": MAIN_RESOURCES}],
            federation={
                "destinations": {n: f"http://127.0.0.1:{p}" for n, p in ports.items()},
                "retry": {"initial_seconds": BACKOFF_SECONDS, "max_seconds": BACKOFF_SECONDS},
                "request_timeout_seconds": 30,
            },
            **extra,
        )
        return Server(name, db, ServerProcesses(self, config))

    async def bob_receives(self, count: int) -> list[str]:
        """The next ``count`` messages in bob's timeline; then check no more
        (a duplicate) follow."""
        deadline = time.monotonic() + DEADLINE_SECONDS
        bodies: list[str] = []
        since = self.since
        while len(bodies) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"bob got {bodies}, expected {count} messages")
            response = await self.bob.sync(since=since, timeout=1000)
            since = response["next_batch"]
            room = response.get("rooms", {}).get("join", {}).get(self.room_id, {})
            for event in room.get("timeline", {}).get("events", []):
                if event["type"] == "m.room.message":
                    bodies.append(event["content"]["body"])
        await task.deferLater(reactor, 1.0, lambda: None)  # a duplicate would show up by now
        again = await self.bob.sync(since=since)
        room = again.get("rooms", {}).get("join", {}).get(self.room_id, {})
        late = [e for e in room.get("timeline", {}).get("events", [])]
        self.assertEqual([e for e in late if e["type"] == "m.room.message"], [])
        self.since = again["next_batch"]
        return bodies

    async def wait_for(self, condition: Any, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await task.deferLater(reactor, 0.1, lambda: None)

    def transactions_to_b(self) -> list[str]:
        return re.findall(r"Sending transaction (\S+) to b\.test: [1-9]", self.a.log(SENDER))

    async def step_sender_killed_mid_transaction(self) -> None:
        self.b.processes.pause("main")  # b stops reading: a's PUT hangs
        resumed = False
        try:
            mark = len(self.transactions_to_b())
            # All three in one transaction: the sender takes them together.
            self.a.processes.pause(SENDER)
            try:
                for i in range(3):
                    await self.alice.send(self.room_id, f"killed {i}")
            finally:
                self.a.processes.resume(SENDER)
            await self.wait_for(
                lambda: len(self.transactions_to_b()) > mark, "a's sender to send a transaction"
            )
            await task.deferLater(reactor, 0.5, lambda: None)
            in_flight = self.transactions_to_b()[mark:]
            await self.a.processes.kill(SENDER)
            self.b.processes.resume("main")
            resumed = True
            await self.a.processes.start(SENDER)
        finally:
            if not resumed:
                self.b.processes.resume("main")
        got = await self.bob_receives(3)
        self.assertEqual(got, ["killed 0", "killed 1", "killed 2"])
        # The restarted sender's first transaction to b is the one in flight
        # when it was killed, with the same id.
        again = self.transactions_to_b()[mark + len(in_flight) :]
        self.assertTrue(again, "no transaction after the restart")
        self.assertEqual(in_flight, again[:1])
        # b applied it once (the second copy was answered from its record).
        received = f"Received transaction {in_flight[0]} from a.test"
        self.assertEqual(self.b.log("main").count(received), 1)
        sent = self.a.query("SELECT pdus_sent_upto FROM destinations WHERE destination = 'b.test'")
        self.assertIsNotNone(sent[0][0])

    async def step_peer_down_during_traffic(self) -> None:
        await self.b.processes.stop("main")
        for i in range(8):
            await self.alice.send(self.room_id, f"while down {i}")
        await self.wait_for(
            lambda: (
                self.a.query("SELECT retry_interval FROM destinations WHERE destination = 'b.test'")
                == [(BACKOFF_SECONDS * 1000,)]
            ),
            "a to back off from b",
        )
        await self.b.processes.start()
        started = time.monotonic()
        # b's first request to a announces it is up (REMOTE_SERVER_UP).
        await self.bob.ok(
            "PUT",
            "/sendToDevice/m.test/up1",
            {"messages": {"@alice:a.test": {"*": {"hello": "from b"}}}},
        )
        got = await self.bob_receives(8)
        self.assertEqual(got, [f"while down {i}" for i in range(8)])
        self.assertLess(time.monotonic() - started, BACKOFF_SECONDS / 2)
