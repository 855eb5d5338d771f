"""Per-connection token buckets: one noisy or hostile agent cannot flood etcd through shiftd."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class RateLimiter:
    """`rate` tokens a second, up to `burst`, for each key (a connection)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str, amount: float) -> bool:
        """Spend `amount` tokens of `key`'s bucket; False (and nothing spent) when it holds too few."""
        now = self._clock()
        bucket = self._buckets.setdefault(key, _Bucket(self.burst, now))
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate)
        bucket.stamp = now
        if bucket.tokens < amount:
            return False
        bucket.tokens -= amount
        return True

    def forget(self, key: str) -> None:
        self._buckets.pop(key, None)
