"""Which of our room events go to which servers (federation/sender/room_events.py,
the pure rules)."""

from __future__ import annotations

import attr
from twisted.trial import unittest

from synapse_lite.events import Event
from synapse_lite.federation.sender.room_events import destinations_of, joined_before, should_send
from synapse_lite.storage.databases.main.roommember import MemberChange

US = "b.test"
JOINED = ["@alice:b.test", "@carol:a.test", "@dave:c.test", "@erin:c.test"]


def event(sender: str, event_type: str = "m.room.message", state_key: str | None = None) -> Event:
    return Event(
        event_id="$e",
        room_id="!r:b.test",
        type=event_type,
        state_key=state_key,
        sender=sender,
        content={},
        origin_server_ts=0,
        stream_ordering=1,
        depth=1,
        instance_name="main",
    )


class RoomEventRulesTestCase(unittest.TestCase):
    def test_ours_go_to_every_other_server_joined(self) -> None:
        message = event("@alice:b.test")
        self.assertTrue(should_send(message, US, None))
        self.assertEqual(destinations_of(message, JOINED, US, None), ["a.test", "c.test"])

    def test_a_kicked_users_server_hears_of_it(self) -> None:
        kick = event("@alice:b.test", "m.room.member", "@frank:d.test")
        self.assertEqual(destinations_of(kick, JOINED, US, None), ["a.test", "c.test", "d.test"])

    def test_an_invitees_server_had_it_through_invite(self) -> None:
        invite = attr.evolve(
            event("@alice:b.test", "m.room.member", "@frank:d.test"),
            content={"membership": "invite"},
        )
        self.assertEqual(destinations_of(invite, JOINED, US, None), ["a.test", "c.test"])

    def test_send_join_memberships_are_passed_on_not_back(self) -> None:
        join = event("@carol:a.test", "m.room.member", "@carol:a.test")
        self.assertTrue(should_send(join, US, "a.test"))
        self.assertEqual(destinations_of(join, JOINED, US, "a.test"), ["c.test"])

    def test_other_servers_events_are_not_passed_on(self) -> None:
        self.assertFalse(should_send(event("@carol:a.test"), US, "a.test"))
        # Another server's user's membership, sent by a third server.
        self.assertFalse(
            should_send(event("@carol:a.test", "m.room.member", "@carol:a.test"), US, "c.test")
        )
        # Someone else's membership (a kick by a remote user).
        kick = event("@carol:a.test", "m.room.member", "@alice:b.test")
        self.assertFalse(should_send(kick, US, "a.test"))

    def test_joined_before_undoes_the_changes_at_or_after_the_event(self) -> None:
        # Now: alice and carol joined. carol joined at 10, left at 12 and
        # joined again at 14; dave left at 11; erin was invited at 13.
        now = frozenset({"@alice:b.test", "@carol:a.test"})
        changes = [
            MemberChange("!r:b.test", "@carol:a.test", 10, None),
            MemberChange("!r:b.test", "@dave:c.test", 11, "join"),
            MemberChange("!r:b.test", "@carol:a.test", 12, "join"),
            MemberChange("!r:b.test", "@erin:c.test", 13, None),
            MemberChange("!r:b.test", "@carol:a.test", 14, "leave"),
        ]
        self.assertEqual(joined_before(now, changes, 10), {"@alice:b.test", "@dave:c.test"})
        self.assertEqual(
            joined_before(now, changes, 11), {"@alice:b.test", "@dave:c.test", "@carol:a.test"}
        )
        self.assertEqual(joined_before(now, changes, 13), {"@alice:b.test"})
        self.assertEqual(joined_before(now, changes, 15), now)
