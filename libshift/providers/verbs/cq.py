"""Completion queues and completion channels over the core's verbs backend.

One backend channel serves every CQ made on it: an event names its CQ by the cookie the CQ was made with
(the context's registry), and is acknowledged as it is taken, as libshift's CQ.ack_events promises. The
wait releases the interpreter lock; a channel closed under a wait ends it at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from libshift.core import _verbs
from libshift.providers import ProviderChannel, ProviderCQ
from libshift.providers.verbs.binding import native
from libshift.vocabulary.errors import CQOverflowError, VerbsRDMAError
from libshift.vocabulary.wr import WC

if TYPE_CHECKING:
    from libshift.providers.verbs.context import VerbsContext


class VerbsChannel(ProviderChannel):
    def __init__(self, ctx: VerbsContext) -> None:
        self.ctx = ctx
        with native(f"{ctx.device.name}: create_comp_channel"):
            self.channel = _verbs.Channel(ctx.native)
        ctx.adopt(self)

    @property
    def native(self) -> _verbs.Channel:
        return self.channel

    def get_cq_event(self, timeout: float | None) -> VerbsCQ | None:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            cookie = self.channel.wait(left)
            if cookie is None:
                return None  # the time is up, or the channel was closed under the wait
            if (cq := self.ctx.cqs.get(cookie)) is not None:
                return cq
            if left == 0.0:
                return None  # the event of a CQ closed meanwhile, and no time to wait for another

    def close(self) -> None:
        self.ctx.release(self)  # its CQs first: libibverbs keeps a channel while a CQ uses it
        self.channel.close()


class VerbsCQ(ProviderCQ):
    def __init__(self, ctx: VerbsContext, cqe: int, channel: VerbsChannel | None) -> None:
        self.ctx = ctx
        self.channel = channel
        self.overrun = False  # the device said so (CQ_ERR): the context moved its QPs to ERR
        self.closed = False
        self.cookie = ctx.next_cookie()
        with native(f"{ctx.device.name}: create_cq of {cqe} entries"):
            self.cq = _verbs.CQ(ctx.native, cqe, None if channel is None else channel.channel, self.cookie)
        self.capacity: int = self.cq.cqe
        ctx.cqs[self.cookie] = self
        if channel is None:
            ctx.adopt(self)
        else:
            ctx.adopt(self, channel)

    @property
    def native(self) -> _verbs.CQ:
        return self.cq

    def poll(self, num_entries: int) -> list[WC]:
        if self.closed:
            raise VerbsRDMAError(f"{self.ctx.device.name}: poll_cq on a closed CQ")
        got = None if self.overrun else self.cq.poll(num_entries)
        if got is None:
            self.overrun = True
            raise CQOverflowError(f"CQ overflow: more than {self.capacity} completions were not polled")
        return [self.ctx.completion(wc) for wc in got]

    def req_notify(self, solicited_only: bool) -> None:
        with native(f"{self.ctx.device.name}: req_notify_cq"):
            self.cq.req_notify(solicited_only)

    def close(self) -> None:
        self.ctx.release(self)  # its QPs first
        self.closed = True
        self.ctx.cqs.pop(self.cookie, None)
        with native(f"{self.ctx.device.name}: destroy_cq"):
            self.cq.close()
