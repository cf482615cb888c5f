"""History visibility per event, on its own: each rule of the spec with the
setting in force at each event (positions are stream orderings)."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from synapse_lite.events import Event
from synapse_lite.handlers.visibility import RoomVisibility
from synapse_lite.tokens import RoomStreamToken

BOB = "@bob:hs"


def event(position: int, event_type: str = "m.room.message", **fields: Any) -> Event:
    return Event(
        event_id=f"$e{position}",
        room_id="!r:hs",
        type=event_type,
        state_key=fields.get("state_key"),
        sender=fields.get("sender", "@alice:hs"),
        content=fields.get("content", {}),
        origin_server_ts=0,
        stream_ordering=position,
        depth=position,
        instance_name="master",
    )


def setting(position: int, value: str) -> Event:
    return event(
        position, "m.room.history_visibility", state_key="", content={"history_visibility": value}
    )


def seen(view: RoomVisibility, positions: range) -> list[int]:
    """Which of the messages at ``positions`` the view shows (positions of
    the viewer's own membership events carry no message)."""
    own = {p for p, _ in view.history}
    return [p for p in positions if p not in own and view.can_see(event(p))]


class RoomVisibilityTestCase(unittest.TestCase):
    def test_each_setting_applies_to_the_events_sent_under_it(self) -> None:
        # Settings: shared (default) up to 10, joined from 10, invited from
        # 20, world_readable from 30, shared from 40. Bob: invited at 25,
        # joined at 35, left at 45, messages at every other position.
        view = RoomVisibility(
            BOB,
            ((10, "joined"), (20, "invited"), (30, "world_readable"), (40, "shared")),
            ((25, "invite"), (35, "join"), (45, "leave")),
        )
        # Before 10: shared, and Bob joined later. 11-19: joined, Bob was
        # not. 21-24: invited, Bob not yet invited; 26-29 invited while
        # invited. 31-39: world_readable. 41-44: joined. 46+: left.
        self.assertEqual(seen(view, range(1, 10)), list(range(1, 10)))
        self.assertEqual(seen(view, range(11, 20)), [])
        self.assertEqual(seen(view, range(21, 30)), [26, 27, 28, 29])
        self.assertEqual(seen(view, range(31, 40)), [31, 32, 33, 34, 36, 37, 38, 39])
        self.assertEqual(seen(view, range(41, 45)), [41, 42, 43, 44])
        # Shared after he left: he never joined after them.
        self.assertEqual(seen(view, range(46, 50)), [])
        self.assertEqual(view.upper_bound(RoomStreamToken(100)), RoomStreamToken(45))
        self.assertEqual(view.history_visibility, "shared")

    def test_a_setting_event_is_seen_when_before_or_after_allows(self) -> None:
        # Bob joins at 50: shared -> joined at 10 (before: shared, seen),
        # joined -> invited at 20 (neither: hidden), invited -> shared at 30
        # (after: shared, seen).
        settings = ((10, "joined"), (20, "invited"), (30, "shared"))
        view = RoomVisibility(BOB, settings, ((50, "join"),))
        shown = [p for p, v in settings if view.can_see(setting(p, v))]
        self.assertEqual(shown, [10, 30])
        # A world_readable <-> joined change is anyone's to see.
        stranger = RoomVisibility("@eve:hs", ((10, "world_readable"), (20, "joined")), ())
        self.assertTrue(stranger.can_see(setting(10, "world_readable")))
        self.assertTrue(stranger.can_see(setting(20, "joined")))
        self.assertFalse(stranger.can_see(event(25)))
        self.assertTrue(stranger.can_see(event(15)))

    def test_own_membership_events_and_reading_rights(self) -> None:
        view = RoomVisibility(BOB, ((1, "joined"),), ((5, "invite"),))
        invite = event(5, "m.room.member", state_key=BOB, content={"membership": "invite"})
        self.assertTrue(view.can_see(invite))
        self.assertFalse(view.can_see(event(6)))  # joined: an invite is not enough
        self.assertTrue(view.may_read)
        stranger = RoomVisibility("@eve:hs", ((1, "shared"),), ())
        self.assertFalse(stranger.may_read)
        self.assertTrue(stranger.is_peeking)
        readable = RoomVisibility("@eve:hs", ((1, "shared"), (9, "world_readable")), ())
        self.assertTrue(readable.may_read)
        self.assertEqual(readable.upper_bound(RoomStreamToken(100)), RoomStreamToken(100))

    def test_no_setting_or_one_not_understood_is_shared(self) -> None:
        for settings in ((), ((3, "everyone"),), ((3, None),)):
            view = RoomVisibility(BOB, settings, ((10, "join"),))
            self.assertEqual(view.history_visibility, "shared")
            self.assertTrue(view.can_see(event(5)))
            late = RoomVisibility(BOB, settings, ((1, "join"), (2, "leave")))
            self.assertFalse(late.can_see(event(5)))
