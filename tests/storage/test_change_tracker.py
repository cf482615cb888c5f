"""The room-changes tracker: ``changed_among`` answers as
``may_have_changed`` does for each entity, tokens with writers ahead and
tokens from before the tracker started included."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.storage.change_tracker import StreamChangeTracker
from synapse_lite.tokens import RoomStreamToken


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
