"""Failover reports waiting for shiftd's acknowledgement: bounded, numbered, oldest first.

A report is made on the data path and must never wait there, nor be lost because shiftd is away (restarting,
or not started yet): it is queued, numbered, and sent by the agent's reporter thread in order, the oldest
few in one call; only shiftd's answer takes them off the queue, so what was not acknowledged is sent again
(after a reconnect, to the new daemon). The number is the report's id on the wire (with the agent's
instance), so shiftd counts a report sent twice once. A queue at its bound drops its oldest report to take
a new one, and counts it: shiftd down for long under a storm of switches costs the record the oldest, never
the memory.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Generic, TypeVar

MAX_PENDING = 4096
T = TypeVar("T")


class ReportQueue(Generic[T]):
    """Thread-safe; `put` never blocks."""

    def __init__(self, bound: int = MAX_PENDING) -> None:
        self._cond = threading.Condition()
        self._pending: deque[tuple[int, T]] = deque()
        self._bound = bound
        self._next = 1  # 0 means "no id" to shiftd
        self.dropped = 0  # ever dropped past the bound
        self._closed = False

    def put(self, item: T) -> int:
        """Queue `item`; its number."""
        with self._cond:
            if len(self._pending) >= self._bound:
                self._pending.popleft()
                self.dropped += 1
            seq, self._next = self._next, self._next + 1
            self._pending.append((seq, item))
            self._cond.notify_all()
            return seq

    def oldest(self, limit: int = 1, timeout: float | None = None) -> list[tuple[int, T]]:
        """The `limit` oldest reports not yet acknowledged, in order (their numbers follow each other: only
        the oldest are ever dropped), waiting up to `timeout` s for one; none once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending or self._closed, timeout)
            return [] if self._closed else list(itertools.islice(self._pending, limit))

    def last(self, seq: int) -> bool:
        """Whether report `seq` is the newest queued (no other is waiting behind it)."""
        with self._cond:
            return bool(self._pending) and self._pending[-1][0] == seq

    def ack(self, seq: int) -> None:
        """shiftd has every report up to `seq`: off the queue (those the bound did not drop meanwhile)."""
        with self._cond:
            while self._pending and self._pending[0][0] <= seq:
                self._pending.popleft()
            self._cond.notify_all()

    def wait_empty(self, timeout: float) -> bool:
        """Until every report is acknowledged, up to `timeout` s; whether they are."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    def close(self) -> None:
        """End the waits for a head now and from now on (the agent is closing)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._pending)
