"""One lock per key: holders of a key go one at a time in arrival order,
other keys do not wait, and a key nobody holds is forgotten."""

from __future__ import annotations

from twisted.internet import defer
from twisted.trial import unittest

from synapse_lite.keyed_locks import KeyedLocks


class KeyedLocksTestCase(unittest.TestCase):
    def test_one_key_in_order_other_keys_free(self) -> None:
        locks = KeyedLocks()
        order: list[str] = []
        gates = {name: defer.Deferred[None]() for name in ("a1", "a2", "b1")}

        async def holder(key: str, name: str) -> None:
            async with locks.hold(key):
                order.append(f"{name} in")
                await gates[name]
                order.append(f"{name} out")

        done = [
            defer.ensureDeferred(holder("a", "a1")),
            defer.ensureDeferred(holder("a", "a2")),
            defer.ensureDeferred(holder("b", "b1")),
        ]
        # a2 waits for a1; b1 does not.
        self.assertEqual(order, ["a1 in", "b1 in"])
        gates["a2"].callback(None)
        self.assertEqual(order, ["a1 in", "b1 in"])
        gates["a1"].callback(None)
        self.assertEqual(order, ["a1 in", "b1 in", "a1 out", "a2 in", "a2 out"])
        gates["b1"].callback(None)
        self.assertTrue(all(d.called for d in done))
        self.assertEqual(locks._locks, {})

    def test_a_failing_holder_lets_the_next_in(self) -> None:
        locks = KeyedLocks()

        async def failing() -> None:
            async with locks.hold("a"):
                raise ValueError("boom")

        async def next_one() -> str:
            async with locks.hold("a"):
                return "in"

        failed = defer.ensureDeferred(failing())
        self.failureResultOf(failed, ValueError)
        self.assertEqual(self.successResultOf(defer.ensureDeferred(next_one())), "in")
        self.assertEqual(locks._locks, {})
