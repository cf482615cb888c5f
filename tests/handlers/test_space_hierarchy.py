"""The pure parts of the spaces hierarchy (handlers/space_hierarchy.py):
which ``m.space.child`` events are children, their order, the pagination
token, and who may see a room; and another server's answer checked
(federation/queries.py)."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.federation.queries import RemoteUnavailable, check_hierarchy_answer
from synapse_lite.handlers.space_hierarchy import (
    WalkToken,
    may_see,
    ordered_children,
    space_child,
)


def child(room_id: str, ts: int = 0, **content: Any) -> dict[str, Any]:
    return {
        "type": "m.space.child",
        "state_key": room_id,
        "sender": "@a:b.test",
        "origin_server_ts": ts,
        "content": {"via": ["b.test"], **content},
    }


class SpaceChildrenTestCase(unittest.TestCase):
    def test_what_is_a_child(self) -> None:
        found = space_child(child("!r:b.test", 5, suggested=True, order="a"))
        assert found is not None
        self.assertEqual(
            (found.room_id, found.via, found.suggested, found.order, found.origin_server_ts),
            ("!r:b.test", ("b.test",), True, "a", 5),
        )
        for bad in (
            {**child("!r:b.test"), "content": {}},  # removed: no via
            {**child("!r:b.test"), "content": {"via": []}},
            {**child("!r:b.test"), "content": {"via": [3, ""]}},
            {**child("!r:b.test"), "content": {"via": "b.test"}},
            {**child("!r:b.test"), "content": "x"},
            child("not a room"),
            {**child("!r:b.test"), "type": "m.space.parent"},
        ):
            self.assertIsNone(space_child(bad), bad)
        # Not a boolean, not suggested; an invalid order is no order.
        odd = space_child(child("!r:b.test", suggested="yes", order="\x7f"))
        assert odd is not None
        self.assertEqual((odd.suggested, odd.order), (False, None))
        self.assertIsNone(space_child(child("!r:b.test", order="x" * 51)).order)  # type: ignore[union-attr]

    def test_order(self) -> None:
        children = [
            child("!e:b.test", 1),
            child("!d:b.test", 1),
            child("!c:b.test", 0),
            child("!b:b.test", 9, order="b"),
            child("!a:b.test", 9, order="a", suggested=True),
            child("!z:b.test", 0, order=5),
        ]
        self.assertEqual(
            [c.room_id for c in ordered_children(children, False)],
            ["!a:b.test", "!b:b.test", "!c:b.test", "!z:b.test", "!d:b.test", "!e:b.test"],
        )
        self.assertEqual([c.room_id for c in ordered_children(children, True)], ["!a:b.test"])

    def test_token(self) -> None:
        token = WalkToken(20, 3, True)
        self.assertEqual(WalkToken.parse(token.encode()), token)
        for bad in ("", "x", "1_2", "1_2_3", "a_2_1", "-1_2_0", "1_2_0_4", "9999999999_1_1"):
            with self.assertRaises(SynapseError):
                WalkToken.parse(bad)

    def test_who_may_see(self) -> None:
        private = {"join_rule": "invite", "world_readable": False}
        self.assertFalse(may_see(private, None, frozenset()))
        self.assertFalse(may_see(private, "leave", frozenset()))
        self.assertTrue(may_see(private, "join", frozenset()))
        self.assertTrue(may_see(private, "invite", frozenset()))
        self.assertTrue(may_see({**private, "world_readable": True}, None, frozenset()))
        for rule in ("public", "knock", "knock_restricted"):
            self.assertTrue(may_see({"join_rule": rule}, None, frozenset()))
        restricted = {"join_rule": "restricted", "allowed_room_ids": ["!s:b.test"]}
        self.assertFalse(may_see(restricted, None, frozenset({"!t:b.test"})))
        self.assertTrue(may_see(restricted, None, frozenset({"!s:b.test"})))


class HierarchyAnswerTestCase(unittest.TestCase):
    def summary(self, room_id: str, **extra: Any) -> dict[str, Any]:
        return {
            "room_id": room_id,
            "num_joined_members": 2,
            "world_readable": False,
            "guest_can_join": False,
            **extra,
        }

    def test_checked(self) -> None:
        answer = {
            "room": self.summary(
                "!s:b.test",
                room_type="m.space",
                children_state=[child("!r:b.test"), {"type": "m.space.child"}, "x"],
            ),
            "children": [
                self.summary("!r:b.test", join_rule="public", allowed_room_ids=[1]),
                {"room_id": "!bad:b.test"},
            ],
            "inaccessible_children": ["!x:b.test", 5],
        }
        checked = check_hierarchy_answer("b.test", "!s:b.test", answer)
        self.assertEqual(checked.room["children_state"], [child("!r:b.test")])
        self.assertEqual(
            checked.children, {"!r:b.test": self.summary("!r:b.test", join_rule="public")}
        )
        self.assertEqual(checked.inaccessible, frozenset({"!x:b.test"}))
        # No children_state: an empty one.
        bare = check_hierarchy_answer(
            "b.test", "!s:b.test", {"room": self.summary("!s:b.test"), "children": "x"}
        )
        self.assertEqual((bare.room["children_state"], bare.children), ([], {}))

    def test_refused(self) -> None:
        bad_answers: list[Any] = [
            [],
            {},
            {"room": self.summary("!other:b.test")},
            {"room": {**self.summary("!s:b.test"), "num_joined_members": "2"}},
        ]
        for bad in bad_answers:
            with self.assertRaises(RemoteUnavailable):
                check_hierarchy_answer("b.test", "!s:b.test", bad)
