"""The room-changes tracker: ``changed_among`` answers as
``may_have_changed`` does for each entity, tokens with writers ahead and
tokens from before the tracker started included."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.storage.change_tracker import StreamChangeTracker
from synapse_lite.tokens import RoomStreamToken


class ChangedAfterTestCase(unittest.TestCase):
    def test_entities_changed_after_a_position_on_any_writer(self) -> None:
        tracker = StreamChangeTracker(lambda: RoomStreamToken(10))
        tracker.record("!a:x", "master", 12)
        tracker.record("!b:x", "w1", 15)
        tracker.record("!c:x", "master", 20)
        self.assertEqual(len(tracker), 3)
        self.assertEqual(tracker.changed_after(10), {"!a:x", "!b:x", "!c:x"})
        self.assertEqual(tracker.changed_after(12), {"!b:x", "!c:x"})
        self.assertEqual(tracker.changed_after(20), set())

    def test_unknown_before_the_tracker_started(self) -> None:
        tracker = StreamChangeTracker(lambda: RoomStreamToken(10, {"w1": 14}))
        tracker.record("!a:x", "master", 16)
        # w1 may have changed entities at 11-14 that were never recorded.
        self.assertIsNone(tracker.changed_after(9))
        self.assertIsNone(tracker.changed_after(13))
        self.assertEqual(tracker.changed_after(14), {"!a:x"})


class ChangedAmongTestCase(unittest.TestCase):
    def test_agrees_with_may_have_changed(self) -> None:
        tracker = StreamChangeTracker(lambda: RoomStreamToken(10))
        tracker.record("!a:x", "master", 12)
        tracker.record("!b:x", "w1", 15)
        tracker.record("!c:x", "master", 20)
        tokens = [
            RoomStreamToken(9),  # before the tracker started: all may have
            RoomStreamToken(12),
            RoomStreamToken(12, {"w1": 15}),
            RoomStreamToken(20),
        ]
        rooms = ["!a:x", "!b:x", "!c:x", "!d:x"]
        since_of = {r: tokens[i % len(tokens)] for i, r in enumerate(rooms)}
        for token in tokens:
            since_of_one = {r: token for r in rooms}
            expected = {r for r in rooms if tracker.may_have_changed(r, token)}
            self.assertEqual(tracker.changed_among(since_of_one), expected)
        expected = {r for r, t in since_of.items() if tracker.may_have_changed(r, t)}
        self.assertEqual(tracker.changed_among(since_of), expected)
        self.assertEqual(expected, {"!a:x", "!b:x", "!c:x"})

