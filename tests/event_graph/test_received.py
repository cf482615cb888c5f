"""The outcome of a received event (``event_graph.received``): each kind of
rule broken gives the spec's verdict: the rules on auth events and the
authorisation rules against the event's own auth events reject, the rules
against the state before it reject, against the current state soft-fail;
an outlier is checked against its auth events only. Versions 1, 10 and 12
(where the create event is no auth event)."""

from __future__ import annotations

import attr
from twisted.trial import unittest

from synapse_lite.event_graph.pdu import Pdu
from synapse_lite.event_graph.received import ReceivedOutcome, received_outcome
from tests.event_graph.rooms import ALICE, BOB, Room

VERSIONS = ("1", "10", "12")


class ReceivedOutcomeTests(unittest.TestCase):
    def outcome(
        self,
        room: Room,
        event: Pdu,
        before: str | None,
        current: str | None,
        rejected: frozenset[str] = frozenset(),
    ) -> ReceivedOutcome:
        return received_outcome(
            room.version,
            event,
            room.events,
            rejected,
            room.state(before) if before else None,
            room.state(current) if current else None,
        )

    def joined_room(self, version: str) -> tuple[Room, Pdu]:
        room = Room(version)
        room.standard()
        return room, room.member(BOB, "join")

    def test_accepted(self) -> None:
        for version in VERSIONS:
            room, join = self.joined_room(version)
            message = room.add("m.room.message", BOB, {"body": "hi"})
            self.assertTrue(
                self.outcome(room, message, join.event_id, join.event_id).accepted, version
            )

    def test_rules_on_auth_events_reject(self) -> None:
        for version in VERSIONS:
            room, join = self.joined_room(version)
            message = room.add("m.room.message", BOB, {"body": "hi"})
            auth = message.auth_event_ids
            topic = room.add("m.room.topic", ALICE, {"topic": "t"}, state_key="")
            cases = {
                "missing": (*auth, "$nowhere"),
                "duplicate key": auth + auth[-1:],
                "not a selected key": (*auth, topic.event_id),
            }
            for name, ids in cases.items():
                result = self.outcome(
                    room, attr.evolve(message, auth_event_ids=ids), join.event_id, join.event_id
                )
                self.assertIsNotNone(result.rejected, (version, name))
                self.assertIsNone(result.soft_failed)
            # An auth event that was itself rejected.
            result = self.outcome(
                room, message, join.event_id, join.event_id, frozenset({join.event_id})
            )
            self.assertIn("rejected", result.rejected or "", version)
            # An auth event of another room.
            foreign = attr.evolve(join, event_id="$foreign", room_id="!other:a")
            room.events[foreign.event_id] = foreign
            ids = tuple(foreign.event_id if a == join.event_id else a for a in auth)
            result = self.outcome(
                room, attr.evolve(message, auth_event_ids=ids), join.event_id, join.event_id
            )
            self.assertIn("another room", result.rejected or "", version)

    def test_no_create_event_among_the_auth_events_rejects_before_12(self) -> None:
        for version in ("1", "10"):
            room, join = self.joined_room(version)
            message = room.add("m.room.message", BOB, {"body": "hi"})
            ids = tuple(a for a in message.auth_event_ids if a != room.create.event_id)
            result = self.outcome(
                room, attr.evolve(message, auth_event_ids=ids), join.event_id, join.event_id
            )
            self.assertIn("create", result.rejected or "", version)

    def test_authorisation_rules_against_own_auth_events_reject(self) -> None:
        """A sender without the power for a state event, and one who is not
        in the room (no membership among the auth events)."""
        for version in VERSIONS:
            room, join = self.joined_room(version)
            topic = room.add("m.room.topic", BOB, {"topic": "mine"}, state_key="")
            result = self.outcome(room, topic, join.event_id, join.event_id)
            self.assertIn("against its auth events", result.rejected or "", version)
            message = room.add("m.room.message", BOB, {"body": "hi"})
            ids = tuple(a for a in message.auth_event_ids if a != join.event_id)
            result = self.outcome(
                room, attr.evolve(message, auth_event_ids=ids), join.event_id, join.event_id
            )
            self.assertIn("against its auth events", result.rejected or "", version)

    def test_state_before_rejects(self) -> None:
        """Bob's join is among its auth events but not in the state before
        it (its parent precedes the join)."""
        for version in VERSIONS:
            room, join = self.joined_room(version)
            before_join = join.prev_event_ids[0]
            message = room.add("m.room.message", BOB, {"body": "hi"})
            moved = attr.evolve(message, prev_event_ids=(before_join,))
            result = self.outcome(room, moved, before_join, join.event_id)
            self.assertIn("state before it", result.rejected or "", version)

    def test_current_state_soft_fails(self) -> None:
        """Bob was banned after the state his message saw; and his power was
        taken away after the state his topic saw."""
        for version in VERSIONS:
            room, join = self.joined_room(version)
            message = room.add("m.room.message", BOB, {"body": "hi"})
            ban = room.member(BOB, "ban", sender=ALICE)
            result = self.outcome(room, message, join.event_id, ban.event_id)
            self.assertEqual(result.rejected, None, version)
            self.assertIn("current state", result.soft_failed or "", version)
            room = Room(version)
            room.standard({BOB: 50})
            join = room.member(BOB, "join")
            topic = room.add("m.room.topic", BOB, {"topic": "mine"}, state_key="")
            levels = room.add(
                "m.room.power_levels", room.create.sender,
                {"users": {} if version == "12" else {room.create.sender: 100}}, state_key="",
                prev=[join.event_id],
            )  # fmt: skip
            result = self.outcome(room, topic, join.event_id, levels.event_id)
            self.assertIsNotNone(result.soft_failed, version)

    def test_an_outlier_is_checked_against_its_auth_events_only(self) -> None:
        for version in VERSIONS:
            room, _join = self.joined_room(version)
            message = room.add("m.room.message", BOB, {"body": "hi"})
            ban = room.member(BOB, "ban", sender=ALICE)
            self.assertTrue(self.outcome(room, message, None, ban.event_id).accepted, version)
            topic = room.add("m.room.topic", BOB, {"topic": "mine"}, state_key="")
            self.assertIsNotNone(self.outcome(room, topic, None, None).rejected, version)
