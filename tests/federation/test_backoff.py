"""Backoff towards failing destinations, in numbers."""

from __future__ import annotations

import random

from twisted.trial import unittest

from synapse_lite.config.federation import RetryConfig
from synapse_lite.federation.sender.backoff import (
    after_failure,
    consecutive_failures,
    is_down,
    retry_delay_seconds,
)
from synapse_lite.storage.databases.main.federation import RetryState

CONFIG = RetryConfig(initial_seconds=1.0, max_seconds=10.0, down_after_failures=3)


class BackoffTest(unittest.TestCase):
    def test_doubles_up_to_the_maximum(self) -> None:
        state = RetryState()
        intervals = []
        for i in range(6):
            state = after_failure(state, 1000 + i, CONFIG)
            intervals.append(state.retry_interval_ms)
        self.assertEqual(intervals, [1000, 2000, 4000, 8000, 10000, 10000])
        self.assertEqual(state.failure_ts, 1000)  # when the run of failures began
        self.assertEqual(state.retry_last_ts, 1005)

    def test_failures_and_down(self) -> None:
        state = RetryState()
        self.assertEqual(consecutive_failures(state, CONFIG), 0)
        seen = []
        for _ in range(5):
            state = after_failure(state, 0, CONFIG)
            seen.append((consecutive_failures(state, CONFIG), is_down(state, CONFIG)))
        self.assertEqual(seen, [(1, False), (2, False), (3, True), (4, True), (5, True)])

    def test_delay_with_jitter(self) -> None:
        state = RetryState(retry_last_ts=10_000, retry_interval_ms=4000, failure_ts=0)
        rng = random.Random(7)
        delays = [retry_delay_seconds(state, 10_000, rng) for _ in range(200)]
        self.assertTrue(all(3.2 <= d <= 4.8 for d in delays))
        self.assertGreater(max(delays) - min(delays), 1.0)
        # Past the due time: now. Up: now.
        self.assertEqual(retry_delay_seconds(state, 20_000, rng), 0.0)
        self.assertEqual(retry_delay_seconds(RetryState(), 0, rng), 0.0)
