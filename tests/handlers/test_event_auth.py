"""The event authorisation rules, on their own."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.events import EventSpec
from synapse_lite.handlers.event_auth import RoomAuthState
from synapse_lite.handlers.room import default_power_levels

ALICE, BOB, EVE = "@alice:hs", "@bob:hs", "@eve:hs"


def spec(sender: str, event_type: str, content: dict[str, Any], key: str | None = "") -> EventSpec:
    return EventSpec(event_type, key, sender, content, 0)


def member(sender: str, target: str, membership: str) -> EventSpec:
    return spec(sender, "m.room.member", {"membership": membership}, target)


class EventAuthTestCase(unittest.TestCase):
    def room(self, join_rule: str = "invite", preset: str = "private_chat") -> RoomAuthState:
        state = RoomAuthState("!r:hs")
        for s in [
            spec(ALICE, "m.room.create", {"creator": ALICE}),
            member(ALICE, ALICE, "join"),
            spec(ALICE, "m.room.power_levels", default_power_levels(ALICE, preset, [])),
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
        levels = default_power_levels(ALICE, "public_chat", [])
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
