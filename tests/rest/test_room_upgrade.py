"""``POST /rooms/{roomId}/upgrade`` over HTTP: the tombstone and the new
room's state, power levels restricted in the old room, aliases and the
directory listing moved, and each user's tags, direct chats and push rules
following them when they join the new room. On the monolith and on the
default layout (the rooms' events writers, the account data and push rules
writers all differ from the process the users talk to)."""

from __future__ import annotations

from typing import Any

from synapse_lite.api.errors import Codes, SynapseError
from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually
from tests.harness.spec import assert_spec_response


class MonolithRoomUpgradeTestCase(ThreeUsersTestCase):
    """On the monolith."""

    async def upgrade(self, user: ClientApi, room: str, version: str = "11") -> str:
        answer = await user.ok("POST", f"/rooms/{q(room)}/upgrade", {"new_version": version})
        assert_spec_response(
            self, "room_upgrades.yaml", "/rooms/{roomId}/upgrade", "POST", 200, answer
        )
        return str(answer["replacement_room"])

    async def state(self, room: str, event_type: str, key: str = "") -> Any:
        return await self.alice.ok("GET", f"/rooms/{q(room)}/state/{event_type}/{q(key)}")

    async def test_upgrade_replaces_the_room(self) -> None:
        old = await self.alice.create_room(
            room_version="9",
            preset="public_chat",
            visibility="public",
            name="Old",
            topic="Things",
            room_alias_name="place",
            creation_content={"m.federate": False},
            initial_state=[
                {"type": "m.room.encryption", "content": {"algorithm": "m.megolm.v1.aes-sha2"}},
                {"type": "m.room.avatar", "content": {"url": "mxc://test.local/a"}},
                {"type": "org.example.kept", "content": {"x": 1}},
            ],
        )
        await self.alice.ok("PUT", "/directory/room/%23second:test.local", {"room_id": old})
        await self.alice.ok(
            "PUT",
            f"/rooms/{q(old)}/state/m.room.canonical_alias",
            {"alias": "#place:test.local", "alt_aliases": ["#second:test.local"]},
        )
        await self.alice.ok(
            "PUT",
            f"/rooms/{q(old)}/state/m.room.member/{q('@spammer:elsewhere')}",
            {"membership": "ban", "reason": "spam"},
        )
        await self.bob.ok("POST", f"/join/{q(old)}", {})
        old_levels = await self.state(old, "m.room.power_levels")
        new = await self.upgrade(self.alice, old)

        # The old room: a tombstone, its power levels restricted, its
        # canonical alias emptied, unlisted.
        tombstone = await self.alice.ok(
            "GET", f"/rooms/{q(old)}/state/m.room.tombstone?format=event"
        )
        self.assertEqual(tombstone["content"]["replacement_room"], new)
        levels = await self.state(old, "m.room.power_levels")
        self.assertEqual((levels["events_default"], levels["invite"]), (50, 50))
        self.assertEqual(await self.state(old, "m.room.canonical_alias"), {})
        listing = await self.alice.ok("GET", f"/directory/list/room/{q(old)}")
        self.assertEqual(listing, {"visibility": "private"})
        code, _ = await self.bob.request("PUT", f"/rooms/{q(old)}/send/m.room.message/t", {})
        self.assertEqual(code, 403)

        # The new room: its version, predecessor, and the state carried over.
        create = await self.state(new, "m.room.create")
        self.assertEqual(
            create,
            {
                "room_version": "11",
                "m.federate": False,
                "predecessor": {"room_id": old, "event_id": tombstone["event_id"]},
            },
        )
        self.assertEqual(await self.state(new, "m.room.name"), {"name": "Old"})
        self.assertEqual(await self.state(new, "m.room.topic"), {"topic": "Things"})
        self.assertEqual(
            await self.state(new, "m.room.encryption"), {"algorithm": "m.megolm.v1.aes-sha2"}
        )
        self.assertEqual(await self.state(new, "m.room.avatar"), {"url": "mxc://test.local/a"})
        self.assertEqual(await self.state(new, "m.room.join_rules"), {"join_rule": "public"})
        self.assertEqual(await self.state(new, "m.room.power_levels"), old_levels)
        self.assertEqual(
            await self.state(new, "m.room.member", "@spammer:elsewhere"),
            {"membership": "ban", "reason": "spam"},
        )
        code, _ = await self.alice.request(
            "GET", f"/rooms/{q(new)}/state/org.example.kept/"
        )  # only the transferable state
        self.assertEqual(code, 404)
        self.assertEqual(
            await self.state(new, "m.room.canonical_alias"),
            {"alias": "#place:test.local", "alt_aliases": ["#second:test.local"]},
        )
        for alias in ("%23place:test.local", "%23second:test.local"):
            found = await self.bob.ok("GET", f"/directory/room/{alias}")
            self.assertEqual(found["room_id"], new)
        listing = await self.alice.ok("GET", f"/directory/list/room/{q(new)}")
        self.assertEqual(listing, {"visibility": "public"})
        rooms = await self.bob.ok("GET", "/publicRooms")
        self.assertEqual([r["room_id"] for r in rooms["chunk"]], [new])
        # Bob is not in the new room until he joins it.
        members = await self.alice.ok("GET", f"/rooms/{q(new)}/joined_members")
        self.assertEqual(list(members["joined"]), [self.alice.user_id])
        await self.bob.ok("POST", f"/join/{q(new)}", {})

    async def test_users_settings_follow_them(self) -> None:
        old = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{q(old)}", {})
        for user, name in ((self.alice, "alice"), (self.bob, "bob")):
            me = q(user.user_id)
            await user.ok("PUT", f"/user/{me}/rooms/{q(old)}/tags/u.work", {"order": 0.5})
            await user.ok("PUT", f"/pushrules/global/room/{q(old)}", {"actions": ["dont_notify"]})
            await user.ok(
                "PUT",
                f"/pushrules/global/override/mine-{name}",
                {
                    "actions": ["notify"],
                    "conditions": [{"kind": "event_match", "key": "room_id", "pattern": old}],
                },
            )
            await user.ok(
                "PUT", f"/user/{me}/account_data/m.direct", {"@x:test.local": [old, "!o:t"]}
            )
        new = await self.upgrade(self.alice, old, "10")

        async def settings_of(user: ClientApi) -> tuple[Any, ...]:
            me = q(user.user_id)
            tags = await user.ok("GET", f"/user/{me}/rooms/{q(new)}/tags")
            rule = await user.ok("GET", f"/pushrules/global/room/{q(new)}")
            direct = await user.ok("GET", f"/user/{me}/account_data/m.direct")
            override = await user.request("GET", "/pushrules/global/override/")
            return tags, rule, direct, override[1]

        # The upgrader's at once; Bob's when he joins the new room.
        tags, rule, direct, _ = await settings_of(self.alice)
        self.assertEqual(tags, {"tags": {"u.work": {"order": 0.5}}})
        self.assertEqual((rule["rule_id"], rule["actions"]), (new, ["dont_notify"]))
        self.assertEqual(direct, {"@x:test.local": [old, "!o:t", new]})
        code, _ = await self.bob.request("GET", f"/pushrules/global/room/{q(new)}")
        self.assertEqual(code, 404)
        await self.bob.ok("POST", f"/join/{q(new)}", {})

        async def bob_has_them() -> bool:
            code, _ = await self.bob.request("GET", f"/pushrules/global/room/{q(new)}")
            return code == 200

        await eventually(bob_has_them, what="Bob's push rule for the new room")
        tags, rule, direct, override = await settings_of(self.bob)
        self.assertEqual(tags, {"tags": {"u.work": {"order": 0.5}}})
        self.assertEqual(rule["actions"], ["dont_notify"])
        self.assertEqual(direct["@x:test.local"], [old, "!o:t", new])
        patterns = [
            c["pattern"]
            for r in override
            if not r["default"]
            for c in r["conditions"]
            if c["key"] == "room_id"
        ]
        self.assertEqual(patterns, [old])  # the rule id names no room: not copied over itself

    async def test_settings_out_of_reach_do_not_fail_the_upgrade_or_join(self) -> None:
        old = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{q(old)}", {})
        for user in (self.alice, self.bob):
            await user.ok("PUT", f"/pushrules/global/room/{q(old)}", {"actions": []})

        async def out_of_reach(edit: Any) -> None:
            raise SynapseError(503, "push_rules writer out of reach", Codes.UNKNOWN)

        for hs in self.servers.values():
            self.patch(hs.handlers.push_rules, "edit", out_of_reach)
        new = await self.upgrade(self.alice, old, "10")
        await self.bob.ok("POST", f"/join/{q(new)}", {})
        members = await self.bob.ok("GET", f"/rooms/{q(new)}/joined_members")
        self.assertEqual(set(members["joined"]), {self.alice.user_id, self.bob.user_id})
        code, _ = await self.bob.request("GET", f"/pushrules/global/room/{q(new)}")
        self.assertEqual(code, 404)

    async def test_power_to_upgrade_and_bad_requests(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        for body, status, errcode in (
            ({"new_version": "my_bad_version"}, 400, "M_UNSUPPORTED_ROOM_VERSION"),
            ({"new_version": 2}, 400, "M_BAD_JSON"),
            ({}, 400, "M_MISSING_PARAM"),
        ):
            code, answer = await self.alice.request("POST", f"/rooms/{q(room)}/upgrade", body)
            self.assertEqual((code, answer["errcode"]), (status, errcode), body)
        code, answer = await self.alice.request(
            "POST", "/rooms/!fail:unknown/upgrade", {"new_version": "2"}
        )
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))
        code, answer = await self.alice.request(
            "POST", "/rooms/nonsense/upgrade", {"new_version": "2"}
        )
        self.assertEqual(code, 400)
        code, answer = await self.bob.request(
            "POST", f"/rooms/{q(room)}/upgrade", {"new_version": "2"}
        )
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
        other = await self.bob.create_room()
        code, answer = await self.alice.request(
            "POST", f"/rooms/{q(other)}/upgrade", {"new_version": "2"}
        )
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
        # Nothing was written by the refusals.
        code, _ = await self.alice.request("GET", f"/rooms/{q(room)}/state/m.room.tombstone/")
        self.assertEqual(code, 404)
        # A tombstone sent by hand may not point to its own room.
        code, _ = await self.alice.request(
            "PUT", f"/rooms/{q(room)}/state/m.room.tombstone", {"replacement_room": room}
        )
        self.assertEqual(code, 400)

    async def test_a_moderator_upgrades(self) -> None:
        """A moderator allowed tombstones upgrades: the new room has the old
        power levels (the moderator lifted only while the room is set up),
        and the old room's power levels stay as they were, as a moderator
        may not change them."""
        room = await self.alice.create_room(preset="public_chat", room_version="6")
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        levels = await self.state(room, "m.room.power_levels")
        levels["users"][self.bob.user_id] = 50
        levels["events"]["m.room.tombstone"] = 50
        levels["users_default"] = "10"  # a string: version 6 reads it
        await self.alice.ok("PUT", f"/rooms/{q(room)}/state/m.room.power_levels", levels)

        async def bob_sees_it() -> bool:
            path = f"/rooms/{q(room)}/state/m.room.power_levels"
            return bool((await self.bob.ok("GET", path)) == levels)

        await eventually(bob_sees_it, what="the new power levels on Bob's process")
        new = await self.upgrade(self.bob, room, "10")
        new_levels = await self.bob.ok("GET", f"/rooms/{q(new)}/state/m.room.power_levels")
        self.assertEqual(new_levels, {**levels, "users_default": 10})
        self.assertEqual(await self.state(room, "m.room.power_levels"), levels)
        timeline = await self.bob.ok("GET", f"/rooms/{q(new)}/messages?dir=b&limit=50")
        types = [e["type"] for e in timeline["chunk"]]
        self.assertEqual(types.count("m.room.power_levels"), 2)

    async def test_join_rules_the_new_version_lacks(self) -> None:
        room = await self.alice.create_room(room_version="10")
        await self.alice.ok(
            "PUT",
            f"/rooms/{q(room)}/state/m.room.join_rules",
            {
                "join_rule": "knock_restricted",
                "allow": [{"type": "m.room_membership", "room_id": room}],
            },
        )
        new = await self.upgrade(self.alice, room, "8")
        self.assertEqual(
            await self.state(new, "m.room.join_rules"),
            {"join_rule": "restricted", "allow": [{"type": "m.room_membership", "room_id": room}]},
        )
        newer = await self.upgrade(self.alice, new, "1")
        self.assertEqual(await self.state(newer, "m.room.join_rules"), {"join_rule": "invite"})
        create = await self.state(newer, "m.room.create")
        self.assertEqual(create["creator"], self.alice.user_id)


class DefaultLayoutRoomUpgradeTestCase(MonolithRoomUpgradeTestCase):
    """The default layout, and the account data and push rules streams each
    on a writer of their own."""

    workers = [*DEFAULT_LAYOUT_WORKERS, "stream_writer"]
    stream_writers = {
        **DEFAULT_LAYOUT_STREAM_WRITERS,
        "account_data": ["stream_writer"],
        "push_rules": ["stream_writer"],
    }
