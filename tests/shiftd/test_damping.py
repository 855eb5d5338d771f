"""Flap damping's arithmetic on a fake clock (RFC 2439's: decay by half-life, suppress above a threshold,
reuse below another, a ceiling that bounds the hold), then the health machine that applies it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shiftd.config import DampingConfig
from shiftd.damping import FlapDamper
from shiftd.health import NicHealth, Transition
from shiftd.nic import FaultMode, LinkStatus, NicSpec, NicState

# half-life 10 s, max suppress 40 s: ceiling 750 x 2^4 = 12000
DAMPING = DampingConfig(
    penalty=1000, suppress_threshold=2000, reuse_threshold=750, half_life_seconds=10, max_suppress_seconds=40
)
HOLD = 2.0
TCP = NicSpec("tcp0", "veth0", "tcp")
GOOD = LinkStatus("veth0", present=True, admin_up=True, operstate="up", carrier=True)
NO_CARRIER = replace(GOOD, carrier=False, operstate="lowerlayerdown")
UP, DOWN = NicState.UP, NicState.DOWN


def release_after(penalty: float) -> float:
    """Seconds for `penalty` to decay to DAMPING's reuse threshold."""
    return 10 * math.log2(penalty / 750)


def test_the_penalty_halves_every_half_life() -> None:
    damper = FlapDamper(DAMPING)
    assert damper.penalty(0.0) == 0
    damper.flap(100.0)
    assert damper.penalty(100.0) == 1000
    assert damper.penalty(105.0) == pytest.approx(1000 / math.sqrt(2))
    assert damper.penalty(110.0) == pytest.approx(500)
    assert damper.penalty(130.0) == pytest.approx(125)
    damper.flap(110.0)  # adds to what is left
    assert damper.penalty(110.0) == pytest.approx(1500)


def test_two_quick_flaps_stay_below_the_threshold_the_third_suppresses() -> None:
    damper = FlapDamper(DAMPING)
    damper.flap(0.0)
    damper.flap(1.0)
    assert damper.penalty(1.0) == pytest.approx(1000 * 2**-0.1 + 1000)  # 1933: not above 2000
    assert not damper.suppressed(1.0) and damper.release(1.0) is None
    damper.flap(2.0)
    third = 1000 * 2**-0.2 + 1000 * 2**-0.1 + 1000
    assert damper.penalty(2.0) == pytest.approx(third)
    assert damper.suppressed(2.0)
    assert damper.release(2.0) == pytest.approx(2.0 + release_after(third))


def test_suppressed_until_the_penalty_is_down_to_reuse_not_merely_below_suppress() -> None:
    damper = FlapDamper(DAMPING)
    for t in (0.0, 0.1, 0.2):
        damper.flap(t)
    release = damper.release(0.2)
    assert release is not None
    halfway = 0.2 + release_after(damper.penalty(0.2) / 1500 * 750)  # when the penalty is 1500
    assert damper.penalty(halfway) == pytest.approx(1500)
    assert damper.suppressed(halfway)  # below suppress, above reuse: still out
    assert damper.penalty(release) == pytest.approx(750)
    assert damper.suppressed(release - 1e-6) and not damper.suppressed(release)
    assert damper.release(release) is None


def test_after_reuse_it_takes_the_suppress_threshold_again_not_the_reuse_one() -> None:
    """Hysteresis: released at 750, one flap makes 1750, which is above reuse but not above suppress."""
    damper = FlapDamper(DAMPING)
    for t in (0.0, 0.1, 0.2):
        damper.flap(t)
    released = damper.release(0.2)
    assert released is not None
    damper.flap(released)
    assert damper.penalty(released) == pytest.approx(1750)
    assert not damper.suppressed(released)


def test_a_flap_while_suppressed_keeps_it_suppressed_even_below_the_threshold() -> None:
    damper = FlapDamper(DAMPING)
    for t in (0.0, 0.1, 0.2):
        damper.flap(t)
    late = 0.2 + release_after(damper.penalty(0.2) / 800 * 750)  # the penalty is 800: still suppressed
    assert damper.suppressed(late)
    damper.flap(late)
    assert damper.penalty(late) == pytest.approx(1800)
    assert damper.release(late) == pytest.approx(late + release_after(1800))


def test_the_ceiling_holds_a_nic_that_flapped_all_afternoon_max_suppress_after_its_last_flap() -> None:
    damper = FlapDamper(DAMPING)
    for second in range(4 * 3600):  # once a second for four hours
        damper.flap(float(second))
    last = 4 * 3600 - 1.0
    assert damper.penalty(last) == DAMPING.ceiling == 12000
    assert damper.release(last) == pytest.approx(last + DAMPING.max_suppress_seconds)


def test_penalty_zero_is_no_damping() -> None:
    damper = FlapDamper(replace(DAMPING, penalty=0))
    for t in range(100):
        damper.flap(t * 0.01)
    assert damper.penalty(1.0) == 0 and damper.release(1.0) is None


# --- the health machine with a damper ------------------------------------------------------------


def up_nic() -> NicHealth:
    health = NicHealth(TCP, HOLD, DAMPING)
    health.update_link(GOOD, 0.0)
    assert health.state is UP
    return health


def bounce(health: NicHealth, times: int, start: float, every: float = 0.2) -> float:
    """The link goes down and, every/2 later, up again, `times` times; returns when it was last back."""
    back = start
    for i in range(times):
        health.update_link(NO_CARRIER, start + i * every)
        back = start + i * every + every / 2
        health.update_link(GOOD, back)
    return back


