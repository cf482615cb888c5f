"""Deleting rooms through the admin API (``DELETE /_synapse/admin/v{1,2}/
rooms/{roomId}``) and the deletions' status; a deletion interrupted by the
process stopping resumes in the next one and does each step once."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from synapse_lite.handlers.room_deletion import RoomDeletionHandler
from synapse_lite.storage.databases.main.admin_tasks import ACTIVE
from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually

ADMIN = "/_synapse/admin"


class AdminRoomDeletionTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        main = self.servers["main"]
        await main.store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        self.room = await self.bob.create_room(
            preset="public_chat", visibility="public", room_alias_name="doomed"
        )
        await self.eve.ok("POST", f"/join/{self.room}", {})
        self.message = await self.bob.send(self.room, "secret plans")

    async def status(self, delete_id: str) -> Any:
        return await self.alice.ok("GET", ADMIN + f"/v2/rooms/delete_status/{delete_id}")

    async def member_events(self, user_id: str | None) -> int:
        rows = await self.servers["main"].store.db_pool.select(
            "t",
            "SELECT COUNT(*) FROM events WHERE room_id = ? AND type = 'm.room.member'"
            " AND state_key = ?",
            self.room,
            user_id,
        )
        return int(rows[0][0])

    async def assert_deleted(self, shutdown: dict[str, Any]) -> None:
        self.assertEqual(
            shutdown,
            {
                "kicked_users": sorted([self.bob.user_id, self.eve.user_id]),
                "failed_to_kick_users": [],
                "local_aliases": ["#doomed:test.local"],
                "new_room_id": None,
            },
        )
        room = await self.alice.ok("GET", ADMIN + f"/v1/rooms/{q(self.room)}")
        self.assertEqual((room["joined_members"], room["public"]), (0, False))
        event = await self.servers["main"].store.get_event(self.message)
        assert event is not None
        self.assertEqual(event.content, {})
        code, _ = await self.eve.request("GET", "/directory/room/%23doomed:test.local")
        self.assertEqual(code, 404)

    async def test_delete_v2_with_status(self) -> None:
        body = await self.alice.ok("DELETE", ADMIN + f"/v2/rooms/{q(self.room)}", {"block": True})
        delete_id = body["delete_id"]

        async def complete() -> bool:
            return (await self.status(delete_id))["status"] == "complete"

        await eventually(complete, what="the deletion complete")
        status = await self.status(delete_id)
        await self.assert_deleted(status["shutdown_room"])
        by_room = await self.alice.ok("GET", ADMIN + f"/v2/rooms/{q(self.room)}/delete_status")
        self.assertEqual(by_room, {"results": [status]})
        # Blocked: nobody comes back.
        code, answer = await self.eve.request("POST", f"/join/{self.room}", {})
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))

    async def test_delete_v1_waits(self) -> None:
        body = await self.alice.ok("DELETE", ADMIN + f"/v1/rooms/{q(self.room)}", {})
        await self.assert_deleted(body)
        # Not blocked: a member may join again (the room is empty).
        await self.eve.ok("POST", f"/join/{self.room}", {})

    async def test_errors(self) -> None:
        room = q(self.room)
        refused: list[tuple[str, str, Any, int, str]] = [
            ("DELETE", f"/v2/rooms/{room}", {}, 403, "M_FORBIDDEN"),
            ("GET", f"/v2/rooms/{room}/delete_status", None, 403, "M_FORBIDDEN"),
        ]
        for method, path, content, code, errcode in refused:
            got, answer = await self.bob.request(method, ADMIN + path, content)
            self.assertEqual((got, answer["errcode"]), (code, errcode), path)
        refused = [
            ("DELETE", "/v2/rooms/!nope:test.local", {}, 404, "M_NOT_FOUND"),
            ("DELETE", "/v2/rooms/not-a-room", {}, 400, "M_INVALID_PARAM"),
            ("DELETE", f"/v2/rooms/{room}", {"block": "yes"}, 400, "M_BAD_JSON"),
            ("DELETE", f"/v2/rooms/{room}", {"new_room_user_id": "@a:x"}, 400, "M_INVALID_PARAM"),
            ("GET", f"/v2/rooms/{room}/delete_status", None, 404, "M_NOT_FOUND"),
            ("GET", "/v2/rooms/delete_status/nope", None, 404, "M_NOT_FOUND"),
        ]
        for method, path, content, code, errcode in refused:
            got, answer = await self.alice.request(method, ADMIN + path, content)
            self.assertEqual((got, answer["errcode"]), (code, errcode), (path, content))

    async def test_interrupted_deletion_resumes_once(self) -> None:
        main = self.servers["main"]
        handler = main.handlers.room_deletion
        real_leave = handler.leave
        left: list[str] = []
        dies_here: defer.Deferred[None] = defer.Deferred()

        async def leave(user_id: str, room_id: str) -> None:
            if left:
                # The second member: the process dies before they leave.
                left.append(user_id)
                await dies_here
            await real_leave(user_id, room_id)
            left.append(user_id)

        self.patch(handler, "leave", leave)
        body = await self.alice.ok("DELETE", ADMIN + f"/v2/rooms/{q(self.room)}", {})
        delete_id = body["delete_id"]
        await eventually(lambda: len(left) == 2, what="the second member reached")
        handler.stop()
        status = await self.status(delete_id)
        self.assertEqual(status["status"], ACTIVE)
        self.assertEqual(status["shutdown_room"]["kicked_users"], [self.bob.user_id])
        # While it is unfinished, a second deletion is refused.
        code, answer = await self.alice.request("DELETE", ADMIN + f"/v2/rooms/{q(self.room)}", {})
        self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"))
        # The next process (its handler on the same database) resumes it.
        restarted = RoomDeletionHandler(main.store, main.handlers.members, "test.local")
        restarted.start()
        self.addCleanup(restarted.stop)

        async def complete() -> bool:
            return (await self.status(delete_id))["status"] == "complete"

        await eventually(complete, what="the resumed deletion complete")
        await self.assert_deleted((await self.status(delete_id))["shutdown_room"])
        # Each member left once: a join and a leave each.
        self.assertEqual(await self.member_events(self.bob.user_id), 2)
        self.assertEqual(await self.member_events(self.eve.user_id), 2)


class AdminRoomDeletionDefaultLayoutTestCase(AdminRoomDeletionTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
