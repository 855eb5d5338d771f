"""Completion queues and completion channels of the tcp provider.

The progress engine pushes completions; the application polls or blocks on a channel. A thread blocked on a
channel drives the engine itself while no other thread does (see engine.py), so its completion is made on
its own thread. A CQ that would hold more than `cqe` entries overflows as on an RNIC: it is unusable from
then on and its producer QP goes to ERR.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from libshift.providers import ProviderChannel, ProviderCQ
from libshift.vocabulary.errors import CQOverflowError
from libshift.vocabulary.wr import WC

if TYPE_CHECKING:
    from libshift.providers.tcp.engine import Engine


class TcpChannel(ProviderChannel):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._cond = threading.Condition()
        self._events: deque[TcpCQ] = deque()
        self._leading = 0  # waiters of this channel that hold (or are about to take) the engine's lead
        self._poked = False  # the lead was released since the waiter last tried to take it
        self._woken = False  # wake() was called: the next wait returns None at once
        self._sleeping = 0  # waiters on the condition (Condition.notify costs a microsecond even for none)

    def notify(self, cq: TcpCQ) -> None:
        with self._cond:
            self._events.append(cq)
            if self._sleeping:
                self._cond.notify()
            leading = self._leading
        if leading and not self._engine.leads_here():
            self._engine.wake()  # the waiter sleeps in epoll, not on the condition

    def wake(self) -> None:
        """Make the wait under way (or else the next one) return None now: what the waiter waits for came
        by another way (a layer above made the completion on another thread)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()
            leading = self._leading
        if leading and not self._engine.leads_here():
            self._engine.wake()

    def _poke(self) -> None:
        with self._cond:
            self._poked = True
            self._cond.notify_all()

    def get_cq_event(self, timeout: float | None) -> TcpCQ | None:
        """The next event; meanwhile lead the engine, or wait on the condition while another thread leads."""
        end = None if timeout is None else time.monotonic() + timeout
        self._engine.follow(self._poke)
        try:
            while True:
                left = None if end is None else end - time.monotonic()
                with self._cond:
                    if self._events:
                        return self._events.popleft()
                    if self._woken or (left is not None and left <= 0):
                        self._woken = False
                        return None
                    self._poked = False
                    self._leading += 1
                try:
                    led = self._engine.turn(left, self._poke)
                except BaseException:
                    with self._cond:
                        self._leading -= 1
                    raise
                with self._cond:
                    self._leading -= 1
                    if self._events:  # the usual end: the event came while this thread led
                        return self._events.popleft()
                    if not led:
                        self._sleeping += 1
                        try:
                            self._cond.wait_for(lambda: self._events or self._poked or self._woken, left)
                        finally:
                            self._sleeping -= 1
        finally:
            self._engine.unfollow(self._poke)

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
            if self.overflowed or len(self._wcs) >= self.cqe:
                self.overflowed = True
            else:
                self._wcs.append(wc)
            armed = self._armed
            fire = armed is not None and (not armed or solicited or wc.status != 0 or self.overflowed)
            if fire:
                self._armed = None
        if fire and self.channel is not None:
            self.channel.notify(self)
        return not self.overflowed

    def poll(self, num_entries: int) -> list[WC]:
        wcs = self._wcs
        if not wcs:
            self._progress()
            if not wcs and not self.overflowed:
                return []  # (read without the lock: a push in between is seen by the next poll)
        with self._lock:
            if self.overflowed:
                raise CQOverflowError(f"CQ overflow: more than {self.cqe} completions were not polled")
            if num_entries >= len(wcs):
                got = list(wcs)
                wcs.clear()
                return got
            return [wcs.popleft() for _ in range(num_entries)]

    def req_notify(self, solicited_only: bool) -> None:
        with self._lock:
            self._armed = solicited_only

    def close(self) -> None:
        with self._lock:
            self._wcs.clear()
