"""The room-changes tracker: ``changed_among`` answers as
``may_have_changed`` does for each entity, tokens with writers ahead and
tokens from before the tracker started included. The trackers of integer
streams: exact above their horizon, bounded, and told of a writer's change
before its position is visible. Each room's recent events: the database's
answer wherever they answer."""

from __future__ import annotations

import random
from typing import Any

from twisted.trial import unittest

from synapse_lite.storage import change_tracker
from synapse_lite.storage.change_tracker import (
    PositionChangeTracker,
    RecentRoomEvents,
    StreamChangeTracker,
)
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


class StreamChangeTrackerForgettingTestCase(unittest.TestCase):
    def test_forgetting_keeps_changes_not_yet_visible(self) -> None:
        """Rows of one batch recorded while the process's position is still
        5 (it moves past them once the batch is applied): forgetting on the
        batch's last row must not answer "no change" for the first ones at
        a token past the current one."""
        self.patch(change_tracker, "MAX_ENTITIES", 3)
        tracker = StreamChangeTracker(lambda: RoomStreamToken(5))
        for i, room in enumerate(["!a:x", "!b:x", "!c:x"]):
            tracker.record(room, "w1", 6 + i)
        tracker.record("!d:x", "w1", 9)
        # The position then moves to 9: a token at 7 must see !c:x's change
        # at 8 (forgotten) as possible.
        self.assertTrue(tracker.may_have_changed("!c:x", RoomStreamToken(7)))
        self.assertTrue(tracker.may_have_changed("!d:x", RoomStreamToken(8)))
        self.assertFalse(tracker.may_have_changed("!c:x", RoomStreamToken(8)))
        self.assertFalse(tracker.may_have_changed("!d:x", RoomStreamToken(9)))


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


class RecentRoomEventsTestCase(unittest.TestCase):
    """:class:`RecentRoomEvents` against the database's answer, over random
    traffic of two writers whose rows arrive interleaved (each writer's in
    order, a position visible only once its row is recorded), with events
    not served (skipped) and events whose being served is unknown here; a
    room's newest events with no lower bound likewise."""

    def _traffic(
        self, seed: int, per_room: int, max_rooms: int, max_events: int = 10_000
    ) -> tuple[int, int]:
        rng = random.Random(seed)
        rooms = ["!a:x", "!b:x", "!c:x"]
        writers = ["w1", "w2"]
        positions = {w: 0 for w in writers}
        #: Every event in the database: (id, writer, room, event id, served).
        database: list[tuple[int, str, str, str, bool]] = []
        pending: dict[str, list[tuple[int, str, str, str, bool]]] = {w: [] for w in writers}
        next_id = [0]

        def current() -> RoomStreamToken:
            return RoomStreamToken.from_positions(min(positions.values()), positions)

        def write() -> None:
            next_id[0] += 1
            event = (
                next_id[0], rng.choice(writers), rng.choice(rooms), f"$e{next_id[0]}",
                rng.random() < 0.85,
            )  # fmt: skip
            database.append(event)
            pending[event[1]].append(event)

        def deliver(writer: str, recent: RecentRoomEvents | None) -> None:
            stream_id, _, room, event_id, served = pending[writer].pop(0)
            if recent is not None:
                if served and rng.random() < 0.9:
                    recent.record(room, writer, stream_id, event_id)
                elif served or rng.random() < 0.5:
                    # A follower cannot tell (another server's event).
                    recent.unknown(room, stream_id)
            positions[writer] = stream_id

        # History before the process started.
        for _ in range(10):
            write()
        for writer in writers:
            while pending[writer]:
                deliver(writer, None)
        tokens = [current()]
        recent = RecentRoomEvents(
            current, per_room=per_room, max_rooms=max_rooms, max_events=max_events
        )
        answered = asked = 0
        for _ in range(600):
            if rng.random() < 0.5:
                write()
            ready = [w for w in writers if pending[w]]
            if ready and rng.random() < 0.6:
                deliver(rng.choice(ready), recent)
                tokens.append(current())
            since = rng.choice(tokens[-40:])
            upper = current() if rng.random() < 0.7 else rng.choice(tokens[-40:])
            if not since.is_before_or_eq(upper):
                continue
            asked_rooms = rng.sample(rooms, rng.randrange(1, 4))
            limit = rng.randrange(1, 12)
            newest_first = rng.random() < 0.7
            newest = recent.newest(asked_rooms[0], upper, limit)
            if newest is not None:
                self.newest_answered += 1
                expected_newest = sorted(
                    (
                        (stream_id, event_id)
                        for stream_id, writer, room, event_id, served in database
                        if served and room == asked_rooms[0] and upper.contains(writer, stream_id)
                    ),
                    reverse=True,
                )[:limit]
                self.assertEqual(newest, [e for _, e in expected_newest], (upper, asked_rooms))
            ids = recent.between(asked_rooms, since, upper, limit, newest_first)
            asked += 1
            if ids is None:
                continue
            answered += 1
            expected = sorted(
                (
                    (stream_id, event_id)
                    for stream_id, writer, room, event_id, served in database
                    if served
                    and room in asked_rooms
                    and upper.contains(writer, stream_id)
                    and not since.contains(writer, stream_id)
                ),
                reverse=newest_first,
            )[:limit]
            self.assertEqual(ids, [e for _, e in expected], (since, upper, asked_rooms))
        # A token ahead of what this process has seen is never answered.
        ahead = RoomStreamToken(current().get_max_position() + 1)
        self.assertIsNone(recent.between(rooms, tokens[-1], ahead, 10))
        return answered, asked

    newest_answered = 0

    def test_answers_as_the_database(self) -> None:
        for seed in range(20):
            answered, asked = self._traffic(seed, per_room=64, max_rooms=100)
            # Not a test of nothing (unknown events keep a room unanswered below them).
            self.assertGreater(answered, asked // 10, seed)
        self.assertGreater(self.newest_answered, 100)

    def test_bounded_rooms_and_events_still_answer_as_the_database(self) -> None:
        for seed in range(20):
            answered, _ = self._traffic(seed, per_room=4, max_rooms=2)
            self.assertGreater(answered, 0, seed)
            answered, _ = self._traffic(seed, per_room=64, max_rooms=100, max_events=7)
            self.assertGreater(answered, 0, seed)
