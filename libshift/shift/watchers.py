"""The context's watcher threads, one per device channel.

A watcher makes progress whenever a CQ armed on its channel gets a completion, so that nothing waits for
the application to poll: the backup path's for the peer's notifications and control messages, both paths'
for completion channels of ShiftCQs. An application thread that blocks on a ShiftCQ leads on the default
path's channel itself (ShiftCompChannel, fast_chan.c), and the default path's watcher keeps off the channel
meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from libshift.shift.detect import EITHER_ASK_EVERY
from libshift.shift.paths import PRIMARY
from libshift.verbs import CQ, CompChannel, VerbsError

if TYPE_CHECKING:
    from libshift.shift.context import ShiftContext
    from libshift.shift.qp import ShiftQP

log = logging.getLogger("libshift.shift")
WATCH_PERIOD = 0.25  # the watcher also polls this often, so nothing waits on a missed wake-up
SCAN_PERIOD = 0.01  # the backup watcher reads the QPs' control messages at most this often (and at least
# every WATCH_PERIOD): with a thousand QPs a scan on every wake-up of a failover cost more than the failover
VISIT_BATCH = 64  # QPs a watcher follows or scans between two looks at its channel: with a thousand QPs,
# a whole round (tens of ms) between two passes held back the peer's counts that a failover waits for


class Round:
    """The QPs a watcher still has to visit, in order, each queued once (under the context's lock)."""

    def __init__(self) -> None:
        self._queue: deque[ShiftQP] = deque()
        self._queued: set[ShiftQP] = set()

    def add(self, qps: Iterable[ShiftQP]) -> None:
        """Queue the QPs not queued yet, behind the others (a QP queued keeps its place)."""
        for qp in qps:
            if qp not in self._queued:
                self._queued.add(qp)
                self._queue.append(qp)

    def take(self) -> list[ShiftQP]:
        """The next VISIT_BATCH QPs, off the queue."""
        batch = [self._queue.popleft() for _ in range(min(VISIT_BATCH, len(self._queue)))]
        self._queued.difference_update(batch)
        return batch

    def __bool__(self) -> bool:
        return bool(self._queue)


class Watchers:
    """The watcher threads of one context, and the application threads waiting on its default channel."""

    def __init__(self, ctx: ShiftContext) -> None:
        self.ctx = ctx
        self.channels: dict[str, CompChannel] = {}  # per path: the watchers' provider channels
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._scanned = 0.0  # when the backup watcher last began to read the control messages
        self._to_follow = Round()  # QPs to follow, after the core made switches
        self._to_scan = Round()  # QPs whose control messages the backup watcher is still to read

    def watch(self, path: str) -> CompChannel:
        """The provider channel of `path`, with its watcher thread."""
        ctx = self.ctx
        with ctx.lock:
            if path not in self.channels:
                self.channels[path] = CompChannel(ctx.devices[path])
                if path == PRIMARY:  # where the applications' waits lead
                    ctx.fast.set_serve(self.channels[path].impl.native)
                watcher = threading.Thread(
                    target=self._watch, args=(path,), name=f"libshift-{ctx.name}-{path}", daemon=True
                )
                self._threads.append(watcher)
                watcher.start()
            return self.channels[path]

    def close(self) -> None:
        self._closing.set()
        for watcher in self._threads:
            watcher.join(timeout=2)

    # -- a watcher's loop ----------------------------------------------------------------------------------

    def _watch(self, path: str) -> None:
        ctx, channel = self.ctx, self.channels[path]
        while not self._closing.is_set():
            # an application's wait leads on the default path's channel now, or did a moment ago: two
            # waiters on one channel take each other's events
            rest = ctx.fast.watch_begin() if path == PRIMARY else 0.0
            if rest > 0:
                self._closing.wait(rest)
                continue
            try:
                self._look(path, channel)
            finally:
                if path == PRIMARY:
                    ctx.fast.watch_end()

    def _look(self, path: str, channel: CompChannel) -> None:
        """A pass of progress, the core's switches followed, and a wait on the channel."""
        ctx = self.ctx
        try:
            with ctx.lock:
                for cq in self._armable(path):
                    cq.req_notify()
            ctx.progress(everything=True)
            self._follow_core()
            if path != PRIMARY:
                self._scan()
        except VerbsError as exc:  # a refused control verb: say so, keep watching the other QPs
            log.warning("%s: %s", ctx.name, exc)
        wait = EITHER_ASK_EVERY if ctx.doubtful else WATCH_PERIOD  # a doubt is asked about again soon
        if self._to_follow or (path != PRIMARY and self._to_scan):
            wait = 0.0  # only a look at the channel before the next batch
        with contextlib.suppress(TimeoutError):
            channel.get_cq_event(timeout=wait)

    def _follow_core(self) -> None:
        """Follow the switches the core made, here, not in the application's poll (a thousand QPs moved at
        once cost a poll tens of ms), VISIT_BATCH QPs at a time; whatever acts on a QP follows it first
        anyway."""
        ctx = self.ctx
        with ctx.lock:
            if ctx.fast.take_news():
                self._to_follow.add(ctx.qps.values())
            batch = self._to_follow.take()
        for qp in batch:
            with ctx.lock:
                qp.switcher.follow_core()

    def _scan(self) -> None:
        """Act on the control messages (REARM/ARMED: writes, which raise no completion), retry default
        paths left silently, and settle the error completions in doubt: a round of every QP at most every
        SCAN_PERIOD, VISIT_BATCH QPs at a time."""
        ctx, now = self.ctx, time.monotonic()
        doubtful: set[ShiftQP] = set()
        with ctx.lock:
            if not self._to_scan and now - self._scanned >= SCAN_PERIOD:
                self._scanned = now
                self._to_scan.add(ctx.qps.values())
                doubtful = set(ctx.doubtful)
            batch = self._to_scan.take()
        for qp in batch:
            with ctx.lock:  # one QP at a time
                qp.switcher.follow_core()
                qp.rearm.read()
                qp.rearm.retry_default(now)
                qp.switcher.check_fence(now)
        for qp in doubtful:
            qp.doubt.settle(now)

    def _armable(self, path: str) -> list[CQ]:
        """The provider CQs of `path` that report to its watcher's channel."""
        ctx = self.ctx
        found = [cq.on[path] for cq in ctx.cqs.values() if cq.channel is not None]
        control = ctx.control_cqs.get(path)
        return found if control is None else [*found, control]
