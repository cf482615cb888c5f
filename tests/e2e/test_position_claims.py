"""End to end: real processes are told lies about stream positions, and a
retried to-device send meets a SIGKILLed writer.

The lies are well-formed replication lines: over TCP, sent on an
authenticated connection to the main process (the secret is known); over
Redis, published on the deployment's channel. None of them may move any
process's view (``/metrics``), reach ``stream_positions``, or stop a later
message from reaching an incremental /sync; every process must restart after
a SIGKILL; the refusals are counted (over TCP by the main process alone, which
relays no claim it refuses).

Runs on SQLite with TCP when the suite runs on SQLite, and on PostgreSQL with
Redis (and TCP) when it runs on PostgreSQL.
"""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Any

import treq
from twisted.internet import reactor, task
from twisted.trial import unittest

from synapse_lite.replication.tcp.redis import mac_key, signed_message
from synapse_lite.storage.database import make_startup_connection
from synapse_lite.tokens import MAX_TOKEN_POSITION
from tests.harness.client_api import ClientApi
from tests.harness.databases import create_test_database, test_engine_name
from tests.harness.processes import NO_KEEPALIVE, ServerProcesses, layout_config
from tests.harness.services import redis_address, require_redis

WORKERS = {
    "sync1": ["client", "replication", "health", "metrics"],
    "persister1": ["replication", "health", "metrics"],
    "persister2": ["replication", "health", "metrics"],
    "writer1": ["replication", "health", "metrics"],
}
WRITERS = {
    "events": ["persister1", "persister2"],
    "to_device": "writer1",
    "typing": "writer1",
    "account_data": "writer1",
    "receipts": "writer1",
    "presence": "writer1",
}
SECRET = "e2e-secret"
#: A row of the events stream as its writer sends it.
EVENT_ROW = [
    "ev",
    ["$fake", "!fake:test.local", "m.room.message", None, None, None, None, False, False, False],
]
_POSITION = re.compile(r'^synapse_lite_stream_position\{stream="([^"]+)",writer="([^"]+)"\} (\S+)$')
_REFUSED = re.compile(r"^synapse_lite_replication_claims_refused_total\{[^}]*\} (\S+)$")


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


def lies(events_head: int) -> list[str]:
    """Well-formed lines claiming what nobody allocated (and one writer that
    does not exist, and positions no token could carry)."""
    far = events_head + 1000
    return [
        f"POSITION events persister1 0 {far}",
        f"POSITION events persister2 0 {far}",
        f"RDATA events persister1 {far + 5} {json.dumps(EVENT_ROW)}",
        "POSITION events persister9 0 3",
        f"POSITION presence writer1 0 {2**63 - 1}",
        f"POSITION to_device writer1 0 {MAX_TOKEN_POSITION}",
        f"POSITION receipts writer1 0 {far}",
        # Typing of an older run (10^12 is run 1; every process starts at
        # its writer's run, 1 or more): taken for a restart until issue 34.
        "POSITION typing writer1 0 5",
    ]


