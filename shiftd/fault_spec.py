"""What an operator's fault is: its mode and the one parameter the mode takes, checked in one place.

shiftctl turns what a user writes into numbers (parse_loss, parse_rate) and builds a Fault before it
calls shiftd, so a mistake is one line without a round trip; the Admin service builds the same Fault
from any client's request; the injector applies a Fault that is known to be sound. The messages name
no field or flag, because both the CLI's users and gRPC clients read them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shiftd.nic import FaultMode

MAX_FLAP_PERIOD = 3600.0
MIN_RATE, MAX_RATE = 1_000, 10**13  # bits per second: 1kbit to 10tbit
# tc's decimal prefixes; "bps" is bytes per second to tc, so only "bit" is accepted, never mistaken
RATE_PREFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
RATE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)bit", re.IGNORECASE)
LOSS_RE = re.compile(r"(\d+(?:\.\d+)?)\s*%?")


class FaultSpecError(ValueError):
    """A fault that cannot be: a parameter out of range or given to the wrong mode; one line."""


@dataclass(frozen=True)
class Fault:
    mode: FaultMode
    period: float | None = None  # FLAP: seconds of one down-and-up cycle; None: the injector's default
    loss_percent: float = 0.0  # LOSSY: the chance that a packet, in either direction, is dropped
    rate_bits: int = 0  # SLOW: what the NIC may send, in bits per second

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", FaultMode(self.mode))  # a request's int is a FaultMode from here on
        mode = self.mode
        given = {
            FaultMode.FLAP: ("a flap period", self.period is not None),
            FaultMode.LOSSY: ("a loss", self.loss_percent != 0),
            FaultMode.SLOW: ("a rate", self.rate_bits != 0),
        }
        for owner, (what, present) in given.items():
            if present and mode != owner:
                raise FaultSpecError(f"{what} is for mode {owner.name.lower()} only, not {mode.name.lower()}")
        if self.period is not None and not 0 < self.period <= MAX_FLAP_PERIOD:  # also refuses NaN
            raise FaultSpecError(
                f"flap period must be greater than 0 and at most {MAX_FLAP_PERIOD:g} s, not {self.period:g}"
            )
        if mode == FaultMode.LOSSY and not 0 < self.loss_percent < 100:
            raise FaultSpecError(
                f"loss must be greater than 0% and less than 100% (for 100%, mode blackhole), "
                f"not {self.loss_percent:g}%"
            )
        if mode == FaultMode.SLOW and not MIN_RATE <= self.rate_bits <= MAX_RATE:
            raise FaultSpecError(
                f"rate must be from {format_rate(MIN_RATE)} to {format_rate(MAX_RATE)}, "
                f"not {format_rate(self.rate_bits)}"
            )

    def describe(self) -> str:
        """The fault as an operator writes it: "down", "flap", "lossy 5%", "slow 100mbit"."""
        name = self.mode.name.lower()
        if self.mode == FaultMode.LOSSY:
            return f"{name} {self.loss_percent:g}%"
        if self.mode == FaultMode.SLOW:
            return f"{name} {format_rate(self.rate_bits)}"
        return name


def parse_loss(text: str) -> float:
    """A percentage as a user writes it: "5%", "0.5%" or "5"."""
    match = LOSS_RE.fullmatch(text.strip())
    if match is None:
        raise FaultSpecError(f"loss {text!r} is not a percentage (e.g. 5% or 0.5%)")
    return float(match.group(1))


def parse_rate(text: str) -> int:
    """A rate in tc's bit units, as a user writes it: "100mbit", "2.5gbit", "512kbit"."""
    match = RATE_RE.fullmatch(text.strip())
    if match is None:
        raise FaultSpecError(
            f"rate {text!r} is not in bits per second (e.g. 100mbit or 2.5gbit; units bit, kbit, mbit, gbit, "
            "tbit)"
        )
    return round(float(match.group(1)) * RATE_PREFIXES[match.group(2).lower()])


def format_rate(bits: int) -> str:
    """Bits per second in the largest of tc's units that says it exactly: 100000000 -> "100mbit"."""
    for prefix, scale in reversed(RATE_PREFIXES.items()):
        if bits and bits % scale == 0:
            return f"{bits // scale}{prefix}bit"
    return f"{bits}bit"
