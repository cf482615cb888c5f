"""Room tokens moved forward part of the way through a window (what the
deprecated /events hands back after a ``limit``), in numbers."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.tokens import InvalidToken, RoomStreamToken


class AdvancedThroughTestCase(unittest.TestCase):
    def test_two_writers(self) -> None:
        # From: w1 at 10, w2 at 12. Upper: w1 at 20, w2 at 16. Events of the
        # window in stream order: w1 11, w2 13, w1 14, w2 15, w1 17..20.
        since = RoomStreamToken(10, {"w2": 12})
        upper = RoomStreamToken(16, {"w1": 20})
        after_14 = since.advanced_through(upper, 14)
        self.assertEqual((after_14.get_position("w1"), after_14.get_position("w2")), (14, 14))
        # w2's 15 and w1's 17.. are still ahead; w2 never goes past its upper 16.
        after_18 = since.advanced_through(upper, 18)
        self.assertEqual((after_18.get_position("w1"), after_18.get_position("w2")), (18, 16))
        # Below a writer's own start it stays where it was.
        after_11 = since.advanced_through(upper, 11)
        self.assertEqual((after_11.get_position("w1"), after_11.get_position("w2")), (11, 12))
        self.assertEqual(since.advanced_through(upper, 99), upper)

    def test_what_it_covers_is_exactly_what_was_read(self) -> None:
        since = RoomStreamToken(3, {"w1": 7})
        upper = RoomStreamToken(9, {"w2": 14})
        window = [(w, i) for w in ("w1", "w2", "w3") for i in range(1, 16)]
        window = [(w, i) for w, i in window if not since.contains(w, i) and upper.contains(w, i)]
        for stop in range(4, 15):
            moved = since.advanced_through(upper, stop)
            covered = {(w, i) for w, i in window if moved.contains(w, i)}
            self.assertEqual(covered, {(w, i) for w, i in window if i <= stop}, stop)
            self.assertTrue(since.is_before_or_eq(moved) and moved.is_before_or_eq(upper))


class BackfillTokensTestCase(unittest.TestCase):
    async def test_a_place_among_backfilled_events_round_trips(self) -> None:
        # /messages hands out s-<n> among backfilled events (negative
        # stream orderings, docs/federation.md "Backfill").
        async def no_writer(instance_id: int) -> str | None:
            return None

        async def no_id(name: str) -> int:
            raise AssertionError(name)

        token = await RoomStreamToken.parse("s-42", no_writer)
        self.assertEqual(token, RoomStreamToken(-42))
        self.assertEqual(await token.to_string(no_id), "s-42")
        for bad in ("s--1", "s-", "s-1-2", "s1.5"):
            with self.assertRaises(InvalidToken):
                await RoomStreamToken.parse(bad, no_writer)
