"""The re-arm protocol of one ShiftQP: the peer and we reconnect a path we left, once its devices are UP.

REARM(path) goes to the peer over the path in use; the peer re-arms its side and answers ARMED(path), and
only then do we arm ours (each side arms once per request, the peer first, so the connection one side makes
is the one the other's armed QP takes; when both ask at once, the requests cross and each side arms on
the other's request, once, as well). One request at a time: a message overwrites the one before it in
the peer's control MR, so each ARMED asks for the next. ARMED(default) is followed by a probe of the default
path, whose completion starts the failback (switch.py). After a failure shiftd did not see (no NIC UP will
come), the default path is tried again now and then, backing off; the back-off goes on across a failback
whose path fails again soon after (a lossy link lets the probe through, then loses a message).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from libshift.shift import notify
from libshift.shift.notify import Kind, Message
from libshift.shift.paths import PRIMARY
from libshift.shift.states import AWAITING_COUNT, Send, State

if TYPE_CHECKING:
    from libshift.shift.qp import ShiftQP

log = logging.getLogger("libshift.shift")
RETRY_FIRST, RETRY_MAX = 1.0, 30.0  # how often to try the default path again when no NIC UP will come
# a default path that carried the traffic this long after a failback is mended: the back-off starts over
MENDED_AFTER = RETRY_MAX


class Rearm:
    """The requests of one QP, the peer's latest message on each path, and the retry schedule."""

    def __init__(self, qp: ShiftQP) -> None:
        self.qp = qp
        self.epoch = 0
        self.requested = ""  # the path our request is about, until it is armed ("": none)
        self._seen: dict[str, Message | None] = dict.fromkeys(qp.ctx.devices)
        self._retry_at: float | None = None  # when to try the default path again (see retry_default)
        self._retry_wait = RETRY_FIRST
        self._home_at: float | None = None  # when the last failback resumed
        # by path, the epoch of the peer's latest REARM we answered: one read later with an older epoch (it
        # came on another path, slower) is stale, and answering it would arm twice and overwrite our answer
        self._answered: dict[str, int] = {}

    def request(self, path: str) -> None:
        """Ask the peer to re-arm `path`; we arm ours when it answers ARMED."""
        self.qp.armed[path] = False
        self.epoch += 1
        self.requested = path
        self._send(Message(Kind.REARM, path, self.epoch))

    def next(self) -> None:
        """Ask for the re-arm of the first backup path that is down here while its device is UP again."""
        qp = self.qp
        if self.requested or qp.states.send in AWAITING_COUNT or qp.states.send is Send.BROKEN:
            return
        for path in qp.peers:
            if path not in (PRIMARY, qp.current) and not qp.armed[path] and qp.ctx.device_up(path):
                self.request(path)
                return

    def lost(self) -> None:
        """The path in use is left: a request in flight may be lost with it; `resumed` asks again."""
        self.requested = ""

    def resumed(self, failback: bool, reason: str) -> None:
        """A switch has resumed: what to re-arm next, and whether to keep trying the default path."""
        qp = self.qp
        now = time.monotonic()
        if failback:
            self._retry_at, self._home_at = None, now
        elif reason == "nic_event" and qp.ctx.device_up(PRIMARY):
            self.request(PRIMARY)  # the NIC came back while we were switching (away from it)
        elif reason == "error_completion":  # shiftd will not say when a silent failure ends: ask the path
            if self._home_at is None or now - self._home_at >= MENDED_AFTER:
                self._retry_wait = RETRY_FIRST
            self.retry_later()
        self.next()  # backups left behind whose NIC UP came while another request was out

    def probe_failed(self) -> None:
        """The default path's probe failed: the NIC UP that started this failback will not come again."""
        if self._retry_at is None:
            self.retry_later()

    def retry_later(self) -> None:
        """Have retry_default try the default path once the current wait is over."""
        self._retry_at = time.monotonic() + self._retry_wait

    def _send(self, message: Message) -> None:
        qp = self.qp
        path = qp.current
        log.debug("QP %d: %s sent on the %s path", qp.qp_num, message, path)
        notify.send_message(qp.qps[path], qp.controls[path], qp.targets[path], message)

    # -- the context's calls (they take its lock) ----------------------------------------------------------

    def read(self) -> None:
        """Act on the peer's latest control message on each path (the watcher calls this)."""
        qp = self.qp
        with qp.ctx.lock:
            if not qp.states.live:
                return
            for path, mr in qp.controls.items():
                message = notify.latest(mr)
                if message is None or message == self._seen[path]:
                    continue
                self._seen[path] = message
                log.debug("QP %d: %s read on the %s path (in %s)", qp.qp_num, message, path, qp.state.name)
                if message.kind == Kind.REARM and message.path != qp.current:
                    if message.epoch <= self._answered.get(message.path, 0):
                        continue
                    if message.path not in qp.peers or not qp.ctx.device_up(message.path):
                        continue  # our device of that path is still down: its NIC UP will ask for the re-arm
                    self._answered[message.path] = message.epoch
                    qp.arm(message.path)
                    if message.path == self.requested:
                        self.requested = ""  # a crossing request: armed as the peer asked
                    self._send(Message(Kind.ARMED, message.path, message.epoch))
                elif message == Message(Kind.ARMED, PRIMARY, self.epoch) and qp.state is State.FALLBACK:
                    if self.requested == PRIMARY:
                        qp.arm(PRIMARY)
                    # else the requests crossed (both NICs came back at once): we armed it on the peer's
                    # request, and a second arm would reset the connection the peer's arm has made
                    self.requested = ""
                    if qp.armed[PRIMARY]:
                        notify.probe(qp.primary, qp.targets[PRIMARY])
                elif message.path != PRIMARY and message == Message(Kind.ARMED, self.requested, self.epoch):
                    self.requested = ""
                    qp.arm(message.path)
                    self.next()

    def nic_up(self) -> None:
        """The default device is back: re-arm the default path on both sides, probe it, then switch back."""
        qp = self.qp
        with qp.ctx.lock:
            if qp.state is State.FALLBACK and qp.states.send not in AWAITING_COUNT and not qp.armed[PRIMARY]:
                self.request(PRIMARY)

    def backup_up(self) -> None:
        """The device of a backup is back: re-arm the backup paths that are down (one at a time)."""
        with self.qp.ctx.lock:
            self.next()

    def retry_default(self, now: float) -> None:
        """After a failure only our own completions saw (a black hole: shiftd's NIC stays UP, so no NIC UP
        will come), or a probe that failed after a NIC UP, try the default path again now and then, backing
        off: its probe moves the traffic home once the path carries traffic again, and fails harmlessly
        while it does not. The side that detected the failure (or probed) asks; the other follows its
        re-arm request."""
        if self._retry_at is None or now < self._retry_at:
            return  # the common case, on every scan of every QP: no lock for it
        qp = self.qp
        with qp.ctx.lock:
            if self._retry_at is None or now < self._retry_at:
                return
            if qp.state is not State.FALLBACK:
                self._retry_at = None
                return
            self._retry_at = now + self._retry_wait
            self._retry_wait = min(2 * self._retry_wait, RETRY_MAX)
            if qp.states.send not in AWAITING_COUNT and not qp.armed[PRIMARY] and qp.ctx.device_up(PRIMARY):
                self.request(PRIMARY)
