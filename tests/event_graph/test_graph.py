"""The graph around one new event (event_graph/graph.py)."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.event_graph.graph import (
    MAX_DEPTH,
    depth_of_new_event,
    forward_extremities_after,
    prev_events_for_new_event,
    state_after,
)
from tests.event_graph.rooms import ALICE, BOB, Room


class NewEvents(unittest.TestCase):
    def test_prev_events_keep_the_deepest_ten(self) -> None:
        extremities = {f"$e{i:02d}": i for i in range(15)}
        chosen = prev_events_for_new_event(extremities)
        self.assertEqual(chosen, sorted(f"$e{i:02d}" for i in range(5, 15)))
        self.assertEqual(prev_events_for_new_event({"$b": 3, "$a": 3}, limit=1), ["$a"])
        self.assertEqual(prev_events_for_new_event({}), [])

    def test_depth(self) -> None:
        self.assertEqual(depth_of_new_event([]), 1)
        self.assertEqual(depth_of_new_event([3, 7, 5]), 8)
        self.assertEqual(depth_of_new_event([MAX_DEPTH]), MAX_DEPTH)

    def test_branches_merge(self) -> None:
        room = Room("10")
        room.standard()
        base = room.add("m.room.topic", ALICE, {"topic": "a"}, state_key="")
        left = room.add("m.room.message", ALICE, {}, prev=[base.event_id])
        right = room.add("m.room.message", BOB, {}, prev=[base.event_id])
        extremities = forward_extremities_after({base.event_id}, left)
        extremities = forward_extremities_after(extremities, right)
        self.assertEqual(extremities, {left.event_id, right.event_id})
        merge = room.add("m.room.message", ALICE, {}, prev=sorted(extremities))
        self.assertEqual(forward_extremities_after(extremities, merge), {merge.event_id})

    def test_state_after(self) -> None:
        room = Room("10")
        last = room.standard()
        before = room.state_after[last.event_id]
        topic = room.add("m.room.topic", ALICE, {"topic": "a"}, state_key="")
        message = room.add("m.room.message", ALICE, {})
        self.assertEqual(state_after(message, before), before)
        self.assertEqual(state_after(topic, before)[("m.room.topic", "")], topic.event_id)
        self.assertNotIn(("m.room.topic", ""), before)
