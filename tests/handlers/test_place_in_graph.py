"""Where the writer places a batch of new events in the room's graph."""

from __future__ import annotations

import attr
from twisted.trial import unittest

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.event_graph.authorisation import EventAuthError
from synapse_lite.events import EventSpec
from synapse_lite.handlers.message import (
    authorise_placed,
    content_as_pdu,
    hashed_room_id,
    place_in_graph,
)

STATE = {
    ("m.room.create", ""): "$create",
    ("m.room.power_levels", ""): "$power",
    ("m.room.join_rules", ""): "$rules",
    ("m.room.member", "@alice:hs"): "$alice",
    ("m.room.topic", ""): "$topic",
}


def state_event(event_type: str, state_key: str, content: dict[str, object]) -> EventSpec:
    return EventSpec(
        type=event_type,
        state_key=state_key,
        sender=state_key if event_type == "m.room.member" else "@alice:hs",
        content=content,
        origin_server_ts=1,
    )


class PlaceInGraphTestCase(unittest.TestCase):
    def test_a_batch_merges_the_extremities_then_is_a_line(self) -> None:
        join = state_event("m.room.member", "@bob:hs", {"membership": "join"})
        message = EventSpec(
            type="m.room.message", state_key=None, sender="@bob:hs", content={}, origin_server_ts=2
        )
        first, second = place_in_graph(
            "!r:hs", KNOWN_ROOM_VERSIONS["10"], "hs", [join, message], {"$b": 5, "$a": 3}, STATE
        )
        self.assertEqual((first.prev_event_ids, first.depth), (("$a", "$b"), 6))
        # A join cites the join rules and no topic; bob had no member event.
        self.assertEqual(first.auth_event_ids, ("$create", "$power", "$rules"))
        self.assertEqual((second.prev_event_ids, second.depth), ((first.event_id,), 7))
        # The message cites the join made just before it in the batch.
        self.assertEqual(set(second.auth_event_ids), {"$create", "$power", first.event_id})

    def test_the_create_event_has_no_parents(self) -> None:
        create = state_event("m.room.create", "", {"room_version": "11"})
        [content] = place_in_graph("!r:hs", KNOWN_ROOM_VERSIONS["11"], "hs", [create], {}, {})
        self.assertEqual(
            (content.prev_event_ids, content.auth_event_ids, content.depth), ((), (), 1)
        )

    def test_the_core_authorises_a_placed_batch_against_its_auth_events(self) -> None:
        """``authorise_placed``: a new room's batch passes the spec's rules,
        each event against its own auth events (earlier in the batch); a
        message from someone not joined is refused, as is one whose auth
        events are not known."""
        version = KNOWN_ROOM_VERSIONS["10"]
        specs = [
            state_event("m.room.create", "", {"room_version": "10", "creator": "@alice:hs"}),
            state_event("m.room.member", "@alice:hs", {"membership": "join"}),
            state_event("m.room.power_levels", "", {"users": {"@alice:hs": 100}}),
            state_event("m.room.join_rules", "", {"join_rule": "invite"}),
            state_event("m.room.topic", "", {"topic": "hello"}),
        ]
        room = place_in_graph("!r:hs", version, "hs", specs, {}, {})
        authorise_placed(version, room, {})
        state = {(c.type, c.state_key or ""): c.event_id for c in room if c.state_key is not None}
        stored = {c.event_id: content_as_pdu(c) for c in room}
        last = {room[-1].event_id: room[-1].depth}
        bob_says = EventSpec(
            type="m.room.message", state_key=None, sender="@bob:hs", content={}, origin_server_ts=3
        )
        [refused] = place_in_graph("!r:hs", version, "hs", [bob_says], last, state)
        with self.assertRaises(EventAuthError):
            authorise_placed(version, [refused], stored)
        alice_says = attr.evolve(bob_says, sender="@alice:hs")
        [allowed] = place_in_graph("!r:hs", version, "hs", [alice_says], last, state)
        authorise_placed(version, [allowed], stored)
        with self.assertRaises(EventAuthError) as cm:
            authorise_placed(version, [allowed], {})
        self.assertIn("auth events not found", str(cm.exception))


class HashedRoomIdTestCase(unittest.TestCase):
    def test_the_room_id_is_the_create_event_id_the_writer_makes(self) -> None:
        version = KNOWN_ROOM_VERSIONS["12"]
        create = state_event("m.room.create", "", {"room_version": "12"})
        join = state_event("m.room.member", "@alice:hs", {"membership": "join"})
        room_id = hashed_room_id(version, "hs", create)
        self.assertRegex(room_id, r"^![A-Za-z0-9_-]{43}$")
        placed = place_in_graph(room_id, version, "hs", [create, join], {}, {})
        self.assertEqual(placed[0].event_id, "$" + room_id[1:])
        # The create event is not among the join's auth events; the rules accept both.
        self.assertEqual(placed[1].auth_event_ids, ())
        authorise_placed(version, placed, {})
        # Another room id for this batch is refused by the rules.
        wrong = place_in_graph("!" + "A" * 43, version, "hs", [create, join], {}, {})
        with self.assertRaises(EventAuthError):
            authorise_placed(version, wrong, {})
