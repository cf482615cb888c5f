"""``KeepAlivePool``: a connection handed back after the pool closed is
closed, not kept for four minutes."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.http.connection_pool import KeepAlivePool


class _Transport:
    def __init__(self) -> None:
        self.lost = False

    def loseConnection(self) -> None:
        self.lost = True


class _Connection:
    """What the pool sees of a connection whose response has finished."""

    state = "QUIESCENT"

    def __init__(self) -> None:
        self.transport = _Transport()
        self.aborted = False

    def abort(self) -> defer.Deferred[None]:
        self.aborted = True
        return defer.succeed(None)


class KeepAlivePoolTestCase(unittest.TestCase):
    def test_kept_until_closed_then_closed_when_handed_back(self) -> None:
        clock = task.Clock()
        pool = KeepAlivePool(clock)
        key: Any = ("https", b"b.test", 8448)
        kept = _Connection()
        pool._putConnection(key, kept)
        self.assertEqual(pool._connections[key], [kept])
        self.assertEqual(len(clock.getDelayedCalls()), 1)  # its idle timeout

        self.successResultOf(pool.close())
        self.assertTrue(kept.aborted)
        self.assertEqual(clock.getDelayedCalls(), [])
        # A request in flight at the close finishes afterwards.
        late = _Connection()
        pool._putConnection(key, late)
        self.assertTrue(late.transport.lost)
        self.assertEqual(pool._connections.get(key, []), [])
        self.assertEqual(clock.getDelayedCalls(), [])
