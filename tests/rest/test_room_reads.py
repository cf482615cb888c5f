"""``GET /rooms/{roomId}/state/{eventType}/{stateKey}``: the content by
default, the whole event with ``?format=event``; member and power-level
events read like any other. Setting the same state twice is idempotent;
inviting yourself is refused."""

from __future__ import annotations

from tests.harness.client_api import ThreeUsersTestCase


class StateEventReadTestCase(ThreeUsersTestCase):
    async def test_member_and_power_levels_as_content_or_event(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        member_path = f"/rooms/{room}/state/m.room.member/{self.alice.user_id}"
        self.assertEqual((await self.alice.ok("GET", member_path))["membership"], "join")
        event = await self.alice.ok("GET", member_path + "?format=event")
        self.assertEqual(
            (event["type"], event["state_key"], event["sender"], event["room_id"]),
            ("m.room.member", self.alice.user_id, self.alice.user_id, room),
        )
        self.assertEqual(event["content"]["membership"], "join")
        self.assertTrue(event["event_id"].startswith("$"))
        levels = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.power_levels/")
        self.assertEqual(levels["users"][self.alice.user_id], 100)
        code, body = await self.alice.request("GET", member_path + "?format=xml")
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        code, body = await self.alice.request(
            "GET", f"/rooms/{room}/state/m.room.member/{self.bob.user_id}"
        )
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))


class StateWriteTestCase(ThreeUsersTestCase):
    async def test_same_state_twice_is_one_event(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        path = f"/rooms/{room}/state/org.example.state/"
        first = (await self.alice.ok("PUT", path, {"k": "v"}))["event_id"]
        self.assertEqual((await self.alice.ok("PUT", path, {"k": "v"}))["event_id"], first)
        changed = (await self.alice.ok("PUT", path, {"k": "w"}))["event_id"]
        self.assertNotEqual(changed, first)
        # The same content from someone else is a new event (a new sender).
        code, body = await self.bob.request("PUT", path, {"k": "w"})
        if code == 200:
            self.assertNotEqual(body["event_id"], changed)
        else:
            self.assertEqual(code, 403)
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=3")
        ids = [e["event_id"] for e in page["chunk"]]
        self.assertEqual(ids.count(first), 1)

    async def test_inviting_yourself_is_forbidden(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        code, body = await self.alice.request(
            "POST", f"/rooms/{room}/invite", {"user_id": self.alice.user_id}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))

    async def test_post_send_without_transaction_id(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        path = f"/rooms/{room}/send/m.room.message"
        body = {"msgtype": "m.text", "body": "no txn"}
        first = (await self.alice.ok("POST", path, body))["event_id"]
        second = (await self.alice.ok("POST", path, body))["event_id"]
        self.assertNotEqual(first, second)
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=2")
        self.assertEqual([e["event_id"] for e in page["chunk"]], [second, first])
        self.assertNotIn("transaction_id", page["chunk"][0]["unsigned"])
