"""The admin API's room tools: a room's messages and an event's context as
an admin sees them (every event, member or not), ``make_room_admin`` and
``forward_extremities``."""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.task import deferLater

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ThreeUsersTestCase,
    q,
)

ADMIN = "/_synapse/admin/v1"


class AdminRoomToolsTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        # bob's private room: alice (the admin) is not in it.
        self.room = await self.bob.create_room(preset="private_chat", name="Secret")
        self.sent = [await self.bob.send(self.room, f"m{i}") for i in range(5)]
        # alice's process has read bob's sends (made through other processes).
        for _ in range(500):
            newest = await self.alice.ok("GET", ADMIN + f"/rooms/{q(self.room)}/messages?limit=1")
            if newest["chunk"] and newest["chunk"][0]["event_id"] == self.sent[-1]:
                break
            await deferLater(reactor, 0.01)
        else:
            self.fail("alice's process never read bob's messages")

    async def test_messages_and_context(self) -> None:
        page = await self.alice.ok("GET", ADMIN + f"/rooms/{q(self.room)}/messages?limit=3")
        self.assertEqual([e["content"].get("body") for e in page["chunk"]], ["m4", "m3", "m2"])
        rest = await self.alice.ok(
            "GET", ADMIN + f"/rooms/{q(self.room)}/messages?limit=50&from={q(page['end'])}"
        )
        bodies = [e["content"].get("body") for e in rest["chunk"] if e["type"] == "m.room.message"]
        self.assertEqual(bodies, ["m1", "m0"])
        forwards = await self.alice.ok(
            "GET", ADMIN + f"/rooms/{q(self.room)}/messages?dir=f&limit=1"
        )
        self.assertEqual(forwards["chunk"][0]["type"], "m.room.create")
        context = await self.alice.ok(
            "GET", ADMIN + f"/rooms/{q(self.room)}/context/{q(self.sent[2])}?limit=2"
        )
        self.assertEqual(context["event"]["content"]["body"], "m2")
        self.assertEqual(
            (
                context["events_before"][0]["content"]["body"],
                context["events_after"][0]["content"]["body"],
            ),
            ("m1", "m3"),
        )
        # Not an admin (eve is not in the room either): 403 from both.
        for path in (
            f"/rooms/{q(self.room)}/messages",
            f"/rooms/{q(self.room)}/context/{q(self.sent[0])}",
        ):
            code, body = await self.eve.request("GET", ADMIN + path)
            self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"), path)
        for path, code, errcode in [
            ("/rooms/!nope:test.local/messages", 404, "M_NOT_FOUND"),
            (f"/rooms/{q(self.room)}/messages?dir=sideways", 400, "M_INVALID_PARAM"),
            (f"/rooms/{q(self.room)}/messages?limit=-1", 400, None),
            (f"/rooms/{q(self.room)}/context/{q('$nope')}", 404, "M_NOT_FOUND"),
            ("/rooms/!nope:test.local/context/$x", 404, "M_NOT_FOUND"),
            ("/rooms/not-a-room/messages", 400, None),
        ]:
            got, body = await self.alice.request("GET", ADMIN + path)
            self.assertEqual(got, code, path)
            if errcode is not None:
                self.assertEqual(body["errcode"], errcode, path)

    async def test_make_room_admin(self) -> None:
        await self.alice.ok("POST", ADMIN + f"/rooms/{q(self.room)}/make_room_admin", {})
        levels = await self.bob.ok("GET", f"/rooms/{self.room}/state/m.room.power_levels")
        self.assertEqual(levels["users"][self.alice.user_id], 100)
        # Invited (the room is not public); alice joins and may now do what
        # its creator could.
        await self.alice.ok("POST", f"/join/{self.room}", {})
        await self.alice.ok("PUT", f"/rooms/{self.room}/state/m.room.name", {"name": "Mine"})
        # Again for another user by id: eve.
        await self.alice.ok(
            "POST",
            ADMIN + f"/rooms/{q(self.room)}/make_room_admin",
            {"user_id": self.eve.user_id},
        )
        levels = await self.bob.ok("GET", f"/rooms/{self.room}/state/m.room.power_levels")
        self.assertEqual(levels["users"][self.eve.user_id], 100)
        extremities = await self.alice.ok(
            "GET", ADMIN + f"/rooms/{q(self.room)}/forward_extremities"
        )
        self.assertEqual(extremities["count"], 1)
        newest = await self.alice.ok("GET", ADMIN + f"/rooms/{q(self.room)}/messages?limit=1")
        self.assertEqual(extremities["results"][0]["event_id"], newest["chunk"][0]["event_id"])
        self.assertEqual(
            set(extremities["results"][0]), {"event_id", "state_group", "depth", "received_ts"}
        )

    async def test_make_room_admin_errors(self) -> None:
        # A room nobody of this server can change any more: bob left it.
        empty = await self.bob.create_room(preset="private_chat")
        await self.bob.ok("POST", f"/rooms/{empty}/leave", {})
        path = ADMIN + "/rooms/{}/make_room_admin"
        for room, body, code, errcode in [
            (empty, {}, 400, "M_INVALID_PARAM"),
            ("!nope:test.local", {}, 404, "M_NOT_FOUND"),
            ("#nope:test.local", {}, 404, "M_NOT_FOUND"),
            (self.room, {"user_id": "@x:elsewhere"}, 400, "M_INVALID_PARAM"),
            (self.room, {"user_id": "@nobody:test.local"}, 404, "M_NOT_FOUND"),
            (self.room, {"user_id": 5}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request("POST", path.format(q(room)), body)
            self.assertEqual((got, answer["errcode"]), (code, errcode), (room, body))
        got, answer = await self.eve.request("POST", path.format(q(self.room)), {})
        self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"))
        got, answer = await self.eve.request(
            "GET", ADMIN + f"/rooms/{q(self.room)}/forward_extremities"
        )
        self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"))
        got, answer = await self.alice.request(
            "GET", ADMIN + "/rooms/!nope:test.local/forward_extremities"
        )
        self.assertEqual((got, answer["errcode"]), (404, "M_NOT_FOUND"))

    async def test_delete_forward_extremities(self) -> None:
        path = ADMIN + f"/rooms/{q(self.room)}/forward_extremities"
        # One extremity: nothing to delete.
        self.assertEqual(await self.alice.ok("DELETE", path), {"deleted": 0})
        # Two more, as a federated room gathers (rows made by hand: an
        # older event of the room named again).
        store = self.servers["main"].store
        for old in self.sent[1:3]:
            await store.db_pool.execute(
                "t",
                "INSERT INTO event_forward_extremities (room_id, event_id) VALUES (?, ?)",
                self.room,
                old,
            )
        self.assertEqual((await self.alice.ok("GET", path))["count"], 3)
        self.assertEqual(await self.alice.ok("DELETE", path), {"deleted": 2})
        left = await self.alice.ok("GET", path)
        self.assertEqual([r["event_id"] for r in left["results"]], [self.sent[-1]])
        # The writer forgot what it held: the next event names the one left.
        after = await self.bob.send(self.room, "after")
        edges = await store.get_event_edges([after])
        self.assertEqual(edges[after][0], [self.sent[-1]])
        code, body = await self.eve.request("DELETE", path)
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.alice.request(
            "DELETE", ADMIN + "/rooms/!nope:test.local/forward_extremities"
        )
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))

    async def test_timestamp_to_event(self) -> None:
        store = self.servers["main"].store
        events = await store.get_events(self.sent)
        ts = [events[e].origin_server_ts for e in self.sent]
        path = ADMIN + f"/rooms/{q(self.room)}/timestamp_to_event"
        found = await self.alice.ok("GET", path + f"?ts={ts[2]}&dir=f")
        self.assertEqual(found["origin_server_ts"], ts[2])
        self.assertEqual(set(found), {"event_id", "origin_server_ts"})
        # Backwards from the last send's time: the last send (or one as late).
        found = await self.alice.ok("GET", path + f"?ts={ts[-1]}&dir=b")
        self.assertEqual(found["origin_server_ts"], ts[-1])
        # Before the room: the create event going forwards, nothing backwards.
        first = await self.alice.ok("GET", path + "?ts=0")
        self.assertLessEqual(first["origin_server_ts"], ts[0])
        for query, code, errcode in [
            ("?ts=0&dir=b", 404, "M_NOT_FOUND"),
            (f"?ts={ts[-1] + 10**9}", 404, "M_NOT_FOUND"),
            ("", 400, "M_MISSING_PARAM"),
            ("?ts=soon", 400, "M_INVALID_PARAM"),
            ("?ts=1&dir=up", 400, "M_INVALID_PARAM"),
        ]:
            got, body = await self.alice.request("GET", path + query)
            self.assertEqual((got, body["errcode"]), (code, errcode), query)
        got, body = await self.eve.request("GET", path + "?ts=0")
        self.assertEqual((got, body["errcode"]), (403, "M_FORBIDDEN"))
        got, body = await self.alice.request(
            "GET", ADMIN + "/rooms/!nope:test.local/timestamp_to_event?ts=0"
        )
        self.assertEqual((got, body["errcode"]), (404, "M_NOT_FOUND"))


class AdminRoomToolsDefaultLayoutTestCase(AdminRoomToolsTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
