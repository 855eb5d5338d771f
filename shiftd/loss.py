"""Whether a NIC's traffic is being lost: the judge of one NIC's TCP retransmissions (a degraded path).

A link that drops a few percent of its packets keeps its carrier and its port; what shows it is the
transport retransmitting. The tcp_loss monitor counts, every poll, the data segments the NIC's TCP
connections sent and how many of them were retransmissions; this judge turns those counts into a verdict:

- degraded once a window of `window_seconds` holds at least `min_segments` segments of which
  `enter_percent` or more were retransmitted. The floor keeps a trickle of traffic from deciding on a
  handful of segments; a loaded but healthy link retransmits next to nothing, so the threshold is far above
  what congestion costs;
- healthy again once `hold_seconds` have passed since the last window at or above `exit_percent` (the
  hysteresis: the verdict does not flap around one threshold), and the learning hold has ended. When the
  traffic has moved off the NIC there is no evidence either way: the verdict then clears after the hold,
  the traffic comes home, and a link still lossy is judged again within a window.
- Each verdict of degraded is a flap for a damper of its own (damping.py), so a NIC found lossy again and
  again stays judged degraded for longer each time: the return is retried with a back-off, for as long as
  it takes.

Pure like the health machine that owns it: every call carries `now`.
"""

from __future__ import annotations

from collections import deque

from shiftd.config import DampingConfig, LossConfig
from shiftd.damping import FlapDamper

REASON = "retransmits"


class LossJudge:
    def __init__(self, config: LossConfig, damping: DampingConfig) -> None:
        self.config = config
        self.damper = FlapDamper(damping)
        self.degraded = False
        self.loss_percent: float | None = None  # the last full window's figure; None without enough segments
        self._samples: deque[tuple[float, int, int]] = deque()  # (now, segments, retransmitted)
        self._last_bad = 0.0

    def add(self, now: float, segments: int, retransmitted: int) -> bool:
        """One poll's counts (what was sent since the last poll); whether the verdict changed."""
        self._samples.append((now, segments, retransmitted))
        while self._samples[0][0] <= now - self.config.window_seconds:
            self._samples.popleft()
        sent = sum(s for _, s, _ in self._samples)
        lost = sum(r for _, _, r in self._samples)
        self.loss_percent = 100.0 * lost / sent if sent >= self.config.min_segments else None
        was = self.degraded
        if self.loss_percent is not None and self.loss_percent >= self.config.exit_percent:
            self._last_bad = now
        if not self.degraded and self.loss_percent is not None:
            self.degraded = self.loss_percent >= self.config.enter_percent
            if self.degraded:
                self.damper.flap(now)
        elif self.degraded:
            self.degraded = now < max(
                self._last_bad + self.config.hold_seconds, self.damper.release(now) or 0.0
            )
        return self.degraded != was
