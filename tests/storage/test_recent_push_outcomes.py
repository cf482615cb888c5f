"""``RecentPushOutcomes`` and ``PushOutcome`` (storage/databases/main/push_rules.py):
what the sole events writer remembers of its events' push outcomes, and
when it says it does not have them all. Pure: no database."""

from __future__ import annotations

import random

from twisted.trial import unittest

from synapse_lite.storage.databases.main.push_rules import PushOutcome, RecentPushOutcomes


def message(stream_ordering: int, highlight: bool | None = False) -> PushOutcome:
    return PushOutcome(stream_ordering, "@bob:test", highlight, {})


class PushOutcomeTestCase(unittest.TestCase):
    def test_the_default_counts_above_its_floor_for_anyone_but_the_sender(self) -> None:
        outcome = PushOutcome(10, "@bob:test", True, {})
        self.assertEqual(outcome.counts_for("@alice:test", 9, 9), (1, 1))
        self.assertEqual(outcome.counts_for("@alice:test", 10, 0), (0, 0))
        self.assertEqual(outcome.counts_for("@bob:test", 0, 0), (0, 0))
        self.assertEqual(PushOutcome(10, "@bob:test", None, {}).counts_for("@a:test", 0, 0), (0, 0))

    def test_an_own_outcome_replaces_the_default(self) -> None:
        outcome = PushOutcome(
            10, "@bob:test", False, {"@alice:test": (True, True), "@carol:test": (False, False)}
        )
        self.assertEqual(outcome.counts_for("@alice:test", 100, 9), (1, 1))
        self.assertEqual(outcome.counts_for("@alice:test", 0, 10), (0, 0))
        self.assertEqual(outcome.counts_for("@carol:test", 0, 0), (0, 0))
        self.assertEqual(outcome.counts_for("@dave:test", 0, 0), (1, 0))


class RecentPushOutcomesTestCase(unittest.TestCase):
    def test_nothing_below_the_start_is_known(self) -> None:
        outcomes = RecentPushOutcomes(floor=50)
        self.assertIsNone(outcomes.outcomes_in("!r:test", 49, 60))
        self.assertEqual(outcomes.outcomes_in("!r:test", 50, 60), [])
        outcomes.persisted("!r:test", message(55))
        self.assertIsNone(outcomes.outcomes_in("!r:test", 40, 60))
        self.assertEqual(outcomes.outcomes_in("!r:test", 50, 60), [message(55)])
        self.assertEqual(outcomes.outcomes_in("!r:test", 50, 54), [])
        self.assertEqual(outcomes.outcomes_in("!r:test", 55, 60), [])

    def test_a_full_room_raises_its_floor(self) -> None:
        outcomes = RecentPushOutcomes(floor=0)
        self.patch(outcomes, "PER_ROOM", 3)
        for stream_ordering in (1, 3, 5, 7):
            outcomes.persisted("!r:test", message(stream_ordering))
        outcomes.persisted("!other:test", message(8))
        self.assertIsNone(outcomes.outcomes_in("!r:test", 0, 10))
        self.assertEqual(
            outcomes.outcomes_in("!r:test", 1, 10), [message(3), message(5), message(7)]
        )
        # Another room keeps its own floor.
        self.assertEqual(outcomes.outcomes_in("!other:test", 0, 10), [message(8)])

    def test_a_dropped_room_raises_the_floor_of_rooms_not_kept(self) -> None:
        outcomes = RecentPushOutcomes(floor=0)
        self.patch(outcomes, "ROOMS", 2)
        outcomes.persisted("!a:test", message(1))
        outcomes.persisted("!a:test", message(4))
        outcomes.persisted("!b:test", message(2))
        outcomes.persisted("!c:test", message(3))  # drops !a, least recently written
        self.assertIsNone(outcomes.outcomes_in("!a:test", 3, 10))
        self.assertEqual(outcomes.outcomes_in("!a:test", 4, 10), [])
        self.assertIsNone(outcomes.outcomes_in("!never:test", 3, 10))
        self.assertEqual(outcomes.outcomes_in("!b:test", 0, 10), [message(2)])
        # A room written again starts from the raised floor.
        outcomes.persisted("!a:test", message(5))
        self.assertIsNone(outcomes.outcomes_in("!a:test", 3, 10))
        self.assertEqual(outcomes.outcomes_in("!a:test", 4, 10), [message(5)])

    def test_answers_what_the_events_say_whatever_the_order_recorded(self) -> None:
        # Every (after, upto] the memory answers is exactly the recorded
        # outcomes in it, for any order of recording and any bounds.
        rng = random.Random(7)
        for _ in range(200):
            outcomes = RecentPushOutcomes(floor=0)
            self.patch(outcomes, "PER_ROOM", rng.randint(1, 6))
            recorded = rng.sample(range(1, 30), rng.randint(0, 12))
            for stream_ordering in recorded:
                outcomes.persisted("!r:test", message(stream_ordering))
            after = rng.randint(0, 30)
            upto = rng.randint(after, 31)
            got = outcomes.outcomes_in("!r:test", after, upto)
            kept = sorted(recorded)[-outcomes.PER_ROOM :]
            floor = max(set(recorded) - set(kept), default=0)
            if after < floor:
                self.assertIsNone(got)
            else:
                want = [message(s) for s in sorted(recorded) if after < s <= upto]
                self.assertEqual(got, want)
