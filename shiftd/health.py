"""Per-NIC health: the monitors' signals in, UP/DOWN/DEGRADED out, with flap damping.

A pure state machine (no I/O, no clock of its own): every input carries `now`, so the daemon
drives it from its event loop and the tests from a fake clock. Going DOWN is immediate because
that is what lets libshift fail over before the transport's retry timeout; coming back is
damped, because failing back onto a link that bounces costs more than staying on the backup:
always by the fixed hold-down, and for a NIC that keeps flapping by its penalty (damping.py). A NIC whose
TCP traffic is being lost (its loss judge, loss.py) is DEGRADED (retransmits), and one whose TCP traffic
runs far below its best (its speed judge, slow.py) DEGRADED (slow), until the judge clears it.
"""

from __future__ import annotations

from dataclasses import dataclass

from shiftd.config import DampingConfig, LossConfig, SlowConfig
from shiftd.damping import FlapDamper
from shiftd.loss import REASON as LOSS_REASON
from shiftd.loss import LossJudge
from shiftd.nic import FaultMode, LinkStatus, NicSpec, NicState, PeerTraffic, PortStatus
from shiftd.slow import REASON as SLOW_REASON
from shiftd.slow import SlowJudge

# An operator's fault that takes the NIC out of service: DOWN, so the agents fail over at once.
FAULT_REASONS = {
    FaultMode.DOWN: "operator_down",
    FaultMode.BLACKHOLE: "operator_blackhole",
    FaultMode.FLAP: "operator_flap",
}
# A gray fault leaves the NIC carrying traffic, only worse: DEGRADED, on which agents stay (the point
# of injecting it is to see what the traffic does) but onto which they do not fail back.
GRAY_FAULT_REASONS = {FaultMode.LOSSY: "operator_lossy", FaultMode.SLOW: "operator_slow"}
# RDMA port states in which the port carries traffic; DOWN/NOP are unusable, the rest
# (INIT, ARMED) mean the link trained but the port is not ready: DEGRADED.
ACTIVE_PORT_STATES = ("ACTIVE", "ACTIVE_DEFER")
DOWN_PORT_STATES = ("DOWN", "NOP")
# the reasons of a NIC that works again but is held DOWN: by the hold-down, or suppressed by its penalty
HELD_REASONS = ("hold_down", "flap_damped")


@dataclass(frozen=True)
class Transition:
    """A change of a NIC's state; `at` is the `now` of the input that caused it."""

    device: str
    previous: NicState
    state: NicState
    reason: str
    at: float