def test_one_bounce_is_back_after_the_hold_down_alone() -> None:
    health = up_nic()
    back = bounce(health, 1, 10.0)
    assert health.reason == "hold_down"
    assert health.next_deadline() == back + HOLD
    assert health.tick(back + HOLD) == Transition("tcp0", DOWN, UP, "recovered", back + HOLD)
    assert health.damper.penalty(back) == pytest.approx(1000 * 2**-0.01)


def test_a_nic_that_keeps_flapping_stays_down_until_its_penalty_is_down_to_reuse() -> None:
    health = up_nic()
    back = bounce(health, 5, 10.0)
    penalty = health.damper.penalty(back)
    assert penalty > DAMPING.suppress_threshold
    assert (health.state, health.reason) == (DOWN, "flap_damped")
    released = back + release_after(penalty)
    assert health.next_deadline() == pytest.approx(released)
    assert released - back > 4 * HOLD  # far longer out than after one bounce
    assert health.tick(released - 0.01) is None
    assert health.reason == "flap_damped"
    assert health.tick(released) == Transition("tcp0", DOWN, UP, "recovered", released)


def test_a_bounce_while_damped_is_a_relapse_and_extends_the_suppression() -> None:
    health = up_nic()
    back = bounce(health, 3, 10.0)
    first = health.next_deadline()
    assert health.reason == "flap_damped" and first is not None
    relapse = health.update_link(NO_CARRIER, back + 1.0)
    assert relapse == Transition("tcp0", DOWN, DOWN, "carrier_lost", back + 1.0)
    health.update_link(GOOD, back + 1.1)
    second = health.next_deadline()
    assert second is not None and second > first


def test_the_hold_down_still_counts_when_the_suppression_ends_sooner() -> None:
    """Released by its penalty a moment after the link came back: the hold-down is the longer wait."""
    health = up_nic()
    bounce(health, 3, 10.0)
    release = health.damper.release(10.5)
    assert release is not None
    health.update_link(NO_CARRIER, release - 1.0)  # a flap while suppressed: the release moves on
    late = health.damper.release(release - 1.0)
    assert late is not None
    health.update_link(GOOD, late - 0.5)
    assert health.next_deadline() == pytest.approx(late - 0.5 + HOLD)
    assert health.reason == "flap_damped"
    assert health.tick(late) is None and health.reason == "hold_down"


@pytest.mark.parametrize("fault", [FaultMode.DOWN, FaultMode.FLAP, FaultMode.BLACKHOLE])
def test_what_an_operators_fault_does_to_the_link_adds_no_penalty(fault: FaultMode) -> None:
    health = up_nic()
    health.set_fault(fault, 1.0)
    for step in range(10):  # the link follows the operator's fault
        health.update_link(NO_CARRIER if step % 2 == 0 else GOOD, 1.1 + step * 0.1)
    health.update_link(GOOD, 3.0)
    health.set_fault(FaultMode.NONE, 3.1)
    assert health.damper.penalty(3.1) == 0
    assert health.reason == "hold_down"
    assert health.tick(3.1 + HOLD) == Transition("tcp0", DOWN, UP, "recovered", 3.1 + HOLD)


def test_a_nic_that_starts_without_carrier_has_not_flapped() -> None:
    health = NicHealth(TCP, HOLD, DAMPING)
    health.update_link(NO_CARRIER, 0.0)
    health.update_link(GOOD, 1.0)
    assert health.damper.penalty(1.0) == 0


# bursts of bounces (n, seconds apart) and quiet spells, some longer than max_suppress_seconds
EVENTS = st.one_of(
    st.tuples(st.just("bounces"), st.integers(1, 8), st.sampled_from([0.05, 0.3, 2.0]) | st.floats(0, 5)),
    st.tuples(st.just("quiet"), st.just(0), st.sampled_from([1.0, 15.0, 45.0]) | st.floats(0, 120)),
)


def link_steps(events: list[tuple[str, int, float]]) -> list[tuple[float, str]]:
    """(gap, input) pairs: a bounce is NO_CARRIER then GOOD half a gap later; quiet is a tick."""
    steps = []
    for kind, times, gap in events:
        steps += (
            [(gap / 2, "no_carrier"), (gap / 2, "good")] * times if kind == "bounces" else [(gap, "tick")]
        )
    return steps


@settings(max_examples=200, deadline=None)  # a few hundred steps each: no deadline on a shared machine
@given(st.lists(EVENTS, max_size=12))
def test_damping_only_ever_delays_and_never_past_max_suppress(events: list[tuple[str, int, float]]) -> None:
    """Fed the same link changes as a twin without damping, the damped machine is UP only when the twin
    is; never holds past both the hold-down and max_suppress_seconds after the last flap; and its
    penalty never passes the ceiling."""
    damped, plain = up_nic(), NicHealth(TCP, HOLD, replace(DAMPING, penalty=0))
    plain.update_link(GOOD, 0.0)
    now, last_flap, usable_since = 0.0, -math.inf, 0.0
    for gap, kind in link_steps(events):
        now += gap
        for health in (damped, plain):
            if kind == "tick":
                health.tick(now)
            else:
                health.update_link(GOOD if kind == "good" else NO_CARRIER, now)
        if kind == "no_carrier":
            last_flap = now
        elif kind == "good":
            usable_since = now
        assert damped.damper.penalty(now) <= DAMPING.ceiling
        if damped.state is UP:
            assert plain.state is UP
        quiet = now > last_flap + DAMPING.max_suppress_seconds + 1e-6
        if kind == "tick" and now > usable_since + HOLD + 1e-6 and quiet:
            assert damped.state is UP, (damped.reason, damped.next_deadline())
