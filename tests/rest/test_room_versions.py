"""Rooms of every version over HTTP: created with ``room_version``, their
events' ids and shapes, the rules that differ, redactions served by each
version's algorithm, and ``/capabilities``. On the monolith and on the
default layout (a /sync reader, two events writers), each user on another
process."""

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
from tests.harness.spec import assert_spec_response

ALL_VERSIONS = [str(n) for n in range(1, 13)]
#: Event ids by version: ``$random:server``, standard base64, URL-safe base64.
ID_FORMATS = {
    **dict.fromkeys(("1", "2"), r"^\$[A-Za-z0-9_-]+:test\.local$"),
    "3": r"^\$[A-Za-z0-9+/]{43}$",
    **{str(n): r"^\$[A-Za-z0-9_-]{43}$" for n in range(4, 13)},
}


class MonolithRoomVersionsTestCase(ThreeUsersTestCase):
    """On the monolith."""

    async def timeline_of(self, user: ClientApi, room: str, until: str) -> list[dict[str, Any]]:
        """The room's timeline in ``user``'s initial sync, once it holds the
        event ``until`` (a /sync reader may be a moment behind)."""
        found: list[list[dict[str, Any]]] = []

        async def synced() -> bool:
            sync = await user.sync(filter='{"room":{"timeline":{"limit":100}}}')
            events = sync["rooms"]["join"].get(room, {}).get("timeline", {}).get("events", [])
            found[:] = [events]
            return any(e["event_id"] == until for e in events)

        await eventually(synced, what=f"{until} in {user.user_id}'s sync")
        return found[0]

    async def test_every_version(self) -> None:
        for version in ALL_VERSIONS:
            room = await self.alice.create_room(room_version=version, preset="public_chat")
            await self.bob.ok("POST", f"/join/{q(room)}", {})
            message = await self.alice.send(room, f"hello v{version}")
            self.assertRegex(message, ID_FORMATS[version])
            events = await self.timeline_of(self.bob, room, message)
            create = events[0]
            self.assertEqual(create["type"], "m.room.create")
            self.assertEqual(create["content"]["room_version"], version)
            # Versions 1-10 name the creator; from 11 the sender is the creator.
            self.assertEqual("creator" in create["content"], int(version) <= 10)
            self.assertEqual(create["sender"], self.alice.user_id)
            for event in events:
                self.assertRegex(event["event_id"], ID_FORMATS[version])
            self.assertEqual(events[-1]["content"]["body"], f"hello v{version}")
            # Ids are unique within the room even for identical events.
            twins = {await self.alice.send(room, "same", txn_id=f"t{i}") for i in range(3)}
            self.assertEqual(len(twins), 3)
            fetched = await self.alice.ok("GET", f"/rooms/{q(room)}/event/{q(message)}")
            assert_spec_response(
                self, "rooms.yaml", "/rooms/{roomId}/event/{eventId}", "GET", 200, fetched
            )

    async def test_create_room_refuses_bad_versions(self) -> None:
        for value, errcode in (
            (1, "M_BAD_JSON"),
            (["10"], "M_BAD_JSON"),
            ("agjkyhdsghkjackljkj", "M_UNSUPPORTED_ROOM_VERSION"),
            ("13", "M_UNSUPPORTED_ROOM_VERSION"),
        ):
            code, body = await self.alice.request("POST", "/createRoom", {"room_version": value})
            self.assertEqual((code, body["errcode"]), (400, errcode), value)
        # creation_content cannot choose the version (nor, in 11, a creator).
        room = await self.alice.create_room(
            creation_content={"room_version": "test", "creator": "@x:test.local", "a": 1}
        )
        create = await self.alice.ok("GET", f"/rooms/{q(room)}/state/m.room.create")
        self.assertEqual(create, {"room_version": "10", "creator": self.alice.user_id, "a": 1})
        room = await self.alice.create_room(
            room_version="11", creation_content={"creator": "@x:test.local"}
        )
        create = await self.alice.ok("GET", f"/rooms/{q(room)}/state/m.room.create")
        self.assertEqual(create, {"room_version": "11"})

    async def test_capabilities(self) -> None:
        body = await self.bob.ok("GET", "/capabilities")
        assert_spec_response(self, "capabilities.yaml", "/capabilities", "GET", 200, body)
        versions = body["capabilities"]["m.room_versions"]
        self.assertEqual(versions["default"], "10")
        self.assertEqual(versions["available"], dict.fromkeys(ALL_VERSIONS, "stable"))

    async def test_redactions_by_version(self) -> None:
        """Each version's redaction algorithm, where the events are served,
        and the redaction event's ``redacts`` in both places."""
        me = {str(self.alice.user_id): 100}
        kept_levels: dict[str, Any]
        for version, kept_levels in (
            ("7", {"ban": 50, "users": me}),
            ("11", {"ban": 50, "users": me, "invite": 0}),
        ):
            room = await self.alice.create_room(
                room_version=version,
                power_level_content_override={
                    "users": me,
                    "invite": 0,
                    "ban": 50,
                    "notifications": {"room": 50},
                },
            )
            levels_id = (
                await self.alice.ok(
                    "GET", f"/rooms/{q(room)}/state/m.room.power_levels?format=event"
                )
            )["event_id"]
            answer = await self.alice.ok(
                "PUT", f"/rooms/{q(room)}/redact/{q(levels_id)}/r{version}", {"reason": "x"}
            )
            events = await self.timeline_of(self.alice, room, answer["event_id"])
            by_id = {e["event_id"]: e for e in events}
            levels = by_id[levels_id]["content"]
            self.assertEqual(
                {k: v for k, v in levels.items() if k in ("ban", "users", "invite")},
                kept_levels,
            )
            # What no version keeps is gone.
            self.assertNotIn("notifications", levels)
            redaction = by_id[answer["event_id"]]
            self.assertEqual(redaction["redacts"], levels_id)
            self.assertEqual(redaction["content"], {"reason": "x", "redacts": levels_id})
            state = await self.alice.ok("GET", f"/rooms/{q(room)}/state/m.room.power_levels")
            self.assertEqual(state, levels)

    async def test_string_power_levels_until_version_10(self) -> None:
        for version, code in (("9", 200), ("10", 400)):
            room = await self.alice.create_room(room_version=version)
            levels = await self.alice.ok("GET", f"/rooms/{q(room)}/state/m.room.power_levels")
            levels["users"][self.bob.user_id] = "50"
            status, body = await self.alice.request(
                "PUT", f"/rooms/{q(room)}/state/m.room.power_levels", levels
            )
            self.assertEqual(status, code, body)
            if code == 400:
                self.assertEqual(body["errcode"], "M_BAD_JSON")
        code, body = await self.alice.request(
            "POST",
            "/createRoom",
            {"room_version": "10", "power_level_content_override": {"ban": "50"}},
        )
        self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"))
        room = await self.alice.create_room(
            room_version="9", preset="public_chat", power_level_content_override={"ban": "50"}
        )
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        # Bob (0) cannot ban: the level "50" reads as 50.
        code, _ = await self.bob.request(
            "POST", f"/rooms/{q(room)}/ban", {"user_id": self.alice.user_id}
        )
        self.assertEqual(code, 403)

    async def test_canonical_json_from_version_6(self) -> None:
        for content in ({"x": 2**70}, {"x": 1.5}):
            body = {"room_version": "6", "creation_content": content}
            code, answer = await self.alice.request("POST", "/createRoom", body)
            self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"))
            body = {"room_version": "5", "creation_content": content}
            await self.alice.ok("POST", "/createRoom", body)
        for version, code in (("5", 200), ("6", 400)):
            room = await self.alice.create_room(room_version=version)
            status, body = await self.alice.request(
                "PUT", f"/rooms/{q(room)}/send/m.room.message/f{version}", {"body": "x", "n": 1.5}
            )
            self.assertEqual(status, code, body)
            status, _ = await self.alice.request(
                "PUT", f"/rooms/{q(room)}/send/m.room.message/i{version}", {"body": "x", "n": 2**60}
            )
            self.assertEqual(status, code)


class DefaultLayoutRoomVersionsTestCase(MonolithRoomVersionsTestCase):
    """The default layout: a /sync reader and two events writers."""

    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
