"""ShiftCQ and ShiftCompChannel: the application's completion queue over all its paths, and blocking waits.

A ShiftCQ has a provider CQ on each device; polling it makes the context take every completion out of the
provider CQs and hand it to its QP, which releases completions to the application in posting order. The
provider CQs have room to spare (CQ_SLACK), so the ShiftCQ itself holds the application to its `cqe`, as an
RNIC's CQ does: more than `cqe` completions released and not polled overflow it, for good (the completion is
lost, poll raises CQOverflowError, the QP that released it goes to ERR), the same error as without shift.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from libshift.shift.paths import PRIMARY
from libshift.verbs import CQ, WC, CQOverflowError, VerbsError, VerbsRDMAError

if TYPE_CHECKING:
    from libshift.shift.context import ShiftContext

CQ_SLACK = 4096  # room in the provider CQs for completions the application never sees (unsignaled sends)


class ShiftCQ:
    """The application's CQ: completions of every path, in each QP's posting order, with its own wr_ids.
    `on[path]` is the provider CQ of a path; `primary` the default path's."""

    def __init__(
        self,
        ctx: ShiftContext,
        cqe: int,
        cq_context: object = None,
        channel: ShiftCompChannel | None = None,
        comp_vector: int = 0,
    ) -> None:
        if channel is not None and channel.ctx is not ctx:
            raise VerbsError("a ShiftCQ's completion channel must belong to the same ShiftContext")
        self.ctx = ctx
        self.cqe = cqe
        self.channel = channel
        self._armed = False
        watched = channel is not None
        self.on = {
            path: CQ(device, cqe + CQ_SLACK, channel=ctx.watch(path) if watched else None)
            for path, device in ctx.devices.items()
        }
        self.primary = self.on[PRIMARY]
        self.ready: deque[WC] = deque()
        self.overflowed = False
        with ctx.lock:
            ctx.cqs.append(self)

    def push(self, wc: WC) -> bool:
        """A completion released to the application; False once the CQ has overflowed (the completion is
        lost, as on an RNIC). An armed CQ tells its channel (once per arming), of an overflow too: a
        waiter must wake to meet the error."""
        if self.overflowed or len(self.ready) >= self.cqe:
            self.overflowed = True
        else:
            self.ready.append(wc)
        if self._armed and self.channel is not None:
            self._armed = False
            self.channel.notify(self)
        return not self.overflowed

    def req_notify(self, solicited_only: bool = False) -> None:
        """Arm: the next completion released to this CQ raises an event on its channel (any completion:
        solicited_only is accepted and treated as False)."""
        if self.channel is None:
            raise VerbsRDMAError("req_notify needs a CQ created with a completion channel")
        with self.ctx.lock:
            self._armed = True

    def ack_events(self, num_events: int = 1) -> None:
        """Accepted for pyverbs compatibility; events need no acknowledgement here."""

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:
        self.ctx.progress()
        if not self.ready and not self.overflowed:  # the common busy poll: no second trip through the lock
            return 0, []
        with self.ctx.lock:
            if self.overflowed:
                raise CQOverflowError(f"CQ overflow: more than {self.cqe} completions were not polled")
            count = min(num_entries, len(self.ready))
            wcs = [self.ready.popleft() for _ in range(count)]
        return count, wcs

    def close(self) -> None:
        with self.ctx.lock:
            if self in self.ctx.cqs:
                self.ctx.cqs.remove(self)
        for cq in reversed(self.on.values()):
            cq.close()


class ShiftCompChannel:
    """Blocking waits for ShiftCQs: arm a CQ with req_notify(), then get_cq_event(), as with CompChannel.

    The waiting thread itself waits on the default path's provider channel and makes progress on what
    comes (ShiftContext.serve); while traffic is on a backup path, or when no thread waits, the context's
    watcher threads make progress and raise the events.
    """

    def __init__(self, ctx: ShiftContext) -> None:
        self.ctx = ctx
        self._cond = threading.Condition()
        self._events: deque[ShiftCQ] = deque()

    def notify(self, cq: ShiftCQ) -> None:
        with self._cond:
            self._events.append(cq)
            self._cond.notify()
        self.ctx.wake_servers()

    def get_cq_event(self, cq: ShiftCQ | None = None, timeout: float | None = None) -> ShiftCQ:
        """Block until an armed CQ of this channel gets a completion; TimeoutError after `timeout` s."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                if self._events:
                    return self._events.popleft()
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no completion event within {timeout} s")
            if not self.ctx.serve(left, lambda: bool(self._events)):
                with self._cond:
                    self._cond.wait_for(lambda: self._events, left)

    def close(self) -> None:
        """Nothing to release: the channel is plain memory."""
