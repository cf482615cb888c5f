"""Knocking (``POST /knock/{roomIdOrAlias}``, the ``knock`` section of /sync)
and restricted rooms (``allow`` conditions, ``join_authorised_via_users_server``
filled in by the room's writer), over HTTP. On the monolith and on the default
layout, the users on different processes and the rooms on both events
writers."""

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


class MonolithKnockingTestCase(ThreeUsersTestCase):
    """On the monolith."""

    async def member(self, room: str, user: ClientApi, membership: str) -> dict[str, Any]:
        """``user``'s member event content in ``room``, as Alice reads it once
        it has ``membership`` (her process may be a moment behind the writer
        of a change made through another process)."""
        found: list[dict[str, Any]] = []

        async def arrived() -> bool:
            path = f"/rooms/{q(room)}/state/m.room.member/{q(user.user_id)}"
            code, content = await self.alice.request("GET", path)
            found[:] = [content]
            return code == 200 and content.get("membership") == membership

        await eventually(arrived, what=f"{user.user_id} {membership} in {room}")
        return found[0]

    async def sync_until(self, user: ClientApi, check: Any, since: str | None = None) -> Any:
        """``user``'s sync once ``check(sync)`` holds (a /sync reader may be
        a moment behind the writer)."""
        found: list[Any] = []

        async def synced() -> bool:
            sync = await user.sync(since=since)
            found[:] = [sync]
            return bool(check(sync))

        await eventually(synced, what=f"{user.user_id}'s sync")
        return found[0]

    async def test_knock_and_be_let_in(self) -> None:
        room = await self.alice.create_room(
            room_version="7", room_alias_name="door", name="Knock here"
        )
        await self.alice.ok(
            "PUT", f"/rooms/{q(room)}/state/m.room.join_rules", {"join_rule": "knock"}
        )
        code, body = await self.bob.request("POST", f"/join/{q(room)}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        before = (await self.bob.sync())["next_batch"]
        answer = await self.bob.ok(
            "POST", f"/knock/{q('#door:test.local')}?server_name=test.local", {"reason": "hi"}
        )
        assert_spec_response(self, "knocking.yaml", "/knock/{roomIdOrAlias}", "POST", 200, answer)
        self.assertEqual(answer, {"room_id": room})
        knock = await self.member(room, self.bob, "knock")
        self.assertEqual((knock["membership"], knock["reason"]), ("knock", "hi"))
        self.assertEqual(knock["displayname"], "bob")

        def knocking(sync: Any) -> Any:
            return sync["rooms"]["knock"].get(room)

        sync = await self.sync_until(self.bob, knocking, since=before)
        assert_spec_response(self, "sync.yaml", "/sync", "GET", 200, sync)
        stripped = {e["type"]: e for e in knocking(sync)["knock_state"]["events"]}
        self.assertEqual(stripped["m.room.name"]["content"], {"name": "Knock here"})
        self.assertEqual(stripped["m.room.join_rules"]["content"], {"join_rule": "knock"})
        self.assertEqual(stripped["m.room.member"]["content"]["membership"], "knock")
        self.assertNotIn(room, sync["rooms"]["join"])
        # Nothing new: the knock is not repeated in the next incremental sync.
        again = await self.bob.sync(since=sync["next_batch"])
        self.assertNotIn(room, again["rooms"]["knock"])
        # The room's members see the knock; one of them lets Bob in.
        members = await self.alice.ok("GET", f"/rooms/{q(room)}/members?membership=knock")
        self.assertEqual([e["state_key"] for e in members["chunk"]], [self.bob.user_id])
        await self.alice.ok("POST", f"/rooms/{q(room)}/invite", {"user_id": self.bob.user_id})
        invited = await self.sync_until(
            self.bob, lambda s: room in s["rooms"]["invite"], since=sync["next_batch"]
        )
        self.assertNotIn(room, invited["rooms"]["knock"])
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        await self.member(room, self.bob, "join")

    async def test_knocks_retracted_denied_and_refused(self) -> None:
        room = await self.alice.create_room(room_version="10")
        # Not a room that takes knocks (invite only), nor a public one.
        code, body = await self.bob.request("POST", f"/knock/{q(room)}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        public = await self.alice.create_room(room_version="10", preset="public_chat")
        code, _ = await self.bob.request("POST", f"/knock/{q(public)}", {})
        self.assertEqual(code, 403)
        await self.alice.ok(
            "PUT", f"/rooms/{q(room)}/state/m.room.join_rules", {"join_rule": "knock_restricted"}
        )
        await self.bob.ok("POST", f"/knock/{q(room)}", {})
        await self.bob.ok("POST", f"/rooms/{q(room)}/leave", {})  # retracted
        await self.member(room, self.bob, "leave")
        await self.bob.ok("POST", f"/knock/{q(room)}", {})
        code, _ = await self.eve.request(
            "POST", f"/rooms/{q(room)}/kick", {"user_id": self.bob.user_id}
        )
        self.assertEqual(code, 403)  # Eve is not in the room
        await self.alice.ok("POST", f"/rooms/{q(room)}/kick", {"user_id": self.bob.user_id})
        await self.member(room, self.bob, "leave")  # denied
        await self.bob.ok("POST", f"/knock/{q(room)}", {})
        await self.alice.ok("POST", f"/rooms/{q(room)}/ban", {"user_id": self.bob.user_id})
        code, body = await self.bob.request("POST", f"/knock/{q(room)}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        # Knocking needs version 7.
        old = await self.alice.create_room(room_version="6")
        code, body = await self.alice.request(
            "PUT", f"/rooms/{q(old)}/state/m.room.join_rules", {"join_rule": "knock"}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"))
        # Unknown rooms and aliases; bad input.
        for target in ("!nowhere:test.local", "#nowhere:test.local"):
            code, body = await self.bob.request("POST", f"/knock/{q(target)}", {})
            self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        for target, payload in (("nonsense", {}), (room, {"reason": 5}), (room, [])):
            code, _ = await self.eve.request("POST", f"/knock/{q(target)}", payload)
            self.assertEqual(code, 400, (target, payload))

    async def test_restricted_rooms(self) -> None:
        space = await self.alice.create_room(room_version="9", preset="public_chat")
        room = await self.alice.create_room(room_version="9")
        rules = {
            "join_rule": "restricted",
            "allow": [{"type": "m.room_membership", "room_id": space}, {"type": "org.x"}],
        }
        await self.alice.ok("PUT", f"/rooms/{q(room)}/state/m.room.join_rules", rules)
        code, body = await self.bob.request("POST", f"/join/{q(room)}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        await self.bob.ok("POST", f"/join/{q(space)}", {})
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        joined = await self.member(room, self.bob, "join")
        self.assertEqual(
            (joined["membership"], joined["join_authorised_via_users_server"]),
            ("join", self.alice.user_id),
        )
        # A client's own choice of authoriser is not trusted: the writer
        # checks the conditions itself.
        code, _ = await self.eve.request(
            "PUT",
            f"/rooms/{q(room)}/state/m.room.member/{q(self.eve.user_id)}",
            {"membership": "join", "join_authorised_via_users_server": self.alice.user_id},
        )
        self.assertEqual(code, 403)
        # Leaving the allowed room does not matter once in; Bob cannot
        # authorise (the invite level is 0 in a private room: he can).
        await self.bob.ok("POST", f"/rooms/{q(space)}/leave", {})
        await self.member(room, self.bob, "join")
        await self.eve.ok("POST", f"/join/{q(space)}", {})
        await self.eve.ok("POST", f"/join/{q(room)}", {})
        self.assertIn(
            (await self.member(room, self.eve, "join"))["join_authorised_via_users_server"],
            (self.alice.user_id, self.bob.user_id),
        )
        # Restricted rules need version 8; knock_restricted takes both ways in.
        old = await self.alice.create_room(room_version="7")
        code, _ = await self.alice.request("PUT", f"/rooms/{q(old)}/state/m.room.join_rules", rules)
        self.assertEqual(code, 400)
        both = await self.alice.create_room(room_version="10", preset="public_chat")
        await self.alice.ok(
            "PUT",
            f"/rooms/{q(both)}/state/m.room.join_rules",
            {**rules, "join_rule": "knock_restricted"},
        )
        await self.bob.ok("POST", f"/knock/{q(both)}", {})  # not in the space any more
        await self.eve.ok("POST", f"/join/{q(both)}", {})  # in the space
        self.assertEqual(
            (await self.member(both, self.eve, "join"))["join_authorised_via_users_server"],
            self.alice.user_id,
        )
        # No member who may invite: nobody can vouch for a join.
        public_invite = await self.alice.create_room(room_version="10", preset="public_chat")
        await self.alice.ok(
            "PUT", f"/rooms/{q(public_invite)}/state/m.room.join_rules", rules | {"allow": []}
        )
        code, body = await self.eve.request("POST", f"/join/{q(public_invite)}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))


class DefaultLayoutKnockingTestCase(MonolithKnockingTestCase):
    """The default layout: a /sync reader and two events writers."""

    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
