"""A judge's verdict on a NIC's traffic, with hysteresis and a back-off: what the loss and speed judges share.

A window of evidence either crosses the judge's threshold for DEGRADED (`entered`), or stays on the wrong
side of its lower threshold for healthy (`unclean`), or neither; a window without enough evidence says
nothing. Once degraded, the verdict holds until `hold_seconds` have passed since the last unclean window,
so it does not flap around one threshold: when the traffic has moved off the NIC no evidence comes, the
verdict clears after the hold, the traffic comes home and a path still bad is judged again. Each verdict of
degraded is a flap for a damper of its own (damping.py), so a NIC found bad again and again stays out
longer each time: its return is retried with a back-off, for as long as it takes.
"""

from __future__ import annotations

from shiftd.config import DampingConfig
from shiftd.damping import FlapDamper


class Verdict:
    def __init__(self, hold_seconds: float, damping: DampingConfig) -> None:
        self.hold_seconds = hold_seconds
        self.damper = FlapDamper(damping)
        self.degraded = False
        self._last_unclean = 0.0

    def judge(self, now: float, evidence: bool, entered: bool, unclean: bool) -> bool:
        """One window's word (`entered` and `unclean` mean something only with `evidence`); whether the
        verdict changed."""
        was = self.degraded
        if evidence and unclean:
            self._last_unclean = now
        if not self.degraded and evidence:
            self.degraded = entered
            if self.degraded:
                self.damper.flap(now)
        elif self.degraded:
            self.degraded = now < max(self._last_unclean + self.hold_seconds, self.damper.release(now) or 0.0)
        return self.degraded != was


class Judge:
    """A judge of one NIC's traffic (loss.py, slow.py): its verdict, fed by the judge's own windows."""

    def __init__(self, hold_seconds: float, damping: DampingConfig) -> None:
        self.verdict = Verdict(hold_seconds, damping)

    @property
    def degraded(self) -> bool:
        return self.verdict.degraded
