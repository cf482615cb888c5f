"""The lag gauges: the newest position each writer announced, and how far
(ids) and how long (seconds) this process trails it."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import REGISTRY
from twisted.internet import task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.replication.lag import ReplicationLag


class FakePositions:
    def __init__(self, can_reset: bool = False) -> None:
        self.can_reset = can_reset
        self.received: dict[str, int] = {}

    def received_position(self, writer: str) -> int:
        return self.received.get(writer, 0)


class FakeStream:
    def __init__(self, positions: FakePositions) -> None:
        self.positions = positions


def sample(name: str, stream: str, writer: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"stream": stream, "writer": writer})


class ReplicationLagTestCase(unittest.TestCase):
    def test_ids_and_seconds_behind(self) -> None:
        clock = task.Clock()
        positions = FakePositions()
        lag = ReplicationLag(Clock(cast(Any, clock)), {"lagtest": cast(Any, FakeStream(positions))})
        positions.received["w1"] = 100
        lag.announced("lagtest", "w1", 100)
        self.assertEqual(sample("synapse_lite_replication_lag_ids", "lagtest", "w1"), 0)
        lag.announced("lagtest", "w1", 130)
        clock.advance(2.5)
        self.assertEqual(sample("synapse_lite_stream_announced_position", "lagtest", "w1"), 130)
        self.assertEqual(sample("synapse_lite_replication_lag_ids", "lagtest", "w1"), 30)
        self.assertEqual(sample("synapse_lite_replication_lag_seconds", "lagtest", "w1"), 2.5)
        positions.received["w1"] = 120
        lag.received("lagtest", "w1")
        self.assertEqual(sample("synapse_lite_replication_lag_ids", "lagtest", "w1"), 10)
        positions.received["w1"] = 130
        lag.received("lagtest", "w1")
        self.assertEqual(sample("synapse_lite_replication_lag_seconds", "lagtest", "w1"), 0)
        lag.forget("lagtest", "w1")
        self.assertIsNone(sample("synapse_lite_replication_lag_ids", "lagtest", "w1"))

    def test_a_memory_stream_restarting_from_zero(self) -> None:
        positions = FakePositions(can_reset=True)
        lag = ReplicationLag(
            Clock(cast(Any, task.Clock())), {"lagtyping": cast(Any, FakeStream(positions))}
        )
        positions.received["w"] = 500
        lag.announced("lagtyping", "w", 500)
        positions.received["w"] = 3  # the writer restarted
        lag.announced("lagtyping", "w", 3)
        self.assertEqual(sample("synapse_lite_replication_lag_ids", "lagtyping", "w"), 0)
