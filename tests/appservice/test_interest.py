"""Which events concern a service (a pure function: no database)."""

from __future__ import annotations

import re

from twisted.trial import unittest

from synapse_lite.appservice.interest import event_concerns_service, user_concerns_service
from synapse_lite.appservice.registration import ApplicationService, Namespace

SERVICE = ApplicationService(
    id="irc",
    url=None,
    as_token="a",
    hs_token="h",
    sender="@_irc_bot:hs",
    users=(Namespace(True, re.compile(r"@_irc_.*")),),
    aliases=(Namespace(False, re.compile(r"#_irc_.*:hs")),),
    rooms=(Namespace(False, re.compile(r"!bridged.*:hs")),),
)


def concerns(**overrides: object) -> bool:
    fields: dict = {
        "room_id": "!r:hs",
        "sender": "@alice:hs",
        "event_type": "m.room.message",
        "state_key": None,
        "joined_members": ["@alice:hs"],
        "room_aliases": [],
    }
    fields.update(overrides)
    return event_concerns_service(SERVICE, "hs", **fields)


class InterestTestCase(unittest.TestCase):
    def test_unrelated(self) -> None:
        self.assertFalse(concerns())

    def test_sender_and_target(self) -> None:
        self.assertTrue(concerns(sender="@_irc_x:hs"))
        self.assertTrue(concerns(sender="@_irc_bot:hs"))
        self.assertTrue(concerns(event_type="m.room.member", state_key="@_irc_x:hs"))
        # A state key that looks like a user on another event type is not one.
        self.assertFalse(concerns(event_type="m.custom", state_key="@_irc_x:hs"))

    def test_member_of_the_room(self) -> None:
        self.assertTrue(concerns(joined_members=["@alice:hs", "@_irc_bob:hs"]))

    def test_remote_users_never_count(self) -> None:
        self.assertFalse(concerns(sender="@_irc_x:elsewhere"))
        self.assertFalse(concerns(joined_members=["@_irc_x:elsewhere"]))
        self.assertFalse(concerns(event_type="m.room.member", state_key="@_irc_x:elsewhere"))

    def test_room_and_alias_namespaces(self) -> None:
        self.assertTrue(concerns(room_id="!bridged1:hs"))
        self.assertTrue(concerns(room_aliases=["#other:hs", "#_irc_chan:hs"]))
        self.assertFalse(concerns(room_aliases=["#other:hs"]))

    def test_presence(self) -> None:
        def sees(user_id: str, *rooms: list[str]) -> bool:
            return user_concerns_service(
                SERVICE, "hs", user_id=user_id, members_of_shared_rooms=rooms
            )

        self.assertTrue(sees("@_irc_bob:hs"))
        self.assertFalse(sees("@alice:hs"))
        self.assertFalse(sees("@alice:hs", ["@alice:hs", "@carol:hs"]))
        self.assertTrue(sees("@alice:hs", ["@carol:hs"], ["@alice:hs", "@_irc_bob:hs"]))
        # A remote user in the namespace shares nothing with the service.
        self.assertFalse(sees("@alice:hs", ["@alice:hs", "@_irc_bob:elsewhere"]))
        self.assertFalse(sees("@_irc_bob:elsewhere"))
