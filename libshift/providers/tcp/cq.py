"""Completion queues and completion channels of the tcp provider.

The progress engine pushes completions; the application polls or blocks on a channel. A CQ that would hold
more than `cqe` entries overflows as on an RNIC: it is unusable from then on and its producer QP goes to ERR.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from libshift.providers import ProviderChannel, ProviderCQ
from libshift.verbs.errors import CQOverflowError
from libshift.verbs.wr import WC


class TcpChannel(ProviderChannel):
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._events: deque[TcpCQ] = deque()

    def notify(self, cq: TcpCQ) -> None:
        with self._cond:
            self._events.append(cq)
            self._cond.notify()

    def get_cq_event(self, timeout: float | None) -> TcpCQ | None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._events, timeout):
                return None
            return self._events.popleft()

    def close(self) -> None:
        """Nothing to release: the channel is plain memory."""


class TcpCQ(ProviderCQ):
    def __init__(self, cqe: int, channel: TcpChannel | None, progress: Callable[[], None]) -> None:
        self.cqe = cqe
        self.channel = channel
        self._progress = progress  # a non-blocking pass of the engine, for polls that find nothing
        self.overflowed = False
        self._wcs: deque[WC] = deque()
        self._lock = threading.Lock()
        self._armed: bool | None = None  # None: not armed; True: solicited only; False: any completion

    def push(self, wc: WC, solicited: bool = False) -> bool:
        """Queue a completion; False when the CQ has overflowed (the completion is lost, as on an RNIC)."""
        with self._lock:
            if not self.overflowed and len(self._wcs) >= self.cqe:
                self.overflowed = True
            if not self.overflowed:
                self._wcs.append(wc)
            fire = self._armed is not None and (
                not self._armed or solicited or wc.status != 0 or self.overflowed
            )
            if fire:
                self._armed = None
        if fire and self.channel is not None:
            self.channel.notify(self)
        return not self.overflowed

    def poll(self, num_entries: int) -> list[WC]:
        if not self._wcs:
            self._progress()
        with self._lock:
            if self.overflowed:
                raise CQOverflowError(f"CQ overflow: more than {self.cqe} completions were not polled")
            count = min(num_entries, len(self._wcs))
            return [self._wcs.popleft() for _ in range(count)]

    def req_notify(self, solicited_only: bool) -> None:
        with self._lock:
            self._armed = solicited_only

    def close(self) -> None:
        with self._lock:
            self._wcs.clear()
