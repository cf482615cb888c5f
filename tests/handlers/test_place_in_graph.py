"""Where the writer places a batch of new events in the room's graph."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.events import EventSpec
from synapse_lite.handlers.message import place_in_graph

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
