"""Version 12 rooms made here, over HTTP: the room id is the create event's
id, the creators' unlimited power, ``additional_creators`` (from
``creation_content``, a trusted private chat's invitees, an upgrade),
messages, state, /sync and /messages. On the monolith and on the default
layout (a /sync reader, two events writers: the room id chooses the
writer)."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually

HASHED_ROOM_ID = r"^![A-Za-z0-9_-]{43}$"


class MonolithRoomVersion12TestCase(ThreeUsersTestCase):
    """On the monolith."""

    async def timeline(self, user: ClientApi, room: str, until: str) -> list[dict[str, Any]]:
        """The room's events in ``user``'s initial sync, once it holds ``until``."""
        found: list[list[dict[str, Any]]] = []

        async def synced() -> bool:
            sync = await user.sync(filter='{"room":{"timeline":{"limit":100}}}')
            events = sync["rooms"]["join"].get(room, {}).get("timeline", {}).get("events", [])
            found[:] = [events]
            return any(e["event_id"] == until for e in events)

        await eventually(synced, what=f"{until} in {user.user_id}'s sync")
        return found[0]

    async def test_room_id_is_the_create_event_id(self) -> None:
        room = await self.alice.create_room(room_version="12", preset="public_chat", name="v12")
        self.assertRegex(room, HASHED_ROOM_ID)
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        message = await self.alice.send(room, "hello")
        events = await self.timeline(self.bob, room, message)
        create = events[0]
        self.assertEqual(create["type"], "m.room.create")
        self.assertEqual(create["event_id"], "$" + room[1:])
        self.assertEqual(create["content"], {"room_version": "12"})
        messages = await self.bob.ok("GET", f"/rooms/{q(room)}/messages?dir=b&limit=50")
        ids = [e["event_id"] for e in messages["chunk"]]
        self.assertEqual((ids[0], ids[-1]), (message, create["event_id"]))
        # The create event is no auth event (the room id names it).
        fetched = await self.alice.ok("GET", f"/rooms/{q(room)}/event/{q(message)}")
        self.assertEqual(fetched["content"]["body"], "hello")
        state = await self.bob.ok("GET", f"/rooms/{q(room)}/state/m.room.name")
        self.assertEqual(state, {"name": "v12"})
        # Two rooms, two ids.
        other = await self.alice.create_room(room_version="12")
        self.assertNotEqual(other, room)

    async def test_creators_have_unlimited_power(self) -> None:
        room = await self.alice.create_room(room_version="12", preset="public_chat")
        levels = await self.alice.ok("GET", f"/rooms/{q(room)}/state/m.room.power_levels")
        self.assertNotIn(self.alice.user_id, levels["users"])
        self.assertEqual(levels["events"]["m.room.tombstone"], 150)
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        # Alice, at no listed level, gives Bob 100 and sets state needing 100.
        raised = {**levels, "users": {self.bob.user_id: 100}}
        await self.alice.ok("PUT", f"/rooms/{q(room)}/state/m.room.power_levels", raised)
        await self.bob.ok("PUT", f"/rooms/{q(room)}/state/m.room.topic", {"topic": "t"})
        # Bob at 100 cannot kick a creator, nor list one in the levels.
        code, _ = await self.bob.request(
            "POST", f"/rooms/{q(room)}/kick", {"user_id": self.alice.user_id}
        )
        self.assertEqual(code, 403)
        listed = {**raised, "users": {self.bob.user_id: 100, self.alice.user_id: 1}}
        code, body = await self.alice.request(
            "PUT", f"/rooms/{q(room)}/state/m.room.power_levels", listed
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        # The creator can kick Bob at 100.
        await self.alice.ok("POST", f"/rooms/{q(room)}/kick", {"user_id": self.bob.user_id})
        code, body = await self.alice.request(
            "POST",
            "/createRoom",
            {
                "room_version": "12",
                "power_level_content_override": {"users": {self.alice.user_id: 100}},
            },
        )
        self.assertEqual(code, 403, body)

    async def test_additional_creators(self) -> None:
        room = await self.alice.create_room(
            room_version="12",
            preset="trusted_private_chat",
            invite=[self.bob.user_id],
            creation_content={"additional_creators": [self.eve.user_id, self.bob.user_id]},
        )
        create = await self.alice.ok("GET", f"/rooms/{q(room)}/state/m.room.create")
        self.assertEqual(
            create,
            {"room_version": "12", "additional_creators": [self.eve.user_id, self.bob.user_id]},
        )
        levels = await self.alice.ok("GET", f"/rooms/{q(room)}/state/m.room.power_levels")
        self.assertEqual(levels["users"], {})
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        # Bob, a creator, changes the power levels at once.
        await self.bob.ok(
            "PUT", f"/rooms/{q(room)}/state/m.room.power_levels", {**levels, "ban": 10}
        )
        for bad in ("@nope", [1], "x"):
            code, body = await self.alice.request(
                "POST",
                "/createRoom",
                {"room_version": "12", "creation_content": {"additional_creators": bad}},
            )
            self.assertEqual(code, 400, bad)
            self.assertIn("additional_creators", body["error"])
        # Before version 12 it is content like any other.
        room = await self.alice.create_room(
            room_version="11", creation_content={"additional_creators": [self.bob.user_id]}
        )
        create = await self.alice.ok("GET", f"/rooms/{q(room)}/state/m.room.create")
        self.assertEqual(create["additional_creators"], [self.bob.user_id])

    async def test_upgrade_to_12(self) -> None:
        old = await self.alice.create_room(room_version="10", preset="public_chat", name="old")
        await self.bob.ok("POST", f"/join/{q(old)}", {})
        answer = await self.alice.ok(
            "POST",
            f"/rooms/{q(old)}/upgrade",
            {"new_version": "12", "additional_creators": [self.bob.user_id]},
        )
        new = answer["replacement_room"]
        self.assertRegex(new, HASHED_ROOM_ID)
        create = await self.alice.ok("GET", f"/rooms/{q(new)}/state/m.room.create")
        self.assertEqual(
            create,
            {
                "room_version": "12",
                "additional_creators": [self.bob.user_id],
                "predecessor": {"room_id": old},
            },
        )
        tombstone = await self.alice.ok("GET", f"/rooms/{q(old)}/state/m.room.tombstone")
        self.assertEqual(tombstone["replacement_room"], new)
        levels = await self.alice.ok("GET", f"/rooms/{q(new)}/state/m.room.power_levels")
        self.assertNotIn(self.alice.user_id, levels["users"])
        self.assertNotIn(self.bob.user_id, levels["users"])
        name = await self.alice.ok("GET", f"/rooms/{q(new)}/state/m.room.name")
        self.assertEqual(name, {"name": "old"})
        await self.bob.ok("POST", f"/join/{q(new)}", {})
        message = await self.bob.send(new, "in the new room")
        events = await self.timeline(self.alice, new, message)
        self.assertEqual(events[0]["event_id"], "$" + new[1:])
        # And on from 12 to 12.
        again = await self.alice.ok("POST", f"/rooms/{q(new)}/upgrade", {"new_version": "12"})
        self.assertRegex(again["replacement_room"], HASHED_ROOM_ID)


class DefaultLayoutRoomVersion12TestCase(MonolithRoomVersion12TestCase):
    """The default layout: a /sync reader and two events writers."""

    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
