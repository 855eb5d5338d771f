"""Completion queues and completion channels over pyverbs.

pyverbs' get_cq_event must be told which CQ to expect, and an event of another CQ is lost on the way (and
never acknowledged, so destroying that CQ would hang). So a libshift channel is a set of pyverbs channels,
one per CQ: the event file that becomes readable names its CQ. The wait is a poll() on those files (fds.py)
and the event is acknowledged at once, as libshift's CQ.ack_events promises.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from libshift.providers import ProviderChannel, ProviderCQ
from libshift.providers.verbs import fds
from libshift.providers.verbs.binding import load, mapped
from libshift.vocabulary.errors import CQOverflowError, VerbsRDMAError
from libshift.vocabulary.wr import WC

if TYPE_CHECKING:
    from libshift.providers.verbs.context import VerbsContext


class VerbsChannel(ProviderChannel):
    def __init__(self, ctx: VerbsContext) -> None:
        self.ctx = ctx
        self._members: dict[int, tuple[Any, VerbsCQ]] = {}  # event fd -> (pyverbs channel, CQ)
        self._waiting = threading.Lock()  # one waiter consumes events at a time: readable means "ours"
        self._changing = threading.Lock()  # members change, or one is consumed: never both at once
        self._waker = fds.Waker()
        self._closed = False

    def attach(self, cq_for: Any) -> Any:
        """A pyverbs channel of its own for the CQ that is being created (cq_for(channel) makes it)."""
        name = self.ctx.device.name
        with fds.new_fd(f"{name}: completion channel") as found, mapped(f"{name}: create_comp_channel"):
            channel = load().cq.CompChannel(self.ctx.context)
        try:
            fd = fds.require(found)
            cq = cq_for(channel)
        except BaseException:
            channel.close()
            raise
        with self._changing:
            self._members[fd] = (channel, cq)
        self._waker.wake()  # a waiter now blocked must add the new file to its poll
        return channel

    def detach(self, cq: VerbsCQ) -> None:
        if self._closed:
            return  # its pyverbs channels closed with it (a CQ closed after its channel)
        with self._changing:
            for fd, (channel, member) in list(self._members.items()):
                if member is cq:
                    del self._members[fd]
                    channel.close()
        self._waker.wake()

    def get_cq_event(self, timeout: float | None) -> VerbsCQ | None:
        end = None if timeout is None else time.monotonic() + timeout
        with self._waiting:
            while True:
                if self._closed:
                    return None  # closed under the wait: no event can come
                left = None if end is None else max(0.0, end - time.monotonic())
                with self._changing:
                    watched = [self._waker.fd, *self._members]
                ready = fds.wait_readable(watched, left)
                self._waker.clear()
                for fd in ready:
                    if (cq := self._consume(fd)) is not None:
                        return cq
                if left == 0.0:
                    return None

    def _consume(self, fd: int) -> VerbsCQ | None:
        """Take the event waiting on `fd`, unless its CQ left the channel meanwhile."""
        with self._changing:
            if fd not in self._members:
                return None
            channel, cq = self._members[fd]
            with mapped(f"{self.ctx.device.name}: get_cq_event"):
                channel.get_cq_event(cq.cq)  # returns at once: the file is readable
                cq.cq.ack_events(1)
            return cq

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._waker.wake()  # a waiter leaves its poll() and the channel before the files close under it
        with self._waiting, self._changing:
            for channel, _cq in self._members.values():
                channel.close()
            self._members.clear()
            self._waker.close()


class VerbsCQ(ProviderCQ):
    def __init__(self, ctx: VerbsContext, cqe: int, channel: VerbsChannel | None) -> None:
        self.ctx = ctx
        self.channel = channel
        self._lock = threading.Lock()  # poll and close never overlap: pyverbs would poll the freed CQ
        self._closed = False
        # Overrun: rxe drops the completion, raises IBV_EVENT_CQ_ERR (pyverbs does not say of which CQ) and
        # leaves the QPs as they are. Counting the completions that may be queued names the CQ that can
        # have overrun; the context then moves its QPs to ERR and poll raises, as on other RNICs.
        self._expected = 0  # signaled sends and receives posted to QPs of this CQ, minus those polled
        self._counting = threading.Lock()
        self.overrun = False
        pv = load()
        with mapped(f"{ctx.device.name}: create_cq of {cqe} entries"):
            if channel is None:
                self.cq = pv.cq.CQ(ctx.context, cqe)
            else:
                channel.attach(self._make(pv, cqe))
        self.capacity: int = self.cq.cqe  # as granted: rxe rounds the size up

    def _make(self, pv: Any, cqe: int) -> Any:
        def make(pv_channel: Any) -> VerbsCQ:
            self.cq = pv.cq.CQ(self.ctx.context, cqe, None, pv_channel)
            return self

        return make

    def poll(self, num_entries: int) -> list[WC]:
        with self._lock, mapped(f"{self.ctx.device.name}: poll_cq"):
            if self._closed:
                raise VerbsRDMAError(f"{self.ctx.device.name}: poll_cq on a closed CQ")
            if self.overrun:
                raise CQOverflowError(f"CQ overflow: more than {self.capacity} completions were not polled")
            _count, raw = self.cq.poll(num_entries)
        with self._counting:
            self._expected = max(0, self._expected - len(raw))  # unsignaled WRs' errors complete too
        return [self.ctx.completion(wc) for wc in raw]

    def expect(self) -> None:
        """A WR that will complete here was posted."""
        with self._counting:
            self._expected += 1

    def may_have_overrun(self) -> bool:
        with self._counting:
            return self._expected > self.capacity

    def req_notify(self, solicited_only: bool) -> None:
        with mapped(f"{self.ctx.device.name}: req_notify_cq"):
            self.cq.req_notify(solicited_only)

    def close(self) -> None:
        with self._lock, mapped(f"{self.ctx.device.name}: destroy_cq"):
            self._closed = True
            self.cq.close()
        if self.channel is not None:
            self.channel.detach(self)
