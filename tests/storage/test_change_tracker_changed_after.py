"""``StreamChangeTracker.changed_after`` (what the outbound room events feed
walks): the entities changed after a position on any writer, and None for
a position before the tracker started. (Apart from test_change_tracker.py
only to keep merges of the two apart.)"""

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
