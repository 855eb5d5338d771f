"""The per-NIC health state machine, driven by a fake clock."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shiftd.config import DampingConfig
from shiftd.health import FAULT_REASONS, NicHealth, Transition
from shiftd.nic import FaultMode, LinkStatus, NicSpec, NicState, PortStatus

UP, DOWN, DEGRADED, UNSPEC = NicState.UP, NicState.DOWN, NicState.DEGRADED, NicState.UNSPECIFIED
HOLD = 2.0
NO_DAMPING = DampingConfig(penalty=0.0)
TCP = NicSpec("tcp0", "veth0", "tcp")
VERBS = NicSpec("mlx5_0", "ens1f0np0", "verbs")

GOOD = LinkStatus(
    "veth0", present=True, admin_up=True, operstate="up", carrier=True, addresses=("198.18.0.1",)
)
NO_CARRIER = replace(GOOD, carrier=False, operstate="lowerlayerdown")
ADMIN_DOWN = replace(GOOD, admin_up=False, carrier=False, operstate="down")
GONE = LinkStatus("veth0", present=False)
ACTIVE = PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp")
PORT_DOWN = PortStatus("mlx5_0", 1, "DOWN", "Disabled", link_downed=1)
PORT_INIT = PortStatus("mlx5_0", 1, "INIT", "LinkUp")


def up_nic(spec: NicSpec = TCP, now: float = 0.0, damping: DampingConfig | None = None) -> NicHealth:
    health = NicHealth(spec, HOLD, damping)
    health.update_link(GOOD, now)
    if spec.provider == "verbs":
        health.update_port(ACTIVE, now)
    assert health.state is UP
    return health


def test_usable_at_start_is_up_at_once_without_hold() -> None:
    health = NicHealth(TCP, HOLD)
    assert health.state is UNSPEC
    assert health.update_link(GOOD, 10.0) == Transition("tcp0", UNSPEC, UP, "up", 10.0)
    assert health.next_deadline() is None
    assert health.last_change == 10.0


def test_unusable_at_start_is_down_with_its_reason() -> None:
    health = NicHealth(TCP, HOLD)
    assert health.update_link(NO_CARRIER, 1.0) == Transition("tcp0", UNSPEC, DOWN, "carrier_lost", 1.0)


@pytest.mark.parametrize(
    ("link", "reason"),
    [
        (ADMIN_DOWN, "admin_down"),
        (NO_CARRIER, "carrier_lost"),
        (replace(GOOD, operstate="down"), "oper_down"),
        (replace(GOOD, operstate="dormant"), "oper_down"),
        (GONE, "netdev_removed"),
    ],
)
def test_link_problems_go_down_at_once(link: LinkStatus, reason: str) -> None:
    health = up_nic()
    assert health.update_link(link, 5.0) == Transition("tcp0", UP, DOWN, reason, 5.0)


def test_verbs_nic_waits_for_its_port_before_up_but_not_before_down() -> None:
    health = NicHealth(VERBS, HOLD)
    assert health.update_link(GOOD, 0.0) is None
    assert health.state is UNSPEC
    assert health.update_port(ACTIVE, 0.1) == Transition("mlx5_0", UNSPEC, UP, "up", 0.1)

    early = NicHealth(VERBS, HOLD)
    assert early.update_port(PORT_DOWN, 0.0) == Transition("mlx5_0", UNSPEC, DOWN, "port_down", 0.0)


def test_port_without_netdev_is_judged_on_the_port_alone() -> None:
    health = NicHealth(NicSpec("mlx5_2", "", "verbs"), HOLD)
    transition = health.update_port(replace(ACTIVE, device="mlx5_2"), 0.0)
    assert transition is not None and transition.state is UP


def test_port_down_goes_down_and_recovers_after_hold() -> None:
    health = up_nic(VERBS)
    assert health.update_port(PORT_DOWN, 1.0) == Transition("mlx5_0", UP, DOWN, "port_down", 1.0)
    assert health.update_port(ACTIVE, 2.0) is None
    assert (health.state, health.reason) == (DOWN, "hold_down")
    assert health.tick(4.0) == Transition("mlx5_0", DOWN, UP, "recovered", 4.0)


def test_degraded_and_back_without_hold() -> None:
    health = up_nic(VERBS)
    assert health.update_port(PORT_INIT, 1.0) == Transition("mlx5_0", UP, DEGRADED, "port_not_active", 1.0)
    assert health.update_port(replace(PORT_INIT, state="ARMED"), 1.5) is None
    assert health.update_port(ACTIVE, 2.0) == Transition("mlx5_0", DEGRADED, UP, "up", 2.0)
    assert health.next_deadline() is None


def test_degraded_at_start_and_down_from_degraded() -> None:
    health = NicHealth(VERBS, HOLD)
    health.update_link(GOOD, 0.0)
    assert health.update_port(PORT_INIT, 0.0) == Transition(
        "mlx5_0", UNSPEC, DEGRADED, "port_not_active", 0.0
    )
    assert health.update_link(NO_CARRIER, 1.0) == Transition("mlx5_0", DEGRADED, DOWN, "carrier_lost", 1.0)


def test_recovery_into_a_not_active_port_ends_degraded_after_hold() -> None:
    health = up_nic(VERBS)
    health.update_link(NO_CARRIER, 1.0)
    health.update_port(PORT_INIT, 1.0)
    assert health.update_link(GOOD, 2.0) is None
    assert health.tick(4.0) == Transition("mlx5_0", DOWN, DEGRADED, "port_not_active", 4.0)


def test_hold_down_expires_exactly_at_the_deadline() -> None:
    health = up_nic()
    health.update_link(NO_CARRIER, 10.0)
    assert health.update_link(GOOD, 11.0) is None
    assert health.next_deadline() == 13.0
    assert health.tick(12.999) is None
    assert health.state is DOWN
    assert health.tick(13.0) == Transition("tcp0", DOWN, UP, "recovered", 13.0)
    assert health.next_deadline() is None


def test_late_tick_and_late_update_both_complete_the_hold() -> None:
    health = up_nic()
    health.update_link(NO_CARRIER, 0.0)
    health.update_link(GOOD, 1.0)
    assert health.tick(50.0) == Transition("tcp0", DOWN, UP, "recovered", 50.0)

    other = up_nic()
    other.update_link(NO_CARRIER, 0.0)
    other.update_link(GOOD, 1.0)
    changed = other.update_link(replace(GOOD, addresses=("198.18.0.9",)), 3.5)
    assert changed == Transition("tcp0", DOWN, UP, "recovered", 3.5)


def test_flapping_link_stays_down_and_each_bounce_restarts_the_hold() -> None:
    health = up_nic(damping=NO_DAMPING)  # the hold-down alone (test_damping.py: the penalty on top)
    transitions = []
    now = 1.0
    for _ in range(5):  # bounces every 0.5 s, shorter than the hold
        transitions.append(health.update_link(NO_CARRIER, now))
        transitions.append(health.update_link(GOOD, now + 0.25))
        transitions.append(health.tick(now + 0.5))
        now += 0.5
    changes = [t for t in transitions if t is not None]
    relapses = [Transition("tcp0", DOWN, DOWN, "carrier_lost", 1.0 + 0.5 * i) for i in range(1, 5)]
    assert changes == [Transition("tcp0", UP, DOWN, "carrier_lost", 1.0), *relapses]
    assert health.next_deadline() == pytest.approx(now - 0.25 + HOLD)
    assert health.link_events == 10
    assert health.tick(now - 0.25 + HOLD - 0.01) is None
    assert health.tick(now - 0.25 + HOLD) == Transition("tcp0", DOWN, UP, "recovered", now - 0.25 + HOLD)


def test_bounce_during_hold_is_a_relapse_that_cancels_the_deadline() -> None:
    health = up_nic()
    health.update_link(NO_CARRIER, 0.0)
    health.update_link(GOOD, 1.0)
    assert health.reason == "hold_down"
    assert health.update_link(ADMIN_DOWN, 2.0) == Transition("tcp0", DOWN, DOWN, "admin_down", 2.0)
    assert (health.state, health.reason, health.next_deadline()) == (DOWN, "admin_down", None)
    assert health.update_link(NO_CARRIER, 2.5) is None  # still broken: no relapse without the hold
    assert health.tick(3.5) is None
    assert health.state is DOWN


def test_zero_hold_recovers_at_once() -> None:
    health = NicHealth(TCP, 0.0)
    health.update_link(NO_CARRIER, 0.0)
    assert health.update_link(GOOD, 1.0) == Transition("tcp0", DOWN, UP, "recovered", 1.0)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        (FaultMode.DOWN, "operator_down"),
        (FaultMode.BLACKHOLE, "operator_blackhole"),
        (FaultMode.FLAP, "operator_flap"),
    ],
)
def test_an_out_of_service_fault_forces_down(fault: FaultMode, reason: str) -> None:
    health = up_nic()
    assert health.set_fault(fault, 1.0) == Transition("tcp0", UP, DOWN, reason, 1.0)
    assert health.fault is fault


@pytest.mark.parametrize(
    ("fault", "reason"), [(FaultMode.LOSSY, "operator_lossy"), (FaultMode.SLOW, "operator_slow")]
)
def test_a_gray_fault_degrades_and_its_clear_is_up_again_without_hold(fault: FaultMode, reason: str) -> None:
    health = up_nic(VERBS)
    assert health.set_fault(fault, 1.0) == Transition("mlx5_0", UP, DEGRADED, reason, 1.0)
    assert health.next_deadline() is None
    assert health.update_link(NO_CARRIER, 2.0) == Transition("mlx5_0", DEGRADED, DOWN, "carrier_lost", 2.0)
    health.update_link(GOOD, 3.0)
    assert health.tick(3.0 + HOLD) == Transition("mlx5_0", DOWN, DEGRADED, reason, 3.0 + HOLD)
    assert health.set_fault(FaultMode.NONE, 6.0) == Transition("mlx5_0", DEGRADED, UP, "up", 6.0)


def test_a_gray_fault_is_named_before_a_port_that_is_not_active() -> None:
    health = up_nic(VERBS)
    health.update_port(PORT_INIT, 1.0)
    assert health.reason == "port_not_active"
    moved = health.set_fault(FaultMode.SLOW, 2.0)  # DEGRADED already: a new cause is a transition too
    assert moved is not None and (moved.previous, moved.state, moved.reason) == (
        DEGRADED,
        DEGRADED,
        "operator_slow",
    )
    assert (health.state, health.reason) == (DEGRADED, "operator_slow")


def test_fault_over_a_flapping_link_holds_down_with_the_operator_reason() -> None:
    health = up_nic()
    assert health.set_fault(FaultMode.FLAP, 1.0) is not None
    for step in range(6):
        link = GOOD if step % 2 else NO_CARRIER
        assert health.update_link(link, 1.0 + step) is None
        assert health.tick(1.0 + step + 0.5) is None
        assert (health.state, health.reason) == (DOWN, "operator_flap")
        assert health.next_deadline() is None
    # cleared while the link is up: the hold starts at the clear, not earlier
    assert health.set_fault(FaultMode.NONE, 10.0) is None
    assert health.reason == "hold_down"
    assert health.next_deadline() == 12.0
    assert health.tick(12.0) == Transition("tcp0", DOWN, UP, "recovered", 12.0)


def test_fault_cleared_while_the_link_is_still_down_stays_down_for_the_link() -> None:
    health = up_nic()
    health.set_fault(FaultMode.DOWN, 1.0)
    health.update_link(ADMIN_DOWN, 1.001)
    assert health.reason == "operator_down"
    assert health.set_fault(FaultMode.NONE, 5.0) is None
    assert (health.state, health.reason) == (DOWN, "admin_down")
    assert health.next_deadline() is None
    assert health.update_link(GOOD, 6.0) is None
    assert health.tick(8.0) == Transition("tcp0", DOWN, UP, "recovered", 8.0)


def test_device_removed_and_added_back() -> None:
    health = up_nic(VERBS)
    assert health.set_present(False, 1.0) == Transition("mlx5_0", UP, DOWN, "device_removed", 1.0)
    # the netdev vanishing too does not hide that the device itself is gone
    assert health.update_link(replace(GONE, netdev="ens1f0np0"), 1.1) is None
    assert health.reason == "device_removed"
    assert health.set_present(True, 2.0) is None
    assert health.reason == "netdev_removed"
    health.update_link(GOOD, 3.0)
    assert health.tick(5.0) == Transition("mlx5_0", DOWN, UP, "recovered", 5.0)


def test_link_events_count_usable_flips_only() -> None:
    health = up_nic()
    health.update_link(replace(GOOD, addresses=()), 1.0)  # address change: not a link event
    health.update_link(NO_CARRIER, 2.0)
    health.update_link(ADMIN_DOWN, 3.0)  # still unusable: not a new event
    health.update_link(GOOD, 4.0)
    assert health.link_events == 2
    assert health.link == GOOD
    assert health.last_change == 2.0


INPUTS = st.one_of(
    st.tuples(st.just("link"), st.sampled_from([GOOD, NO_CARRIER, ADMIN_DOWN, GONE])),
    st.tuples(st.just("port"), st.sampled_from([ACTIVE, PORT_DOWN, PORT_INIT])),
    st.tuples(st.just("present"), st.booleans()),
    st.tuples(st.just("fault"), st.sampled_from(list(FaultMode))),
    st.tuples(st.just("tick"), st.none()),
)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0]) | st.floats(0, 3), INPUTS), max_size=60))
def test_invariants_over_any_sequence(steps: list[tuple[float, tuple[str, object]]]) -> None:
    """DOWN whenever anything is wrong; never UP/DEGRADED sooner than the hold after being DOWN
    and last wrong; transitions are exactly the state changes, the relapses (a new problem during the
    hold-down) and a DEGRADED NIC's new cause. Without damping, which test_damping.py's property adds."""
    health = up_nic(VERBS, damping=NO_DAMPING)  # most sequences that matter start from a working NIC
    feed = {
        "link": health.update_link,
        "port": health.update_port,
        "present": health.set_present,
        "fault": health.set_fault,
    }
    now, state, usable_since, was_down = 0.0, UP, 0.0, False
    last: dict[str, object] = {"present": True, "fault": FaultMode.NONE, "link": GOOD, "port": ACTIVE}
    for gap, (kind, value) in steps:
        now += gap
        last[kind] = value
        held, reason = health.reason == "hold_down", health.reason
        transition = health.tick(now) if kind == "tick" else feed[kind](value, now)
        if transition is not None:
            assert (transition.previous, transition.state, transition.at) == (state, health.state, now)
            assert transition.reason == health.reason
        relapse = held and health.state is DOWN and health.reason != "hold_down"
        regraded = state is health.state is DEGRADED and health.reason != reason
        assert (health.state is not state or relapse or regraded) == (transition is not None)
        state = health.state
        link, port = last.get("link"), last.get("port")
        wrong = (
            last["fault"] in FAULT_REASONS
            or last["present"] is False
            or (isinstance(link, LinkStatus) and not link.usable)
            or (isinstance(port, PortStatus) and port.state == "DOWN")
        )
        if wrong:
            assert state is DOWN
            usable_since = math.inf
        elif usable_since == math.inf:
            usable_since = now
        was_down = was_down or state is DOWN
        if was_down and state in (UP, DEGRADED):
            assert now >= usable_since + HOLD
        deadline = health.next_deadline()
        assert deadline is None or (state is DOWN and deadline == usable_since + HOLD)
