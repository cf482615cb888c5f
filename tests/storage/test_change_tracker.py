"""The room-changes tracker: ``changed_among`` answers as
``may_have_changed`` does for each entity, tokens with writers ahead and
tokens from before the tracker started included. The trackers of integer
streams: exact above their horizon, bounded, and told of a writer's change
before its position is visible."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from synapse_lite.storage import change_tracker
from synapse_lite.storage.change_tracker import PositionChangeTracker, StreamChangeTracker
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


class PositionChangeTrackerTestCase(unittest.TestCase):
    """The tracker of an integer stream (receipts, account data, to-device,
    push rules): exact above its horizon, "may have changed" below it."""

    def test_answers_from_memory_above_the_horizon(self) -> None:
        tracker = PositionChangeTracker(lambda: 10)
        tracker.record("@a:x", 12)
        tracker.record("@a:x", 11)  # out of order: the newest stays
        self.assertTrue(tracker.may_have_changed("@a:x", 11))
        self.assertFalse(tracker.may_have_changed("@a:x", 12))
        self.assertFalse(tracker.may_have_changed("@b:x", 10))
        # Below the horizon (10) nothing is known.
        self.assertTrue(tracker.may_have_changed("@b:x", 9))
        self.assertEqual(tracker.changed_among(["@b:x", "@a:x"], 9), ["@b:x", "@a:x"])
        self.assertEqual(tracker.changed_among(["@b:x", "@a:x"], 10), ["@a:x"])
        self.assertEqual(tracker.changed_among(["@b:x", "@a:x"], 12), [])

    def test_forgetting_moves_the_horizon_past_every_recorded_id(self) -> None:
        # 3 ids recorded while the stream is persisted up to 5 only (ids 6-8
        # not finished yet): forgetting must not lose them.
        self.patch(change_tracker, "MAX_ENTITIES", 3)
        tracker = PositionChangeTracker(lambda: 5)
        for i, user in enumerate(["@a:x", "@b:x", "@c:x"]):
            tracker.record(user, 6 + i)
        tracker.record("@d:x", 9)
        self.assertEqual(tracker.horizon, 8)
        for user in ("@a:x", "@b:x", "@c:x"):
            self.assertTrue(tracker.may_have_changed(user, 7))
        self.assertTrue(tracker.may_have_changed("@d:x", 8))
        self.assertFalse(tracker.may_have_changed("@a:x", 8))

    def test_a_writer_records_before_its_position_is_visible(self) -> None:
        order: list[str] = []

        class Txn:
            after_callbacks: list[Any] = []

            def call_first_after(self, callback: Any, *args: Any) -> None:
                self.after_callbacks.insert(0, (callback, args))

        txn = Txn()
        txn.after_callbacks.append((lambda: order.append("finish"), ()))
        tracker = PositionChangeTracker(lambda: 0)
        tracker.record_after_commit(txn, "@a:x", 1)  # type: ignore[arg-type]
        for callback, args in txn.after_callbacks:
            callback(*args)
            order.append(str(tracker.may_have_changed("@a:x", 0)))
        self.assertEqual(order, ["True", "finish", "True"])
