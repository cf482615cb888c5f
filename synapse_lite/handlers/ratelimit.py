"""Request rate limits: a token bucket per key (a user id, or an IP address
before login), per process.

Each process keeps its own buckets: a client spreading requests over N
processes gets up to N times the rate. Limits protect each process; the
configured numbers are per process (see docs/client-api.md).
"""

from __future__ import annotations

import math

from synapse_lite.api.errors import LimitExceededError
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import RateLimitConfig

#: Buckets kept before the full (idle) ones are forgotten.
_PRUNE_ABOVE = 10_000


class Ratelimiter:
    """``per_second`` sustained, ``burst`` at once, per key."""

    def __init__(self, clock: Clock, config: RateLimitConfig, enabled: bool = True) -> None:
        self._clock = clock
        self._rate = config.per_second
        self._burst = float(config.burst)
        self._enabled = enabled
        #: key -> (tokens left, when counted)
        self._buckets: dict[str, tuple[float, float]] = {}

    def _refilled(self, key: str, now: float, rate: float, burst: float) -> float:
        tokens, at = self._buckets.get(key, (burst, now))
        return min(burst, tokens + (now - at) * rate)

    def ratelimit(
        self, key: str, cost: float = 1.0, override: RateLimitConfig | None = None
    ) -> None:
        """Take ``cost`` from the key's bucket, or raise a 429
        ``M_LIMIT_EXCEEDED`` saying when to retry. ``override``: this key's
        own limit (an admin's, ``/_synapse/admin/v1/users/{userId}/
        override_ratelimit``) instead of the configured one; its
        ``per_second`` 0 lifts the limit."""
        if not self._enabled:
            return
        rate, burst = self._rate, self._burst
        if override is not None:
            if override.per_second == 0:
                return
            rate, burst = override.per_second, float(override.burst)
        now = self._clock.time()
        tokens = self._refilled(key, now, rate, burst)
        if tokens < cost:
            if rate <= 0:
                retry_after_ms = 60_000
            else:
                retry_after_ms = math.ceil((cost - tokens) / rate * 1000)
            self._buckets[key] = (tokens, now)
            raise LimitExceededError(retry_after_ms)
        self._buckets[key] = (tokens - cost, now)
        if len(self._buckets) > _PRUNE_ABOVE:
            self._prune(now)

    def _prune(self, now: float) -> None:
        for key in list(self._buckets):
            # A bucket with an override is pruned on the configured burst:
            # at worst its user starts again with a full bucket.
            if self._refilled(key, now, self._rate, self._burst) >= self._burst:
                del self._buckets[key]
