"""Token buckets, driven by a fake clock."""

from __future__ import annotations

from twisted.internet import task
from twisted.trial import unittest

from synapse_lite.api.errors import LimitExceededError
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import RateLimitConfig
from synapse_lite.handlers.ratelimit import Ratelimiter


class RatelimiterTestCase(unittest.TestCase):
    def test_burst_then_rate(self) -> None:
        reactor = task.Clock()
        limiter = Ratelimiter(Clock(reactor), RateLimitConfig(per_second=2.0, burst=3))
        for _ in range(3):
            limiter.ratelimit("@a:hs")
        with self.assertRaises(LimitExceededError) as e:
            limiter.ratelimit("@a:hs")
        self.assertEqual(e.exception.retry_after_ms, 500)
        limiter.ratelimit("@b:hs")  # other keys have their own bucket
        reactor.advance(0.5)
        limiter.ratelimit("@a:hs")
        with self.assertRaises(LimitExceededError):
            limiter.ratelimit("@a:hs")
        reactor.advance(100)
        for _ in range(3):  # refilled up to the burst, no further
            limiter.ratelimit("@a:hs")
        with self.assertRaises(LimitExceededError):
            limiter.ratelimit("@a:hs")

    def test_disabled(self) -> None:
        limiter = Ratelimiter(Clock(task.Clock()), RateLimitConfig(0.0, 1), enabled=False)
        for _ in range(10):
            limiter.ratelimit("@a:hs")

    def test_override(self) -> None:
        """An admin's override replaces the configured limit for its key;
        0 per second lifts it."""
        reactor = task.Clock()
        limiter = Ratelimiter(Clock(reactor), RateLimitConfig(per_second=1.0, burst=1))
        generous = RateLimitConfig(per_second=10.0, burst=5)
        for _ in range(5):
            limiter.ratelimit("@a:hs", override=generous)
        with self.assertRaises(LimitExceededError) as e:
            limiter.ratelimit("@a:hs", override=generous)
        self.assertEqual(e.exception.retry_after_ms, 100)
        for _ in range(50):
            limiter.ratelimit("@a:hs", override=RateLimitConfig(per_second=0.0, burst=0))
        limiter.ratelimit("@b:hs")
        with self.assertRaises(LimitExceededError):
            limiter.ratelimit("@b:hs")
