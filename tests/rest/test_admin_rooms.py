"""The admin API's rooms: ``GET /_synapse/admin/v1/rooms[/{roomId}[/members|/state]]``,
on one process and in the default layout."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ThreeUsersTestCase,
    q,
)

ADMIN = "/_synapse/admin"


class AdminRoomsTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        self.lounge = await self.bob.create_room(
            preset="public_chat", name="Lounge", visibility="public"
        )
        self.attic = await self.eve.create_room(name="attic", topic="dusty")
        await self.eve.ok("POST", f"/join/{self.lounge}", {})

    async def admin_ok(self, path: str) -> Any:
        return await self.alice.ok("GET", ADMIN + path)

    async def test_only_admins(self) -> None:
        for path in [
            "/v1/rooms",
            f"/v1/rooms/{q(self.lounge)}",
            f"/v1/rooms/{q(self.lounge)}/state",
        ]:
            code, body = await self.bob.request("GET", ADMIN + path)
            self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"), path)

    async def test_list_rooms(self) -> None:
        body = await self.admin_ok("/v1/rooms")
        self.assertEqual(body["total_rooms"], 2)
        self.assertEqual(body["offset"], 0)
        self.assertNotIn("next_batch", body)
        # By name, case-folded: attic before Lounge.
        self.assertEqual([r["name"] for r in body["rooms"]], ["attic", "Lounge"])
        lounge = body["rooms"][1]
        self.assertEqual(
            (lounge["joined_members"], lounge["joined_local_members"], lounge["creator"]),
            (2, 2, self.bob.user_id),
        )
        self.assertEqual((lounge["public"], lounge["join_rules"]), (True, "public"))
        self.assertNotIn("topic", lounge)
        by_members = await self.admin_ok("/v1/rooms?order_by=joined_members&dir=b&limit=1")
        self.assertEqual([r["room_id"] for r in by_members["rooms"]], [self.lounge])
        self.assertEqual(by_members["next_batch"], 1)
        second = await self.admin_ok("/v1/rooms?order_by=joined_members&dir=b&from=1")
        self.assertEqual([r["room_id"] for r in second["rooms"]], [self.attic])
        self.assertEqual(second["prev_batch"], 0)
        found = await self.admin_ok("/v1/rooms?search_term=LOUN")
        self.assertEqual([r["room_id"] for r in found["rooms"]], [self.lounge])
        public = await self.admin_ok("/v1/rooms?public_rooms=false")
        self.assertEqual([r["room_id"] for r in public["rooms"]], [self.attic])
        for query in ["order_by=topic", "dir=x", "limit=0", "public_rooms=1"]:
            code, answer = await self.alice.request("GET", ADMIN + "/v1/rooms?" + query)
            self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"), query)

    async def test_room_details(self) -> None:
        room = await self.admin_ok(f"/v1/rooms/{q(self.attic)}")
        self.assertEqual((room["name"], room["topic"]), ("attic", "dusty"))
        self.assertEqual((room["joined_members"], room["version"]), (1, room["version"]))
        members = await self.admin_ok(f"/v1/rooms/{q(self.lounge)}/members")
        self.assertEqual(
            members, {"members": sorted([self.bob.user_id, self.eve.user_id]), "total": 2}
        )
        state = await self.admin_ok(f"/v1/rooms/{q(self.attic)}/state")
        types = {e["type"] for e in state["state"]}
        self.assertTrue({"m.room.create", "m.room.name", "m.room.topic"} <= types, types)
        for path, code, errcode in [
            ("/v1/rooms/!nope:test.local", 404, "M_NOT_FOUND"),
            ("/v1/rooms/!nope:test.local/members", 404, "M_NOT_FOUND"),
            ("/v1/rooms/!nope:test.local/state", 404, "M_NOT_FOUND"),
            ("/v1/rooms/not-a-room", 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request("GET", ADMIN + path)
            self.assertEqual((got, answer["errcode"]), (code, errcode), path)

    async def test_block(self) -> None:
        square = await self.eve.create_room(preset="public_chat")
        path = ADMIN + f"/v1/rooms/{q(square)}/block"
        self.assertEqual(await self.alice.ok("GET", path), {"block": False})
        self.assertEqual(await self.alice.ok("PUT", path, {"block": True}), {"block": True})
        self.assertEqual(
            await self.alice.ok("GET", path), {"block": True, "user_id": self.alice.user_id}
        )
        code, answer = await self.bob.request("POST", f"/join/{square}", {})
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
        await self.alice.ok("PUT", path, {"block": False})
        await self.bob.ok("POST", f"/join/{square}", {})
        for content, code, errcode in [({}, 400, "M_BAD_JSON"), ({"block": 1}, 400, "M_BAD_JSON")]:
            got, answer = await self.alice.request("PUT", path, content)
            self.assertEqual((got, answer["errcode"]), (code, errcode), content)
        got, answer = await self.bob.request("PUT", path, {"block": True})
        self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"))


class AdminRoomsDefaultLayoutTestCase(AdminRoomsTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