class NicHealth:
    """The health of one NIC.

    Starts UNSPECIFIED and decides as soon as it knows enough: DOWN on the first unusable
    signal, otherwise UP (or DEGRADED) once every signal the NIC has is known (the link when it
    has a netdev, the RDMA port when it is a verbs device). State changes produce a Transition,
    and so does a relapse: a new problem while DOWN in hold-down is a DOWN again (DOWN -> DOWN),
    because whoever started to use the NIC meanwhile (its link works; a job may connect its QPs
    there in those seconds) must hear that it broke again. `reason` always tells the current
    cause, including while held DOWN ("hold_down", or "flap_damped" while the penalty suppresses).

    A flap, for the penalty, is the NIC's own signals going from usable to unusable; what an
    operator's fault does to the link is not one (the operator meant it).
    """

    def __init__(
        self,
        spec: NicSpec,
        hold_down_seconds: float,
        damping: DampingConfig | None = None,
        loss: LossConfig | None = None,
        slow: SlowConfig | None = None,
    ) -> None:
        self.spec = spec
        self.hold_down_seconds = hold_down_seconds
        self.damper = FlapDamper(damping or DampingConfig())
        self.loss = LossJudge(loss or LossConfig(), damping or DampingConfig())
        self.slow = SlowJudge(slow or SlowConfig(), damping or DampingConfig())
        self.state = NicState.UNSPECIFIED
        self.reason = ""
        self.link: LinkStatus | None = None
        self.port: PortStatus | None = None
        self.present = True
        self.fault = FaultMode.NONE
        self.link_events = 0  # flips of the link between usable and unusable, for metrics
        self.last_change: float | None = None  # `now` of the last state change
        self._hold_until: float | None = None
        self._usable = False  # the NIC's own signals, all known and all good, at the last input

    # inputs

    def update_link(self, link: LinkStatus, now: float) -> Transition | None:
        """A netlink report for this NIC's netdev."""
        if self.link is not None and self.link.usable != link.usable:
            self.link_events += 1
        self.link = link
        return self._evaluate(now)

    def update_port(self, port: PortStatus, now: float) -> Transition | None:
        """A sysfs report for this NIC's RDMA port."""
        self.port = port
        return self._evaluate(now)

    def set_present(self, present: bool, now: float) -> Transition | None:
        """The device was removed (udev remove) or came back (udev add)."""
        self.present = present
        return self._evaluate(now)

    def set_fault(self, fault: FaultMode, now: float) -> Transition | None:
        """An operator's fault: DOWN until cleared, or DEGRADED for a gray one (lossy, slow)."""
        self.fault = fault
        return self._evaluate(now)

    def update_traffic(
        self, segments: int, retransmitted: int, now: float, by_peer: tuple[PeerTraffic, ...] = ()
    ) -> Transition | None:
        """What the NIC's connections sent since the last poll, and how much of it was sent again; the same
        by peer address, where known (TCP)."""
        if not self.loss.add(now, segments, retransmitted, by_peer):
            return None
        return self._evaluate(now)

    def update_throughput(
        self, acked: int, limited: int, busy: float, now: float, by_peer: tuple[PeerTraffic, ...] = ()
    ) -> Transition | None:
        """The bytes the NIC's TCP connections had acknowledged since the last poll, of those the ones the
        network held back, and how long those were in flight (0: not known)."""
        if not self.slow.add(now, acked, limited, busy, by_peer):
            return None
        return self._evaluate(now)

    @property
    def judged_bad(self) -> bool:
        """Whether the NIC's own traffic shows it degraded (lost, or slow against its best)."""
        return self.loss.degraded or self.slow.degraded

    def tick(self, now: float) -> Transition | None:
        """Let timers fire: call at next_deadline() (a late call is fine)."""
        return self._evaluate(now)

    def next_deadline(self) -> float | None:
        """When tick() may change the state (the end of the hold-down or suppression), or None."""
        return self._hold_until

    # decisions

    def _evaluate(self, now: float) -> Transition | None:
        self._count_flap(now)
        problem = self._problem()
        if problem is not None:
            self._hold_until = None
            return self._move(NicState.DOWN, problem, now)
        if self._waiting_for_signals():
            return None
        degraded = self._degradation()
        target = NicState.DEGRADED if degraded else NicState.UP
        if self.state is not NicState.DOWN:
            return self._move(target, degraded or "up", now)
        if self._hold_until is None:  # set once per recovery: only a new flap, which resets it, moves it
            self._hold_until = max(now + self.hold_down_seconds, self.damper.release(now) or now)
        if now < self._hold_until:
            self.reason = "flap_damped" if self.damper.suppressed(now) else "hold_down"
            return None
        self._hold_until = None
        return self._move(target, degraded or "recovered", now)

    def _count_flap(self, now: float) -> None:
        usable = self._signal_problem() is None and not self._waiting_for_signals()
        if self._usable and not usable and self.fault not in FAULT_REASONS:
            self.damper.flap(now)
        self._usable = usable

    def _problem(self) -> str | None:
        """Why the NIC cannot carry traffic now, most fundamental cause first; None if it can."""
        return FAULT_REASONS.get(self.fault) or self._signal_problem()

    def _signal_problem(self) -> str | None:
        """What the NIC's own signals say is wrong, whatever an operator did; None if nothing."""
        if not self.present:
            return "device_removed"
        link = self.link
        if link is not None:
            if not link.present:
                return "netdev_removed"
            if not link.admin_up:
                return "admin_down"
            if not link.carrier:
                return "carrier_lost"
            if not link.usable:
                return "oper_down"
        if self.port is not None and self.port.state in DOWN_PORT_STATES:
            return "port_down"
        return None

    def _degradation(self) -> str | None:
        """Why a NIC that can carry traffic is not fully healthy; None if it is. What the traffic itself
        shows comes first: it is what the agents act on (shiftd moves the traffic off a NIC found losing it),
        whatever an operator did to cause it."""
        if self.loss.degraded:
            return LOSS_REASON
        if self.slow.degraded:
            return SLOW_REASON
        if self.fault in GRAY_FAULT_REASONS:
            return GRAY_FAULT_REASONS[self.fault]
        if self.port is not None and self.port.state not in ACTIVE_PORT_STATES:
            return "port_not_active"
        return None

    def _waiting_for_signals(self) -> bool:
        needs_link = bool(self.spec.netdev) and self.link is None
        needs_port = self.spec.provider == "verbs" and self.port is None
        return needs_link or needs_port

    def _move(self, state: NicState, reason: str, now: float) -> Transition | None:
        held = self.state is NicState.DOWN and self.reason in HELD_REASONS
        relapse = held and state is NicState.DOWN and reason not in HELD_REASONS
        # a DEGRADED NIC with a new cause is news too: the agents act on the traffic's own loss, not on an
        # operator's gray fault, and must hear when one becomes the other
        regraded = state is self.state is NicState.DEGRADED and reason != self.reason
        self.reason = reason
        if state is self.state and not (relapse or regraded):
            return None
        previous, self.state, self.last_change = self.state, state, now
        return Transition(self.spec.device, previous, state, reason, now)
