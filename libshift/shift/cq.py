"""ShiftCQ and ShiftCompChannel: the application's completion queue over all its paths, and blocking waits.

A ShiftCQ has a provider CQ on each device; polling it makes the context's fast path (the core's,
handover.py) take every completion out of the provider CQs and hand it to its QP, which releases
completions to the application in posting order, in C while the QP is in its steady state. The provider
CQs have room to spare (CQ_SLACK), so the ShiftCQ itself holds the application to its `cqe`, as an RNIC's
CQ does: more than `cqe` completions released and not polled overflow it, for good (the completion is
lost, poll raises CQOverflowError, the QP that released it goes to ERR), the same error as without shift.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from libshift.shift.paths import PRIMARY
from libshift.verbs import CQ, WC, VerbsError, VerbsRDMAError

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
        watched = channel is not None
        self.on = {
            path: CQ(device, cqe + CQ_SLACK, channel=ctx.watchers.watch(path) if watched else None)
            for path, device in ctx.devices.items()
        }
        self.primary = self.on[PRIMARY]
        with ctx.lock:
            natives = [cq.impl.native for cq in self.on.values()]
            events = None if channel is None else channel.fast
            self.fast = ctx.fastpath.FastCQ(ctx.fast, cqe, natives, id(self), events)
            ctx.cqs[id(self)] = self

    def push(self, wc: WC) -> bool:
        """A completion released to the application; False once the CQ has overflowed (the completion is
        lost, as on an RNIC). An armed CQ raises its event on its channel (once per arming; in the core), of
        an overflow too: a waiter must wake to meet the error."""
        return bool(self.fast.push(wc))

    def req_notify(self, solicited_only: bool = False) -> None:
        """Arm: the next completion released to this CQ raises an event on its channel (any completion:
        solicited_only is accepted and treated as False)."""
        if self.channel is None:
            raise VerbsRDMAError("req_notify needs a CQ created with a completion channel")
        self.fast.arm()

    def ack_events(self, num_events: int = 1) -> None:
        """Accepted for pyverbs compatibility; events need no acknowledgement here."""

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:
        return self.fast.poll(num_entries)  # a pass of the context's progress, then what is ready

    def close(self) -> None:
        with self.ctx.lock:
            self.ctx.cqs.pop(id(self), None)
            self.fast.close()  # before the provider CQs it reads
        for cq in reversed(self.on.values()):
            cq.close()


class ShiftCompChannel:
    """Blocking waits for ShiftCQs: arm a CQ with req_notify(), then get_cq_event(), as with CompChannel.

    The channel is the core's (fast_chan.c). Of the threads waiting on a context's channels, one leads: it
    waits on the default path's provider channel and makes the progress on what comes there itself, so
    that no thread stands between the wire and the application, as with a bare channel; the others wait
    for their events or for the lead. While traffic is on a backup path, or when no thread waits, the
    context's watcher threads make progress and raise the events.
    """

    def __init__(self, ctx: ShiftContext) -> None:
        self.ctx = ctx
        self.fast = ctx.fastpath.FastChannel(ctx.fast)
        self._pass = ctx.fastpath.PASS

    def notify(self, cq: ShiftCQ) -> None:
        """An event of `cq` raised from Python: it wakes the thread waiting on the channel."""
        self.fast.raise_event(id(cq))

    def get_cq_event(self, cq: ShiftCQ | None = None, timeout: float | None = None) -> ShiftCQ:
        """Block until an armed CQ of this channel gets a completion; TimeoutError after `timeout` s."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            got = self.fast.wait(left)
            if got is None:
                raise TimeoutError(f"no completion event within {timeout} s")
            if got == self._pass:  # what the failover layer must see first (it may raise events)
                self.ctx.progress()
            elif (found := self.ctx.cqs.get(got)) is not None:
                return found

    def close(self) -> None:
        """A thread waiting returns (TimeoutError); the CQs made on the channel raise no more events."""
        self.fast.close()