def send_over_tcp(port: int, name: str, lines: list[str]) -> None:
    """Lines on an authenticated replication connection named ``name``."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        payload = [f"AUTH {SECRET}", f"NAME {name}", *lines]
        s.sendall(("\n".join(payload) + "\n").encode())
        time.sleep(0.5)


def publish_on_redis(channel: str, lines: list[str] | list[bytes]) -> None:
    """PUBLISH each line, speaking RESP on a plain socket."""
    host, port = redis_address()
    with socket.create_connection((host, port), timeout=5) as s:
        for line in lines:
            data = line.encode() if isinstance(line, str) else line
            parts = [b"PUBLISH", channel.encode(), data]
            command = b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
            s.sendall(command)
            s.recv(64)


class PositionClaimsTestCase(unittest.TestCase):
    timeout = 300
    engine = "sqlite"
    transport = "tcp"

    async def test_lies_move_nothing_and_retries_deliver_once(self) -> None:
        if test_engine_name() != self.engine:
            raise unittest.SkipTest(f"runs when SYNAPSE_LITE_TEST_DB={self.engine}")
        if self.transport == "redis":
            require_redis()
        self.test_db = create_test_database(self.engine)
        self.addCleanup(self.test_db.drop)
        config = layout_config(self.test_db, WORKERS, WRITERS, transport=self.transport)
        self.servers = ServerProcesses(self, config)
        await self.servers.start()

        alice = await ClientApi(self, self.servers.url("main")).register("alice")
        bob = await ClientApi(self, self.servers.url("sync1")).register("bob")
        room = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/rooms/{room}/join", {})
        await alice.send(room, "before")
        since = (await bob.sync())["next_batch"]

        head = max(p for (s, _), p in (await self.positions("main")).items() if s == "events")
        before = {name: await self.positions(name) for name in self.servers.processes}
        lines = lies(head)
        if self.transport == "tcp":
            port = config["replication"]["tcp"]["port"]
            send_over_tcp(port, "persister1", lines)
            send_over_tcp(port, "writer1", lines)
            # Not anyone's connection: every claim is the wrong sender's.
            send_over_tcp(port, "intruder", lines)
            # Issue 34: a second connection naming a live writer, with one
            # harmless POSITION at the writer's real position, made the main
            # process drop every row of the real writer (each send to its
            # rooms then waited 5 s). Refused now at NAME.
            for writer in ("persister1", "persister2"):
                real = (await self.positions("main")).get(("events", writer), 0)
                send_over_tcp(port, writer, [f"POSITION events {writer} {real} {real}"])
        else:
            channel = config["replication"]["redis"]["channel_prefix"] + "test.local"
            # Bare (refused for naming no sender); in the envelope but not
            # signed (refused: bad MAC, issue 34); then signed with the
            # secret, as a holder of it would, each in the name of the writer
            # it claims for (refused by the claim checks).
            deployment = self.deployment_id()
            publish_on_redis(channel, lines)
            publish_on_redis(
                channel, [f"@{deployment} {line.split(' ')[2]} 00 {line}" for line in lines]
            )
            key = mac_key(SECRET)
            publish_on_redis(
                channel,
                [
                    signed_message(key, deployment, line.split(" ")[2], line.encode())
                    for line in lines
                ],
            )
        await sleep(2)

        for name in self.servers.processes:
            after = await self.positions(name)
            self.assertNotIn(("events", "persister9"), after, name)
            for (stream, writer), position in after.items():
                self.assertLess(position, MAX_TOKEN_POSITION, (name, stream, writer))
                if stream == "events":
                    self.assertLessEqual(position, head, (name, stream, writer))
                if stream == "typing":
                    # Not reset by the lower position.
                    was_typing = before[name].get((stream, writer), 0)
                    self.assertGreaterEqual(position, was_typing, (name, stream, writer))
                # Real traffic meanwhile moves positions by a few, a lie by 1000.
                was = before[name].get((stream, writer), 0)
                self.assertLess(position, was + 500, (name, stream, writer))
        self.assertGreater(await self.refused("main"), 0)
        if self.transport == "tcp":
            # The main process checks before relaying: no lie reaches a worker.
            self.assertEqual(await self.refused("sync1"), 0)
        else:
            self.assertGreater(await self.refused("sync1"), 0)
        if self.transport == "tcp":
            # A worker of another deployment (it has the secret): refused and
            # reported by the main process's /health.
            send_over_tcp(config["replication"]["tcp"]["port"], "stranger @otherdeployment", [])
            response = await treq.get(
                self.servers.url("main", "health") + "/health", timeout=5, pool=NO_KEEPALIVE
            )
            health = json.loads(await treq.content(response))
            self.assertEqual(health["status"], "degraded", health)
            self.assertIn("deployment otherdeployment", health["reasons"][0])

        # A later message reaches an incremental /sync (the token parses),
        # and its send did not wait for the forwarded-write timeout (5 s).
        started = time.monotonic()
        await alice.send(room, "after")
        self.assertLess(time.monotonic() - started, 4.0)
        await self.sync_until(bob, since, lambda s: "after" in self.bodies(s, room))

        # A to-device send answered 200, its writer SIGKILLed and restarted,
        # the client's retry with the same txnId: delivered once.
        to_bob = {"messages": {bob.user_id: {bob.device_id: {"n": 1}}}}
        # The same for the other writes writer1 serves (account data,
        # receipts, presence), which are safe as upserts / state sets.
        to_device_since = (await bob.sync(since=since))["next_batch"]
        after_event = await alice.send(room, "receipted")
        settings = f"/user/{bob.user_id}/account_data/org.example.settings"
        receipt = f"/rooms/{room}/receipt/m.read/{after_event}"
        presence = f"/presence/{bob.user_id}/status"

        async def writes() -> None:
            await alice.ok("PUT", "/sendToDevice/org.example.ping/retry-1", to_bob)
            await bob.ok("PUT", settings, {"theme": "dark"})
            await bob.ok("POST", receipt, {})
            await bob.ok("PUT", presence, {"presence": "online", "status_msg": "here"})

        await writes()
        await self.servers.kill("writer1")
        await self.servers.start("writer1")
        await writes()
        await alice.ok("PUT", "/sendToDevice/org.example.ping/other-2", to_bob)
        synced = await self.sync_until(
            bob, to_device_since, lambda s: len(s.get("to_device", {}).get("events", [])) >= 2
        )
        self.assertEqual(len(synced["to_device"]["events"]), 2, synced["to_device"])
        account_data = [
            e
            for e in synced.get("account_data", {}).get("events", [])
            if e["type"] == "org.example.settings"
        ]
        self.assertEqual([e["content"] for e in account_data], [{"theme": "dark"}])
        stored = await self.count_rows(
            "SELECT COUNT(*) FROM receipts_linearized WHERE room_id = ? AND user_id = ?",
            room,
            bob.user_id,
        )
        self.assertEqual(stored, 1)

        # No lie reached stream_positions; every process restarts after SIGKILL.
        for name in reversed(list(self.servers.processes)):
            await self.servers.kill(name)
        self.assertEqual(self.stored_positions_beyond(head + 500), [])
        await self.servers.start()
        await alice.send(room, "after restart")
        await self.sync_until(bob, since, lambda s: "after restart" in self.bodies(s, room))

    # Helpers

    async def metrics(self, name: str) -> list[str]:
        response = await treq.get(
            self.servers.url(name, "metrics") + "/metrics", timeout=5, pool=NO_KEEPALIVE
        )
        return (await treq.content(response)).decode().splitlines()

    async def positions(self, name: str) -> dict[tuple[str, str], int]:
        found = {}
        for line in await self.metrics(name):
            match = _POSITION.match(line)
            if match:
                found[(match.group(1), match.group(2))] = int(float(match.group(3)))
        return found

    async def refused(self, name: str) -> float:
        total = 0.0
        for line in await self.metrics(name):
            match = _REFUSED.match(line)
            if match:
                total += float(match.group(1))
        return total

    async def count_rows(self, sql: str, *args: object) -> int:
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction() as txn:
                txn.execute(sql, args)
                row = txn.fetchone()
                return int(row[0]) if row else 0
        finally:
            conn.close()

    def deployment_id(self) -> str:
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction() as txn:
                txn.execute("SELECT deployment_id FROM deployment")
                row = txn.fetchone()
                assert row is not None
                return str(row[0])
        finally:
            conn.close()

    def stored_positions_beyond(self, limit: int) -> list[tuple[str, str, int]]:
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction() as txn:
                txn.execute(
                    "SELECT stream_name, instance_name, stream_id FROM stream_positions"
                    " WHERE stream_id > ? AND stream_name <> 'backfill'",
                    (limit,),
                )
                return [(r[0], r[1], int(r[2])) for r in txn.fetchall()]
        finally:
            conn.close()

    @staticmethod
    def bodies(sync: dict[str, Any], room: str) -> list[str]:
        joined = sync.get("rooms", {}).get("join", {}).get(room, {})
        return [e["content"].get("body") for e in joined.get("timeline", {}).get("events", [])]

    async def sync_until(self, client: ClientApi, since: str, done: Any) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while True:
            sync = await client.sync(since=since)
            if done(sync):
                return sync
            if time.monotonic() > deadline:
                raise AssertionError(f"not seen within 60 s: {sync}")
            await sleep(0.2)


class PostgresRedisPositionClaimsTestCase(PositionClaimsTestCase):
    engine = "postgres"
    transport = "redis"


class PostgresTcpPositionClaimsTestCase(PositionClaimsTestCase):
    engine = "postgres"
    transport = "tcp"


class TwoDeploymentsOnOneRedisTestCase(unittest.TestCase):
    """Two homeservers with the same server name on one Redis channel (no
    prefix to tell them apart): both keep working, each reports the other."""

    timeout = 300

    async def test_both_work_and_report_each_other(self) -> None:
        if test_engine_name() != "postgres":
            raise unittest.SkipTest("runs when SYNAPSE_LITE_TEST_DB=postgres")
        require_redis()
        workers = {"persister1": ["replication", "health"]}
        writers = {"events": ["persister1"]}
        deployments = []
        prefix = None
        for _ in range(2):
            test_db = create_test_database("postgres")
            self.addCleanup(test_db.drop)
            config = layout_config(test_db, workers, writers, transport="redis")
            # The same channel for both, as with no prefix at all.
            prefix = prefix or config["replication"]["redis"]["channel_prefix"]
            config["replication"]["redis"]["channel_prefix"] = prefix
            servers = ServerProcesses(self, config)
            await servers.start()
            deployments.append(servers)

        for servers in deployments:
            alice = await ClientApi(self, servers.url("main")).register("alice")
            room = await alice.create_room()
            since = (await alice.sync())["next_batch"]
            await alice.send(room, "hello")
            deadline = time.monotonic() + 30
            while True:
                sync = await alice.sync(since=since)
                timeline = sync.get("rooms", {}).get("join", {}).get(room, {}).get("timeline", {})
                if any(e["content"].get("body") == "hello" for e in timeline.get("events", [])):
                    break
                self.assertLess(time.monotonic(), deadline, "the message never reached /sync")
                await sleep(0.2)

        for servers in deployments:
            response = await treq.get(
                servers.url("main", "health") + "/health", timeout=5, pool=NO_KEEPALIVE
            )
            health = json.loads(await treq.content(response))
            self.assertEqual(health["status"], "degraded", health)
            self.assertIn("foreign replication traffic from deployment", health["reasons"][0])
