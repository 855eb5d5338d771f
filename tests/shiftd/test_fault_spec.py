"""A fault's parameters: what a user may write for a loss and a rate, and which faults cannot be."""

from __future__ import annotations

import math

import pytest

from shiftd.fault_spec import Fault, FaultSpecError, format_rate, parse_loss, parse_rate
from shiftd.nic import FaultMode


@pytest.mark.parametrize(("text", "percent"), [("5%", 5.0), ("0.5%", 0.5), ("5", 5.0), (" 12.25 % ", 12.25)])
def test_a_loss_is_a_percentage(text: str, percent: float) -> None:
    assert parse_loss(text) == percent


@pytest.mark.parametrize("text", ["", "%", "five", "-5%", "5%%", "1e-3", "nan", "5 percent"])
def test_anything_else_is_not_a_loss(text: str) -> None:
    with pytest.raises(FaultSpecError, match=r"^loss '.*' is not a percentage \(e\.g\. 5% or 0\.5%\)$"):
        parse_loss(text)


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("100mbit", 10**8),
        ("100Mbit", 10**8),
        ("2.5gbit", 25 * 10**8),
        ("512kbit", 512_000),
        ("8000bit", 8000),
    ],
)
def test_a_rate_is_in_tcs_bit_units(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["100", "100mbps", "100MB", "100 mb", "fast", "-1mbit", "1e9bit"])
def test_anything_else_is_not_a_rate(text: str) -> None:
    """A bare number or "bps" would be bytes per second to tc: refused, never misread."""
    with pytest.raises(FaultSpecError, match=r"^rate '.*' is not in bits per second \(e\.g\. 100mbit"):
        parse_rate(text)


@pytest.mark.parametrize(
    ("bits", "text"), [(10**8, "100mbit"), (25 * 10**8, "2500mbit"), (1234, "1234bit"), (0, "0bit")]
)
def test_a_rate_is_written_in_the_largest_exact_unit(bits: int, text: str) -> None:
    assert format_rate(bits) == text
    assert bits == 0 or parse_rate(text) == bits


LOSSY, SLOW, FLAP = FaultMode.LOSSY, FaultMode.SLOW, FaultMode.FLAP


@pytest.mark.parametrize(
    ("mode", "given", "message"),
    [
        (LOSSY, {}, "loss must be greater than 0% and less than 100% (for 100%, mode blackhole), not 0%"),
        (LOSSY, {"loss_percent": 100.0}, "less than 100% (for 100%, mode blackhole), not 100%"),
        (LOSSY, {"loss_percent": math.nan}, "not nan%"),
        (SLOW, {}, "rate must be from 1kbit to 10tbit, not 0bit"),
        (SLOW, {"rate_bits": 999}, "not 999bit"),
        (SLOW, {"rate_bits": 2 * 10**13}, "not 20tbit"),
        (FLAP, {"period": 0.0}, "flap period must be greater than 0 and at most 3600 s, not 0"),
        (FLAP, {"period": -1.0}, "not -1"),
        (FLAP, {"period": 3601.0}, "not 3601"),
        (FaultMode.DOWN, {"loss_percent": 5.0}, "a loss is for mode lossy only, not down"),
        (LOSSY, {"loss_percent": 5.0, "rate_bits": 10**8}, "a rate is for mode slow only, not lossy"),
        (FaultMode.BLACKHOLE, {"period": 1.0}, "a flap period is for mode flap only, not blackhole"),
    ],
)
def test_a_fault_that_cannot_be_is_refused_in_one_line(mode: FaultMode, given: dict, message: str) -> None:
    with pytest.raises(FaultSpecError) as refused:
        Fault(mode, **given)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("fault", "described"),
    [
        (Fault(FaultMode.DOWN), "down"),
        (Fault(FLAP, period=0.4), "flap"),
        (Fault(LOSSY, loss_percent=5.0), "lossy 5%"),
        (Fault(SLOW, rate_bits=10**8), "slow 100mbit"),
        (Fault(SLOW, rate_bits=1000), "slow 1kbit"),
    ],
)
def test_a_sound_fault_says_what_it_is(fault: Fault, described: str) -> None:
    assert fault.describe() == described


def test_a_mode_given_as_the_requests_int_becomes_a_fault_mode() -> None:
    fault = Fault(4, loss_percent=1.0)  # type: ignore[arg-type]
    assert fault.mode is FaultMode.LOSSY and fault == Fault(FaultMode.LOSSY, loss_percent=1.0)
