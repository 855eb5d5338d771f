"""The switch of one ShiftQP between its paths, and the failback's fence (docs/failover.md, "The switch").

The same steps move traffic any way (failover: default -> backup, or on to the backup's backup; failback:
back to the default path): stop the old path, keep what completed, move the receives, send our count of
completed two-sided receives; when the peer's count is in, settle what it has and post the rest again. The
path moved to is the first armed one in the policy's order. The states it moves through are states.py's.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, NamedTuple

from libshift.core._core import NEWS_SWITCHED, REASON_NIC_EVENT
from libshift.notices import SwitchKind, SwitchReport
from libshift.shift import handover, notify, steps
from libshift.shift.lost import why_no_path
from libshift.shift.paths import PATHS, PRIMARY
from libshift.shift.states import AWAITING_COUNT, SWITCHABLE, Send, State, Transition

if TYPE_CHECKING:
    from libshift.shift.qp import ShiftQP

log = logging.getLogger("libshift.shift")
FENCE_WAIT = 0.1  # the longest a failback waits for the backup's sends to complete before stopping them


class Move(NamedTuple):
    """The switch under way or last made, as it will be reported."""

    reason: str
    started: float  # time.monotonic() at detection
    moved: int  # receives moved onto the new path
    left: str  # the path it started from


class Switcher:
    """The switches of one QP: where to, the handshake of receive counts, the fence of a failback."""

    def __init__(self, qp: ShiftQP) -> None:
        self.qp = qp
        self._peer_count: dict[str, int | None] = dict.fromkeys(qp.ctx.devices)
        self._move = Move("", 0.0, 0, PRIMARY)
        self._fence_until = 0.0  # while WAIT_SIGNALED: when the fence gives up waiting
        self.core_moves = 0  # switches the core made (fast_switch.c), for diagnostics

    def escape(self) -> str | None:
        """Where the current path is left for when it fails: the first armed path in the policy's order
        (the default one when a failback has re-armed it), also in the middle of a switch (before the
        peer's count came): each side's count is its total received, final once the path it left is
        stopped, so a second switch settles by the count sent on the path it ends on."""
        qp = self.qp
        if not qp.states.live:
            return None
        return next((path for path in qp.peers if path != qp.current and qp.armed[path]), None)

    def switch_to(self, to: str, reason: str) -> None:
        """Leave the current path: stop it, keep what completed, move the receives, send our count."""
        qp, ctx = self.qp, self.qp.ctx
        handover.take(qp)
        if to == qp.current or qp.states.send not in SWITCHABLE or not qp.armed[to]:
            return
        started, left, resumed = time.monotonic(), qp.current, qp.states.send not in AWAITING_COUNT
        if reason == "error_completion":  # the data path's own detection, when no NIC event came first
            steps.note(qp.qp_num, reason)
        steps.note(qp.qp_num, "switch")
        qp.states.step(Transition.STOP)  # the fence's held sends go with the rest, after the peer's count
        qp.doubt.end(surface=False)  # what it held failed on the path left: settled with the rest
        qp.qps[left].to_err()  # nothing more lands on the old path: our receive count is final
        leaving = qp.qps[left].qp_num
        for cq in {qp.send_cq, qp.recv_cq}:
            ctx.drain(cq, left, leaving)
        if left != PRIMARY:
            ctx.drain(None, left, leaving)  # its control CQ
        if qp.states.send is Send.BROKEN:
            return  # a completion drained overflowed the application's CQ: nothing to switch any more
        steps.note(qp.qp_num, "old_path_stopped")
        self._left(left, to)
        if to == PRIMARY and ctx.device_up(left):
            # a failback re-arms the backup it leaves now, before the handshake: both sides do it once here,
            # so that a failure of the default path in the middle of the handshake (the peer's count never
            # comes; the peer moves to the backup) finds somewhere to go
            qp.arm(left)
        moved = qp.ledger.rq.pending()
        if moved:  # together: one hold of the provider's lock, not one per receive
            qp.qps[to].post_recv_list([qp.provider_wr(entry) for entry in moved])
        for entry in qp.ledger.sq.pending():
            entry.path = None
        previous, self._move = self._move, Move(reason, started, len(moved), left)
        if not resumed:  # leaving a switch that never resumed: report the two as one move
            self._merge(previous, to)
        if to != PRIMARY:  # the peer's count comes on the backup path: every pass reads it meanwhile
            ctx.fast.heat_backups()
        # noted before the post: the peer may have our count and resume before the post returns to us
        steps.note(qp.qp_num, "count_sent")
        notify.send_count(qp.qps[to], qp.targets[to], qp.ledger.received)
        log.info("QP %d: switching to the %s path (%s)", qp.qp_num, to, reason)
        if self._peer_count[to] is not None:
            self._resume()

    def _left(self, left: str, to: str) -> None:
        """The path `left` is stopped and drained: the QP is on `to` now, awaiting the peer's count."""
        qp = self.qp
        qp.current, qp.armed[left] = to, False
        self._peer_count[left] = None  # a count on the path left belongs to a handshake that is over
        qp.rearm.lost()
        qp.states.step(Transition.FAILBACK if to == PRIMARY else Transition.FAILOVER)

    def _merge(self, previous: Move, to: str) -> None:
        """The switch before this one never resumed: report a single move from where that one started
        (with its detection time, and its reason when it was a failover too) unless it comes back there."""
        if previous.left != to:
            reason = previous.reason if self._move.left != PRIMARY else self._move.reason
            self._move = Move(reason, previous.started, self._move.moved, previous.left)

    def on_count(self, path: str, count: int) -> None:
        """The peer's count arrived on `path`: follow it there, or resume on the path we switched to."""
        qp = self.qp
        if qp.states.send is Send.STOPPING:
            return  # on the path being left: its handshake is over, the count goes with it
        if path == qp.current and qp.states.send not in AWAITING_COUNT:
            return
        steps.note(qp.qp_num, "peer_count")
        self._peer_count[path] = count
        if path != qp.current:
            self.switch_to(path, "peer_notification")
        else:
            self._resume()

    def _resume(self) -> None:
        """The peer's count is in: settle the sends it has, post the rest on the new path, in order."""
        qp = self.qp
        count, self._peer_count[qp.current] = self._peer_count[qp.current], None
        assert count is not None
        replay = qp.ledger.settle(qp.ledger.unwrap(count), qp.qp_num)
        rewound = sum(entry.posted for entry in replay)  # posted before, on a path since stopped
        if replay:  # together: one lock and one socket write in the tcp provider, not one per WR
            qp.qps[qp.current].post_send_list([qp.provider_wr(entry) for entry in replay])
        steps.note(qp.qp_num, "replay_posted")
        qp.states.step(Transition.RESUME)
        qp.deliver()
        self._resumed(rewound)
        handover.give(qp)

    def _resumed(self, rewound: int) -> None:
        """The switch is over: what to re-arm next, and shiftd's report."""
        qp = self.qp
        move, failback = self._move, qp.current == PRIMARY
        qp.rearm.resumed(failback, move.reason)
        devices = qp.ctx.devices
        qp.ctx.report(
            SwitchReport(
                kind=SwitchKind.FAILBACK if failback else SwitchKind.FAILOVER,
                device=devices[move.left].name,
                backup_device=devices[qp.current].name,
                default_device=qp.ctx.name,
                reason=move.reason,
                downtime_seconds=time.monotonic() - move.started,
                reposted_work_requests=move.moved + rewound,
                time_unix_nanos=time.time_ns(),
            )
        )

    # -- the switches the core made (fast_switch.c), told by the QP's news --------------------------------

    def follow_core(self) -> None:
        """Follow the switches the core made since we last looked: before anything here acts on the QP,
        under the context's lock, so that it acts on where the QP is."""
        for kind, left, to, reason, moved, at_ns, stopped_ns, then_ns in self.qp.fast.news():
            if kind == NEWS_SWITCHED:
                why = "nic_event" if reason == REASON_NIC_EVENT else "peer_notification"
                self.core_switched(PATHS[left], PATHS[to], why, moved, (at_ns, stopped_ns, then_ns))
            else:
                self.core_resumed(moved, at_ns, then_ns)

    def core_switched(self, left: str, to: str, reason: str, moved: int, moments: tuple[int, ...]) -> None:
        """The core left `left` for `to` in the QP's steady state, and sent our count: follow it here.
        `moments`: when it began, had stopped the old path, sent the count (CLOCK_MONOTONIC ns)."""
        qp = self.qp
        began_ns = moments[0]
        for step, at_ns in zip(("switch", "old_path_stopped", "count_sent"), moments, strict=True):
            steps.note(qp.qp_num, step, at_ns)
        qp.states.step(Transition.STOP)
        self._left(left, to)
        self._move = Move(reason, began_ns / 1e9, moved, left)
        self.core_moves += 1
        log.info("QP %d: switching to the %s path (%s, in the core)", qp.qp_num, to, reason)

    def core_resumed(self, rewound: int, counted_ns: int, replayed_ns: int) -> None:
        """The peer's count came to the core, which settled and replayed the sends."""
        qp = self.qp
        steps.note(qp.qp_num, "peer_count", counted_ns)
        steps.note(qp.qp_num, "replay_posted", replayed_ns)
        qp.states.step(Transition.RESUME)
        self._resumed(rewound)

    # -- the failback's fence (DESIGN's WAIT_SIGNALED) -----------------------------------------------------

    def probed(self) -> None:
        """The probe of the re-armed default path went through: fail back once the sends posted on the
        backup have completed, holding the application's new ones meanwhile (every provider WR is signaled,
        so the last one posted is the fence), so that a failback stops nothing in flight and sends nothing
        twice; at once when nothing is out. check_fence bounds the wait."""
        if self.qp.states.send is Send.FALLBACK and self._in_flight():
            self.qp.states.step(Transition.FENCE)
            self._fence_until = time.monotonic() + FENCE_WAIT
        else:
            self.switch_to(PRIMARY, "nic_recovered")

    def _in_flight(self) -> bool:
        """Whether a send posted on the current path has not completed yet."""
        current = self.qp.current
        return any(e.path == current and e.wc is None for e in self.qp.ledger.sq.entries)

    def completed(self) -> None:
        """A completion was taken: the fence is over once nothing is in flight."""
        if self.qp.states.send is Send.WAIT_SIGNALED and not self._in_flight():
            self._end_fence()

    def _end_fence(self) -> None:
        """The fence is over (its sends completed, or it timed out): fail back; or, when the default path
        is no longer armed (its NIC went down meanwhile), stay and post the held sends here, in order."""
        qp = self.qp
        if qp.armed[PRIMARY]:
            self.switch_to(PRIMARY, "nic_recovered")
            return
        qp.states.step(Transition.STAY)
        held = [e for e in qp.ledger.sq.pending() if e.path is None]
        if held:
            qp.qps[qp.current].post_send_list([qp.provider_wr(e) for e in held])

    def check_fence(self, now: float) -> None:
        """A fence that outlasts FENCE_WAIT (the backup stalls) fails back anyway: the receive counts settle
        what was in flight, as in any switch."""
        qp = self.qp
        if qp.states.send is not Send.WAIT_SIGNALED or now < self._fence_until:
            return  # the common case, on every scan of every QP: no lock for it
        with qp.ctx.lock:
            if qp.states.send is Send.WAIT_SIGNALED and now >= self._fence_until:
                self._end_fence()

    # -- shiftd's NIC events (the context's calls: they take its lock) -------------------------------------

    def nic_down(self) -> None:
        """shiftd says the default device is down: leave it (with nowhere to go, give up at once, see
        backup_down), or stop a failback that was under way."""
        qp = self.qp
        with qp.ctx.lock:
            qp.armed[PRIMARY] = False
            if qp.states.send is Send.WAIT_SIGNALED:  # a failback waiting for its fence: stay, post the held
                self._end_fence()
            if qp.state is not State.DEFAULT:
                return
            to = self.escape()
            if to is not None:
                self.switch_to(to, "nic_event")
            else:  # every backup's device is down too
                self._give_up(PRIMARY)

    def backup_down(self, path: str) -> None:
        """shiftd says the device of backup `path` is down. Off it, the path is no longer a place to go. On
        it, leave for the default path if that is re-armed (a failback under way), else for the next armed
        backup; with nowhere left, give up at once: the application gets its errors now, not after the ack
        deadline, and a side that only receives (which no deadline would ever wake) learns of it too."""
        qp = self.qp
        with qp.ctx.lock:
            if not qp.states.live or path not in qp.peers:
                return
            if path != qp.current:
                # stopped, not only skipped: a peer that moves there (it may not know) must not have its
                # count taken and left unanswered (a flapping link delivers it); its count meets the ack
                # deadline instead, and it moves on
                qp.armed[path] = False
                qp.qps[path].to_err()
                return
            to = self.escape()
            if to is not None:
                self.switch_to(to, "nic_event")
            else:
                self._give_up(path)

    def leave(self, path: str) -> None:
        """shiftd says to leave the device of `path`, which still works (DEGRADED, a healthy NIC beside it):
        a QP on it moves to the next armed path, and stays where there is none; a failback to it stops."""
        qp = self.qp
        if path == PRIMARY and qp.current != PRIMARY:
            self.nic_down()  # not on it: disarmed until it is UP again, as for a DOWN
            return
        if qp.current != path or qp.states.send not in SWITCHABLE:
            return
        to = self.escape()
        if to is not None:
            self.switch_to(to, "nic_event")

    def _give_up(self, path: str) -> None:
        """The device of the path in use failed with no armed path left."""
        why = why_no_path(self.qp) or f"QP {self.qp.qp_num}: the {path} path failed, no other is armed"
        self.give_up(why)

    def give_up(self, why: str) -> None:
        """No path is left (`why`, lost.py): the error goes to the application now. Every provider QP goes
        to ERR: what is posted flushes to the application, and a switch the peer tries onto a path it still
        counts as armed fails, so that it gets its error too."""
        log.warning("%s", why)
        self.qp.lost_paths = why
        self.qp.fail()
