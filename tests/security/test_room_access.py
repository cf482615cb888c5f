"""What a user with a valid access token still cannot reach: a room they are
not in (read, send, its typing and receipts), and another user's to-device
messages and account data. One test per property; each also shows that a
member (or the owner) does get what the stranger is refused, so the refusal
is about who asks.

Related, older checks: tests/rest/test_rooms.py (strangers and leavers on a
public room's /messages, /state, /members; non-members sending) and
tests/rest/test_sync.py (reading another user's account data).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from tests.harness.client_api import ThreeUsersTestCase


class RoomAccessTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        # Invite-only, bob a member; eve has a valid token and nothing else.
        self.room = await self.alice.create_room(preset="private_chat", invite=[self.bob.user_id])
        await self.bob.ok("POST", f"/join/{self.room}", {})
        self.event_id = await self.alice.send(self.room, "members only")

    async def assert_forbidden(self, method: str, path: str, body: Any = None) -> None:
        code, answer = await self.eve.request(method, path, body)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), f"{method} {path}")
        code, _ = await self.bob.request(method, path, body)
        self.assertEqual(code, 200, f"a member's {method} {path}")

    async def test_stranger_cannot_read_messages(self) -> None:
        await self.assert_forbidden("GET", f"/rooms/{self.room}/messages?dir=b")
        await self.assert_forbidden("GET", f"/rooms/{self.room}/messages?dir=f&from=s0")

    async def test_stranger_cannot_read_state(self) -> None:
        await self.assert_forbidden("GET", f"/rooms/{self.room}/state")
        await self.assert_forbidden("GET", f"/rooms/{self.room}/state/m.room.join_rules")
        await self.assert_forbidden(
            "GET", f"/rooms/{self.room}/state/m.room.member/@bob:test.local"
        )

    async def test_stranger_cannot_read_members(self) -> None:
        await self.assert_forbidden("GET", f"/rooms/{self.room}/members")
        await self.assert_forbidden("GET", f"/rooms/{self.room}/joined_members")

    async def test_stranger_cannot_read_an_event(self) -> None:
        """``/event`` and ``/relations`` answer a stranger the spec's 404 (the
        same as for an event that does not exist), ``/context`` and
        ``/threads`` a 403 (as for the room's other reads); a member gets the
        event."""
        event = urllib.parse.quote(self.event_id, safe="")
        paths = [
            f"/rooms/{self.room}/event/{event}",
            f"/_matrix/client/v1/rooms/{self.room}/relations/{event}",
        ]
        for path in paths:
            code, answer = await self.eve.request("GET", path)
            self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"), path)
            code, _ = await self.bob.request("GET", path)
            self.assertEqual(code, 200, f"a member's GET {path}")
        await self.assert_forbidden("GET", f"/rooms/{self.room}/context/{event}")
        await self.assert_forbidden("GET", f"/_matrix/client/v1/rooms/{self.room}/threads")

    async def test_stranger_cannot_send_to_the_room(self) -> None:
        before = await self.bob.ok("GET", f"/rooms/{self.room}/messages?dir=b&limit=100")
        room = f"/rooms/{self.room}"
        for method, path, body in [
            ("PUT", f"{room}/send/m.room.message/e1", {"msgtype": "m.text", "body": "hi"}),
            ("PUT", f"{room}/state/m.room.topic", {"topic": "eve was here"}),
            ("PUT", f"{room}/state/m.room.member/{self.eve.user_id}", {"membership": "join"}),
            ("POST", f"/join/{self.room}", {}),
            ("POST", f"{room}/invite", {"user_id": self.alice.user_id}),
            ("PUT", f"{room}/typing/{self.eve.user_id}", {"typing": True, "timeout": 5000}),
            ("POST", f"{room}/receipt/m.read/{self.event_id}", {}),
            ("POST", f"{room}/read_markers", {"m.fully_read": self.event_id}),
        ]:
            code, answer = await self.eve.request(method, path, body)
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), path)
        after = await self.bob.ok("GET", f"/rooms/{self.room}/messages?dir=b&limit=100")
        ids = [[e["event_id"] for e in page["chunk"]] for page in (before, after)]
        self.assertEqual(ids[1], ids[0])

    async def test_strangers_sync_has_no_typing_or_receipts(self) -> None:
        eve_start = await self.eve.sync()
        alice_start = await self.alice.sync()
        await self.bob.ok(
            "PUT",
            f"/rooms/{self.room}/typing/{self.bob.user_id}",
            {"typing": True, "timeout": 9000},
        )
        await self.bob.ok("POST", f"/rooms/{self.room}/receipt/m.read/{self.event_id}", {})
        # A member sees both; eve's syncs (incremental and initial) show
        # neither the room nor any ephemeral event.
        seen = await self.alice.sync(since=alice_start["next_batch"])
        types = {e["type"] for e in seen["rooms"]["join"][self.room]["ephemeral"]["events"]}
        self.assertEqual(types, {"m.typing", "m.receipt"})
        for sync in (await self.eve.sync(since=eve_start["next_batch"]), await self.eve.sync()):
            self.assertNotIn(self.room, str(sync))
            self.assertNotIn(self.event_id, str(sync))
            self.assertNotIn("m.typing", str(sync))
            self.assertNotIn("m.receipt", str(sync))

    async def test_other_users_to_device_messages_are_not_readable(self) -> None:
        eve_start = await self.eve.sync()
        bob_start = await self.bob.sync()
        messages = {self.bob.user_id: {"*": {"for": "bob only"}}}
        await self.alice.ok("PUT", "/sendToDevice/m.secret/t1", {"messages": messages})
        eve_sync = await self.eve.sync(since=eve_start["next_batch"])
        self.assertEqual(eve_sync.get("to_device", {}).get("events", []), [])
        self.assertNotIn("bob only", str(await self.eve.sync()))
        # Eve's syncs did not consume bob's message either.
        bob_sync = await self.bob.sync(since=bob_start["next_batch"])
        contents = [e["content"] for e in bob_sync["to_device"]["events"]]
        self.assertEqual(contents, [{"for": "bob only"}])

    async def test_other_users_account_data_is_not_readable(self) -> None:
        bob = self.bob.user_id
        await self.bob.ok("PUT", f"/user/{bob}/account_data/org.secret", {"pin": 1234})
        await self.bob.ok(
            "PUT", f"/user/{bob}/rooms/{self.room}/account_data/org.secret", {"pin": 5678}
        )
        for path in (
            f"/user/{bob}/account_data/org.secret",
            f"/user/{bob}/rooms/{self.room}/account_data/org.secret",
        ):
            await self.assert_forbidden("GET", path)
            code, answer = await self.eve.request("PUT", path, {"pin": 0})
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), path)
        self.assertNotIn("org.secret", str(await self.eve.sync()))
        self.assertEqual(
            await self.bob.ok("GET", f"/user/{bob}/account_data/org.secret"), {"pin": 1234}
        )
