"""The event authorisation rules, on their own, as each room version has them."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.events import EventSpec
from synapse_lite.handlers.event_auth import CREATOR_LEVEL, RoomAuthState
from synapse_lite.handlers.room import create_content, default_power_levels

ALICE, BOB, EVE = "@alice:hs", "@bob:hs", "@eve:hs"


def spec(sender: str, event_type: str, content: dict[str, Any], key: str | None = "") -> EventSpec:
    return EventSpec(event_type, key, sender, content, 0)


def member(sender: str, target: str, membership: str) -> EventSpec:
    return spec(sender, "m.room.member", {"membership": membership}, target)


class EventAuthTestCase(unittest.TestCase):
    def room(
        self, join_rule: str = "invite", preset: str = "private_chat", version: str = "10"
    ) -> RoomAuthState:
        state = RoomAuthState("!r:hs")
        for s in [
            spec(ALICE, "m.room.create", create_content(KNOWN_ROOM_VERSIONS[version], ALICE, {})),
            member(ALICE, ALICE, "join"),
            spec(
                ALICE,
                "m.room.power_levels",
                default_power_levels(ALICE, preset, [], KNOWN_ROOM_VERSIONS[version]),
            ),
            spec(ALICE, "m.room.join_rules", {"join_rule": join_rule}),
        ]:
            state.check(s)
            state.apply_spec(s)
        state.just_created = False
        return state

    def allowed(self, state: RoomAuthState, s: EventSpec) -> bool:
        try:
            state.check(s)
        except SynapseError as e:
            self.assertIn(e.code, (403, 404))
            return False
        state.apply_spec(s)
        return True

    def test_create_only_once_and_nothing_before_it(self) -> None:
        empty = RoomAuthState("!r:hs")
        with self.assertRaises(SynapseError) as e:
            empty.check(spec(ALICE, "m.room.message", {}, None))
        self.assertEqual(e.exception.code, 404)
        state = self.room()
        self.assertFalse(self.allowed(state, spec(ALICE, "m.room.create", {})))

    def test_joining_needs_an_invite_unless_public(self) -> None:
        state = self.room()
        self.assertFalse(self.allowed(state, member(BOB, BOB, "join")))
        self.assertTrue(self.allowed(state, member(ALICE, BOB, "invite")))
        self.assertTrue(self.allowed(state, member(BOB, BOB, "join")))
        public = self.room("public", "public_chat")
        self.assertTrue(self.allowed(public, member(BOB, BOB, "join")))
        self.assertFalse(self.allowed(public, member(BOB, EVE, "join")))  # not for others

    def test_invites_need_membership_and_level(self) -> None:
        public = self.room("public", "public_chat")  # invite level 50
        self.allowed(public, member(BOB, BOB, "join"))
        self.assertFalse(self.allowed(public, member(BOB, EVE, "invite")))
        self.assertFalse(self.allowed(public, member(EVE, BOB, "invite")))  # not a member
        self.assertTrue(self.allowed(public, member(ALICE, EVE, "invite")))
        self.assertFalse(self.allowed(public, member(ALICE, BOB, "invite")))  # already joined

    def test_kick_ban_and_leave(self) -> None:
        state = self.room("public", "public_chat")
        self.allowed(state, member(BOB, BOB, "join"))
        self.allowed(state, member(EVE, EVE, "join"))
        self.assertFalse(self.allowed(state, member(BOB, EVE, "leave")))  # bob cannot kick
        self.assertFalse(self.allowed(state, member(EVE, ALICE, "ban")))
        self.assertTrue(self.allowed(state, member(ALICE, EVE, "ban")))
        self.assertFalse(self.allowed(state, member(EVE, EVE, "join")))  # banned
        self.assertFalse(self.allowed(state, member(EVE, EVE, "leave")))  # not in the room
        self.assertTrue(self.allowed(state, member(ALICE, EVE, "leave")))  # unban
        self.assertTrue(self.allowed(state, member(BOB, BOB, "leave")))
        self.assertFalse(self.allowed(state, spec(BOB, "m.room.message", {}, None)))

    def test_state_and_power_levels(self) -> None:
        state = self.room("public", "public_chat")
        self.allowed(state, member(BOB, BOB, "join"))
        self.assertTrue(self.allowed(state, spec(BOB, "m.room.message", {}, None)))
        self.assertFalse(self.allowed(state, spec(BOB, "m.room.topic", {"topic": "t"})))
        self.assertTrue(self.allowed(state, spec(ALICE, "m.room.topic", {"topic": "t"})))
        levels = default_power_levels(ALICE, "public_chat", [], KNOWN_ROOM_VERSIONS["10"])
        levels["users"] = {ALICE: 100, BOB: 50}
        self.assertTrue(self.allowed(state, spec(ALICE, "m.room.power_levels", levels)))
        self.assertTrue(self.allowed(state, spec(BOB, "m.room.topic", {"topic": "mine"})))
        raise_self = dict(levels, users={ALICE: 100, BOB: 100})
        self.assertFalse(self.allowed(state, spec(BOB, "m.room.power_levels", raise_self)))
        with self.assertRaises(SynapseError) as e:
            state.check(spec(ALICE, "m.room.power_levels", {"users": {BOB: "high"}}))
        self.assertEqual((e.exception.code, e.exception.errcode), (400, "M_BAD_JSON"))

    def test_guests_join_only_where_guest_access_is_can_join(self) -> None:
        state = self.room("public", "public_chat")
        state.guests = frozenset({EVE})
        self.assertFalse(self.allowed(state, member(EVE, EVE, "join")))
        self.assertTrue(self.allowed(state, member(BOB, BOB, "join")))  # not a guest
        self.assertTrue(
            self.allowed(state, spec(ALICE, "m.room.guest_access", {"guest_access": "can_join"}))
        )
        self.assertTrue(self.allowed(state, member(EVE, EVE, "join")))
        self.assertTrue(self.allowed(state, member(EVE, EVE, "leave")))
        self.assertTrue(
            self.allowed(state, spec(ALICE, "m.room.guest_access", {"guest_access": "forbidden"}))
        )
        with self.assertRaises(SynapseError) as e:
            state.check(member(EVE, EVE, "join"))
        self.assertEqual((e.exception.code, e.exception.errcode), (403, "M_GUEST_ACCESS_FORBIDDEN"))
        # An invite does not let a guest past guest_access either.
        invite_only = self.room()
        invite_only.guests = frozenset({EVE})
        self.assertTrue(self.allowed(invite_only, member(ALICE, EVE, "invite")))
        self.assertFalse(self.allowed(invite_only, member(EVE, EVE, "join")))

    def test_create_event_content_per_version(self) -> None:
        for version in ("1", "10"):
            # Versions 1-10 name the creator; an unknown version is refused.
            empty = RoomAuthState("!r:hs")
            with self.assertRaises(SynapseError) as e:
                empty.check(spec(ALICE, "m.room.create", {"room_version": version}))
            self.assertEqual((e.exception.code, e.exception.errcode), (400, "M_BAD_JSON"))
        with self.assertRaises(SynapseError) as e:
            empty.check(spec(ALICE, "m.room.create", {"room_version": "13"}))
        self.assertEqual(e.exception.errcode, "M_UNSUPPORTED_ROOM_VERSION")
        # Version 12: additional_creators must be user ids; they and the
        # sender are the creators, above any level, never in ``users``.
        v12 = RoomAuthState("!" + "A" * 43)
        for bad in ("@a:hs", ["nope"], [1]):
            with self.assertRaises(SynapseError) as e:
                v12.check(
                    spec(ALICE, "m.room.create", {"room_version": "12", "additional_creators": bad})
                )
            self.assertEqual((e.exception.code, e.exception.errcode), (400, "M_BAD_JSON"))
        create12 = spec(
            ALICE, "m.room.create", {"room_version": "12", "additional_creators": [BOB]}
        )
        v12.check(create12)
        v12.apply_spec(create12)
        self.assertEqual(v12.creators, {ALICE, BOB})
        self.assertEqual(v12.user_level(BOB), CREATOR_LEVEL)
        self.assertEqual(v12.user_level(EVE), 0)
        v12.apply_spec(member(ALICE, ALICE, "join"))
        with self.assertRaises(SynapseError) as e:
            v12.check(spec(ALICE, "m.room.power_levels", {"users": {BOB: 100}}))
        self.assertEqual(e.exception.code, 403)
        v12.check(spec(ALICE, "m.room.power_levels", {"users": {EVE: 100}}))
        v11 = RoomAuthState("!r:hs")
        create = spec(ALICE, "m.room.create", {"room_version": "11"})
        v11.check(create)  # no creator in version 11: the sender is
        v11.apply_spec(create)
        self.assertEqual(v11.creator, ALICE)
        self.assertTrue(self.allowed(v11, member(ALICE, ALICE, "join")))
        # A create event without room_version is of version 1.
        implicit = RoomAuthState("!r:hs")
        implicit.apply_spec(spec(ALICE, "m.room.create", {"creator": ALICE}))
        self.assertEqual(implicit.version.identifier, "1")
        # Rooms are created by users of the room's server.
        with self.assertRaises(SynapseError) as e:
            RoomAuthState("!r:other").check(spec(ALICE, "m.room.create", {"room_version": "11"}))
        self.assertEqual(e.exception.code, 403)

    def test_join_rules_each_version_has(self) -> None:
        cases = {
            "knock": ("7", "6"),
            "restricted": ("8", "7"),
            "knock_restricted": ("10", "9"),
        }
        for rule, (first, before) in cases.items():
            rules = spec(ALICE, "m.room.join_rules", {"join_rule": rule})
            self.assertTrue(self.allowed(self.room(version=first), rules))
            with self.assertRaises(SynapseError) as e:
                self.room(version=before).check(rules)
            self.assertEqual((e.exception.code, e.exception.errcode), (400, "M_BAD_JSON"))
        for bad_allow in ("x", [{"room_id": "!a:hs"}], [{"type": "m.room_membership"}]):
            with self.assertRaises(SynapseError):
                self.room().check(
                    spec(
                        ALICE, "m.room.join_rules", {"join_rule": "restricted", "allow": bad_allow}
                    )
                )

    def test_knocking(self) -> None:
        for version in ("7", "10", "11"):
            state = self.room("knock", version=version)
            self.assertFalse(self.allowed(state, member(BOB, EVE, "knock")))  # only oneself
            self.assertTrue(self.allowed(state, member(BOB, BOB, "knock")))
            self.assertFalse(self.allowed(state, member(BOB, BOB, "join")))  # needs an invite
            self.assertTrue(self.allowed(state, member(BOB, BOB, "leave")))  # retracted
            self.assertTrue(self.allowed(state, member(BOB, BOB, "knock")))
            self.assertTrue(self.allowed(state, member(ALICE, BOB, "invite")))  # accepted
            self.assertFalse(self.allowed(state, member(BOB, BOB, "knock")))  # invited already
            self.assertTrue(self.allowed(state, member(BOB, BOB, "join")))
            self.assertFalse(self.allowed(state, member(BOB, BOB, "knock")))  # joined
            self.assertTrue(self.allowed(state, member(EVE, EVE, "knock")))
            self.assertTrue(self.allowed(state, member(ALICE, EVE, "leave")))  # denied
            self.assertTrue(self.allowed(state, member(EVE, EVE, "knock")))
            self.assertTrue(self.allowed(state, member(ALICE, EVE, "ban")))
            self.assertFalse(self.allowed(state, member(EVE, EVE, "knock")))  # banned
        # Not in a room whose join rule takes no knocks, nor before version 7.
        self.assertFalse(self.allowed(self.room("invite"), member(BOB, BOB, "knock")))
        with self.assertRaises(SynapseError) as e:
            self.room("public", version="6").check(member(BOB, BOB, "knock"))
        self.assertEqual(e.exception.code, 400)
        restricted = self.room("knock_restricted")
        self.assertTrue(self.allowed(restricted, member(BOB, BOB, "knock")))

    def test_restricted_joins_need_an_authorising_member(self) -> None:
        for rule, version in (("restricted", "8"), ("restricted", "9"), ("knock_restricted", "10")):
            state = self.room(rule, "public_chat", version=version)  # invite level 50
            self.allowed(state, member(ALICE, BOB, "invite"))
            self.allowed(state, member(BOB, BOB, "join"))  # invited: no authoriser needed

            def join(authoriser: str | None) -> EventSpec:
                content: dict[str, Any] = {"membership": "join"}
                if authoriser is not None:
                    content["join_authorised_via_users_server"] = authoriser
                return spec(EVE, "m.room.member", content, EVE)

            self.assertFalse(self.allowed(state, join(None)))
            self.assertFalse(self.allowed(state, join(BOB)))  # may not invite
            self.assertFalse(self.allowed(state, join("@carol:hs")))  # not a member
            self.assertFalse(self.allowed(state, join("@alice:elsewhere")))  # not of our server
            self.assertTrue(self.allowed(state, join(ALICE)))

    def test_string_power_levels_before_version_10(self) -> None:
        stringy = {"users": {ALICE: "100", BOB: " +50 "}, "state_default": "50", "kick": "060"}
        old = self.room("public", "public_chat", version="9")
        self.assertTrue(self.allowed(old, spec(ALICE, "m.room.power_levels", stringy)))
        self.assertEqual((old.user_level(BOB), old.named_level("kick", 50)), (50, 60))
        self.allowed(old, member(BOB, BOB, "join"))
        self.assertTrue(self.allowed(old, spec(BOB, "m.room.topic", {"topic": "t"})))
        new = self.room("public", "public_chat", version="10")
        for bad in (stringy, {"ban": 5.5}, {"events": {"m.room.name": "50"}}, {"ban": True}):
            with self.assertRaises(SynapseError) as e:
                new.check(spec(ALICE, "m.room.power_levels", bad))
            self.assertEqual((e.exception.code, e.exception.errcode), (400, "M_BAD_JSON"), bad)
        with self.assertRaises(SynapseError):
            old.check(spec(ALICE, "m.room.power_levels", {"ban": "5.5"}))

    def test_power_level_changes_old_and_new_values(self) -> None:
        state = self.room("public", "public_chat")
        self.allowed(state, member(BOB, BOB, "join"))
        levels = default_power_levels(ALICE, "public_chat", [], KNOWN_ROOM_VERSIONS["10"])
        levels["users"] = {ALICE: 100, BOB: 50}
        levels["events"] = {"m.room.power_levels": 50, "m.room.tombstone": 100}
        levels["notifications"] = {"room": 60}
        self.assertTrue(self.allowed(state, spec(ALICE, "m.room.power_levels", levels)))
        # Bob (50) may change what is at or below 50, not what is above it.
        lower_kick = {**levels, "kick": 40}
        self.assertTrue(self.allowed(state, spec(BOB, "m.room.power_levels", lower_kick)))
        no_notify = {**lower_kick, "notifications": {"room": 10}}
        self.assertFalse(self.allowed(state, spec(BOB, "m.room.power_levels", no_notify)))
        # Removing a level above one's own is changing it.
        without_tombstone = {**lower_kick, "events": {"m.room.power_levels": 50}}
        self.assertFalse(self.allowed(state, spec(BOB, "m.room.power_levels", without_tombstone)))
        # Before version 6 notifications were not the rules' business.
        old = self.room("public", "public_chat", version="5")
        self.allowed(old, member(BOB, BOB, "join"))
        self.allowed(old, spec(ALICE, "m.room.power_levels", levels))
        self.assertTrue(
            self.allowed(
                old, spec(BOB, "m.room.power_levels", {**levels, "notifications": {"room": 0}})
            )
        )

    def test_state_keys_naming_users_and_alias_events(self) -> None:
        state = self.room("public", "public_chat")
        self.allowed(state, member(BOB, BOB, "join"))
        self.assertTrue(self.allowed(state, spec(ALICE, "org.example.user", {}, ALICE)))
        self.assertFalse(self.allowed(state, spec(ALICE, "org.example.user", {}, BOB)))
        # m.room.aliases: any user of the server, even outside the room, in
        # versions 1-5; a plain state event from 6.
        for version, eve_may in (("5", True), ("6", False)):
            room = self.room("public", "public_chat", version=version)
            self.assertEqual(
                self.allowed(room, spec(EVE, "m.room.aliases", {"aliases": []}, "hs")), eve_may
            )
            if eve_may:
                self.assertFalse(self.allowed(room, spec(ALICE, "m.room.aliases", {}, "other")))

    def test_canonical_json_from_version_6(self) -> None:
        for content in ({"body": 1.5}, {"n": 2**53}):
            old = self.room("public", "public_chat", version="5")
            self.assertTrue(self.allowed(old, spec(ALICE, "m.room.message", content, None)))
            with self.assertRaises(SynapseError) as e:
                self.room(version="6").check(spec(ALICE, "m.room.message", content, None))
            self.assertEqual((e.exception.code, e.exception.errcode), (400, "M_BAD_JSON"))

    def test_tombstones_point_elsewhere(self) -> None:
        state = self.room()
        for bad in ({"replacement_room": "!r:hs"}, {"replacement_room": "nope"}, {}):
            with self.assertRaises(SynapseError) as e:
                state.check(spec(ALICE, "m.room.tombstone", bad))
            self.assertEqual(e.exception.code, 400)
        self.assertTrue(
            self.allowed(state, spec(ALICE, "m.room.tombstone", {"replacement_room": "!n:hs"}))
        )

    def test_unban_needs_kick_and_ban_levels(self) -> None:
        state = self.room("public", "public_chat")
        for user in (BOB, EVE):
            self.allowed(state, member(user, user, "join"))
        levels = default_power_levels(ALICE, "public_chat", [], KNOWN_ROOM_VERSIONS["10"])
        levels.update(users={ALICE: 100, BOB: 60}, kick=70, ban=50)
        self.allowed(state, spec(ALICE, "m.room.power_levels", levels))
        self.assertTrue(self.allowed(state, member(BOB, EVE, "ban")))
        self.assertFalse(self.allowed(state, member(BOB, EVE, "leave")))  # kick level 70
        self.assertTrue(self.allowed(state, member(ALICE, EVE, "leave")))
