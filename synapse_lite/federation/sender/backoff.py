"""Backoff towards a destination that keeps failing.

The interval starts at ``retry.initial_seconds`` after the first failure and
doubles with each further failure up to ``retry.max_seconds``; the wait before
the next attempt is the interval with ±20 % jitter, so many senders do not
retry in step. State lives in ``destinations`` (``RetryState``) so every
process, and the next run, agree on it.
"""

from __future__ import annotations

import math
import random

from synapse_lite.config.federation import RetryConfig
from synapse_lite.storage.databases.main.federation import RetryState

JITTER = 0.2


def after_failure(state: RetryState, now_ms: int, config: RetryConfig) -> RetryState:
    """The state after one more failed attempt at ``now_ms``."""
    initial = int(config.initial_seconds * 1000)
    maximum = int(config.max_seconds * 1000)
    if state.retry_interval_ms <= 0:
        interval = initial
    else:
        interval = min(state.retry_interval_ms * 2, maximum)
    failure_ts = state.failure_ts if state.failure_ts is not None else now_ms
    return RetryState(retry_last_ts=now_ms, retry_interval_ms=interval, failure_ts=failure_ts)


def retry_delay_seconds(state: RetryState, now_ms: int, rng: random.Random | None = None) -> float:
    """How long to wait from ``now_ms`` before trying again (0: now)."""
    if state.retry_interval_ms <= 0:
        return 0.0
    jitter = 1.0 + (rng or random).uniform(-JITTER, JITTER)
    due = state.retry_last_ts + state.retry_interval_ms * jitter
    return max(0.0, (due - now_ms) / 1000)


def consecutive_failures(state: RetryState, config: RetryConfig) -> int:
    """How many failures in a row led to ``state`` (the interval only takes
    the values ``initial * 2**k``, capped)."""
    if state.retry_interval_ms <= 0:
        return 0
    initial = config.initial_seconds * 1000
    return 1 + max(0, math.ceil(math.log2(max(state.retry_interval_ms, initial) / initial) - 1e-9))


def is_down(state: RetryState, config: RetryConfig) -> bool:
    """Whether a destination counts as down: ``down_after_failures`` in a row."""
    return consecutive_failures(state, config) >= config.down_after_failures
