"""The auth chain index answers as walking the auth chains does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from synapse_lite.event_graph.auth_chain_index import AuthChainIndex, auth_order
from synapse_lite.event_graph.state_resolution import auth_chain, auth_difference, resolve_state
from tests.event_graph.rooms import ALICE, BOB
from tests.event_graph.test_state_resolution import STEPS, V2_VERSIONS, random_room, start


def indexed(events: dict) -> AuthChainIndex:
    index = AuthChainIndex()
    for event_id in sorted(events):  # ids are in creation order
        index.add(events[event_id])
    return index


class Chains(unittest.TestCase):
    def test_auth_state_changes_of_one_key_share_a_chain(self) -> None:
        room = start("10")
        levels = [
            room.add("m.room.power_levels", ALICE, {"users": {ALICE: 100, BOB: i}}, state_key="")
            for i in range(3)
        ]
        index = indexed(room.events)
        # Each power levels event cites the previous one (same key, and the
        # chain's newest): one chain, in order, after the room's first.
        self.assertEqual(len({index.positions[e.event_id][0] for e in levels}), 1)
        self.assertEqual([index.positions[e.event_id][1] for e in levels], [2, 3, 4])
        last = [levels[2].event_id]
        self.assertEqual(index.auth_chain(last), auth_chain(last, room.events))

    def test_auth_events_come_first(self) -> None:
        room = start("10")
        message = room.add("m.room.message", BOB, {})
        with self.assertRaises(KeyError):
            AuthChainIndex().add(message)


class AgreesWithWalking(unittest.TestCase):
    @settings(max_examples=40, deadline=None)
    @given(version=st.sampled_from(["1", *V2_VERSIONS]), steps=STEPS)
    def test_auth_chain_and_difference(
        self, version: str, steps: list[tuple[int, str, str, int]]
    ) -> None:
        room, tips = random_room(version, steps)
        index = indexed(room.events)
        for event_id in room.events:
            self.assertEqual(index.auth_chain([event_id]), auth_chain([event_id], room.events))
        sets = [room.state_after[t.event_id] for t in tips]
        self.assertEqual(index.auth_difference(sets), auth_difference(sets, room.events))
        self.assertEqual(index.auth_difference(sets[:2]), auth_difference(sets[:2], room.events))
        self.assertEqual(
            resolve_state(
                room.version, sets, room.events, indexed_auth_difference=index.auth_difference(sets)
            ),
            resolve_state(room.version, sets, room.events),
        )


class AuthOrder(unittest.TestCase):
    def test_auth_events_first_else_given_order(self) -> None:
        # c cites a (later in the list); $outside is not among them.
        order = auth_order([("c", ["a", "$outside"]), ("b", []), ("a", [])])
        self.assertEqual(order, ["b", "a", "c"])

    def test_a_cycle_is_broken_at_the_earliest_waiting_event(self) -> None:
        order = auth_order([("x", ["y"]), ("y", ["x"]), ("z", ["y"])])
        self.assertEqual(order, ["x", "y", "z"])
