"""End to end: real processes (main, a /sync worker, two event persisters, a
typing writer) driven over HTTP by a real Matrix client library (matrix-nio).

Runs on SQLite with TCP replication when the suite runs on SQLite, and on
PostgreSQL with Redis when it runs on PostgreSQL (``SYNAPSE_LITE_TEST_DB``),
so each CI run launches one layout once.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nio
import treq
from twisted.trial import unittest

from tests.harness.databases import create_test_database, test_engine_name
from tests.harness.matrix_client import NioRunner
from tests.harness.processes import (
    NO_KEEPALIVE,
    SPLIT_WORKERS,
    SPLIT_WRITERS,
    ServerProcesses,
    layout_config,
)
from tests.harness.services import require_redis

WORKERS = SPLIT_WORKERS
WRITERS = SPLIT_WRITERS
MESSAGES = 40
DEADLINE_SECONDS = 60.0
#: Above any backlog in these tests: a limited timeline would need /messages.
WIDE = {"room": {"timeline": {"limit": 500}}}


def room_events(response: Any, room_id: str) -> list[Any]:
    room = response.rooms.join.get(room_id)
    return list(room.timeline.events) if room else []


class ClientProcessesTestCase(unittest.TestCase):
    """One launched layout per class; the scenario steps share it."""

    timeout = 300
    engine = "sqlite"
    transport = "tcp"

    async def test_two_users_chat_across_processes(self) -> None:
        if test_engine_name() != self.engine:
            raise unittest.SkipTest(f"runs when SYNAPSE_LITE_TEST_DB={self.engine}")
        if self.transport == "redis":
            require_redis()
        self.test_db = create_test_database(self.engine)
        self.addCleanup(self.test_db.drop)
        config = layout_config(self.test_db, WORKERS, WRITERS, transport=self.transport)
        self.servers = ServerProcesses(self, config)
        await self.servers.start()
        self.runner = NioRunner()
        self.addCleanup(self.runner.close)
        await self.step_register()
        rooms = await self.step_rooms_on_both_persisters()
        await self.step_chat(rooms)
        await self.step_typing_receipts_presence(rooms[0])
        await self.step_to_device_and_account_data()
        await self.step_errors(rooms[0])

    # Steps

    async def step_register(self) -> None:
        main, sync1 = self.servers.url("main"), self.servers.url("sync1")
        self.alice = await self.runner.client(main, "@alice:test.local")
        response = await self.runner.run(self.alice.register("alice", "alice-password"))
        self.assertIsInstance(response, nio.RegisterResponse, response)
        # Bob registers on the worker (device and token made by the main process).
        self.bob = await self.runner.client(sync1, "@bob:test.local")
        response = await self.runner.run(self.bob.register("bob", "bob-password"))
        self.assertIsInstance(response, nio.RegisterResponse, response)
        # The same bob, logged in again, talking to the main process.
        self.bob_main = await self.runner.client(main, "@bob:test.local")
        response = await self.runner.run(self.bob_main.login("bob-password", "second"))
        self.assertIsInstance(response, nio.LoginResponse, response)

    async def step_rooms_on_both_persisters(self) -> list[str]:
        rooms: list[str] = []
        while len(rooms) < 4 or set(self.room_writers(rooms).values()) != set(WRITERS["events"]):
            response = await self.runner.run(
                self.alice.room_create(
                    name=f"room {len(rooms)}",
                    preset=nio.RoomPreset.public_chat,
                    invite=["@bob:test.local"],
                )
            )
            self.assertIsInstance(response, nio.RoomCreateResponse, response)
            rooms.append(response.room_id)
            joined = await self.runner.run(self.bob.join(response.room_id))
            self.assertIsInstance(joined, nio.JoinResponse, joined)
        return rooms

    def room_writers(self, rooms: list[str]) -> dict[str, str]:
        conn = self.test_db.make_engine().connect()
        try:
            cursor = conn.cursor()
            cursor.execute("SELECT room_id, event_writer FROM rooms")
            return {r: w for r, w in cursor.fetchall() if r in rooms}
        finally:
            conn.close()

    async def sync_until(self, clients: list[Any], since: str | None, found: Any) -> Any:
        """Long-poll (hopping between ``clients``, each on another process)
        until ``found(response)``; returns the last response."""
        deadline = time.monotonic() + DEADLINE_SECONDS
        turn = 0
        while time.monotonic() < deadline:
            client = clients[turn % len(clients)]
            turn += 1
            response = await self.runner.run(
                client.sync(timeout=5000, since=since, sync_filter=WIDE)
            )
            self.assertIsInstance(response, nio.SyncResponse, response)
            since = response.next_batch
            if found(response):
                return response
        raise AssertionError("the expected sync result never came")

    async def step_chat(self, rooms: list[str]) -> None:
        initial = await self.runner.run(self.bob.sync(timeout=0))
        since = initial.next_batch
        sent: dict[str, list[str]] = {room: [] for room in rooms}
        received: dict[str, list[str]] = {room: [] for room in rooms}
        for i in range(MESSAGES):
            sent[rooms[i % len(rooms)]].append(f"message {i}")

        async def send_all() -> None:
            # 4 concurrent senders; each room's messages in order.
            async def sender(room: str) -> None:
                for body in sent[room]:
                    response = await self.alice.room_send(
                        room, "m.room.message", {"msgtype": "m.text", "body": body}
                    )
                    assert isinstance(response, nio.RoomSendResponse), response

            await asyncio.gather(*(sender(room) for room in rooms))

        sending = self.runner.run(send_all())
        deadline = time.monotonic() + DEADLINE_SECONDS
        clients = [self.bob, self.bob_main]
        turn = 0
        while received != sent and time.monotonic() < deadline:
            # A token from one process used on the other must lose nothing.
            client = clients[turn % 2]
            turn += 1
            response = await self.runner.run(
                client.sync(timeout=3000, since=since, sync_filter=WIDE)
            )
            self.assertIsInstance(response, nio.SyncResponse, response)
            since = response.next_batch
            for room in rooms:
                for event in room_events(response, room):
                    if isinstance(event, nio.RoomMessageText):
                        received[room].append(event.body)
        await sending
        final = await self.runner.run(
            self.bob_main.sync(timeout=500, since=since, sync_filter=WIDE)
        )
        for room in rooms:
            received[room].extend(
                e.body for e in room_events(final, room) if isinstance(e, nio.RoomMessageText)
            )
        self.assertEqual(received, sent)  # every message exactly once, in order
        self.bob_since = final.next_batch
        self.last_event = (await self.runner.run(self.bob.room_messages(rooms[0]))).chunk[0]

    async def step_typing_receipts_presence(self, room: str) -> None:
        alice_since = (await self.runner.run(self.alice.sync(timeout=0))).next_batch
        typing = await self.runner.run(self.alice.room_typing(room, True, 10_000))
        self.assertIsInstance(typing, nio.RoomTypingResponse, typing)

        def alice_typing(response: Any) -> bool:
            joined = response.rooms.join.get(room)
            return bool(joined) and any(
                isinstance(e, nio.TypingNoticeEvent) and "@alice:test.local" in e.users
                for e in joined.ephemeral
            )

        response = await self.sync_until([self.bob], self.bob_since, alice_typing)
        self.bob_since = response.next_batch

        receipt = await self.runner.run(
            self.bob.update_receipt_marker(room, self.last_event.event_id)
        )
        self.assertIsInstance(receipt, nio.UpdateReceiptMarkerResponse, receipt)

        def bob_read(response: Any) -> bool:
            joined = response.rooms.join.get(room)
            return bool(joined) and any(
                isinstance(e, nio.ReceiptEvent)
                and any(r.user_id == "@bob:test.local" for r in e.receipts)
                for e in joined.ephemeral
            )

        await self.sync_until([self.alice], alice_since, bob_read)

        presence = await self.runner.run(self.alice.set_presence("unavailable", "busy"))
        self.assertIsInstance(presence, nio.PresenceSetResponse, presence)

        def alice_busy(response: Any) -> bool:
            return any(
                e.user_id == "@alice:test.local" and e.presence == "unavailable"
                for e in response.presence_events
            )

        response = await self.sync_until([self.bob, self.bob_main], self.bob_since, alice_busy)
        self.bob_since = response.next_batch

    async def step_to_device_and_account_data(self) -> None:
        message = nio.ToDeviceMessage(
            "org.example.ping", "@bob:test.local", self.bob.device_id, {"n": 1}
        )
        sent = await self.runner.run(self.alice.to_device(message))
        self.assertIsInstance(sent, nio.ToDeviceResponse, sent)

        def pinged(response: Any) -> bool:
            return any(
                getattr(e, "source", {}).get("content") == {"n": 1}
                for e in response.to_device_events
            )

        response = await self.sync_until([self.bob], self.bob_since, pinged)
        self.bob_since = response.next_batch

        code, _ = await self.http(
            "sync1",
            "PUT",
            "/user/@bob:test.local/account_data/org.example.settings",
            {"theme": "dark"},
            self.bob.access_token,
        )
        self.assertEqual(code, 200)

        def has_settings(response: Any) -> bool:
            return any(
                getattr(e, "type", None) == "org.example.settings"
                or getattr(e, "source", {}).get("type") == "org.example.settings"
                for e in response.account_data_events
            )

        await self.sync_until([self.bob_main], self.bob_since, has_settings)

    async def step_errors(self, room: str) -> None:
        for process in ("main", "sync1"):
            code, body = await self.http(
                process, "PUT", f"/rooms/{room}/send/m.room.message/t1", b"{not json",
                self.alice.access_token,
            )  # fmt: skip
            self.assertEqual((code, body["errcode"]), (400, "M_NOT_JSON"), process)
            code, body = await self.http(process, "GET", "/sync", None, "unknown-token")
            self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"), process)
        eve = await self.runner.client(self.servers.url("sync1"), "@eve:test.local")
        await self.runner.run(eve.register("eve", "eve-password"))
        response = await self.runner.run(eve.room_messages(room))
        self.assertIsInstance(response, nio.RoomMessagesError, response)
        self.assertEqual(response.status_code, "M_FORBIDDEN")

    async def http(
        self, process: str, method: str, path: str, body: Any, token: str
    ) -> tuple[int, Any]:
        data = (
            body
            if isinstance(body, bytes)
            else (None if body is None else json.dumps(body).encode())
        )
        headers: dict[bytes | str, list[bytes | str]] = {"Authorization": [f"Bearer {token}"]}
        response = await treq.request(
            method,
            self.servers.url(process) + "/_matrix/client/v3" + path,
            data=data,
            headers=headers,
            pool=NO_KEEPALIVE,
        )
        content = await treq.content(response)
        return response.code, json.loads(content)


class PostgresRedisClientProcessesTestCase(ClientProcessesTestCase):
    engine = "postgres"
    transport = "redis"
