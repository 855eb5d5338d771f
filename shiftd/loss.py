"""Whether a NIC's traffic is being lost: the judge of one NIC's TCP retransmissions (a degraded path).

A link that drops a few percent of its packets keeps its carrier and its port; what shows it is the
transport retransmitting. The tcp_loss monitor counts, every poll, the data segments the NIC's TCP
connections sent and how many of them were retransmissions; this judge turns those counts into a verdict:

- degraded once a window of `window_seconds` holds at least `min_segments` segments of which
  `enter_percent` or more were retransmitted. The floor keeps a trickle of traffic from deciding on a
  handful of segments; a loaded but healthy link retransmits next to nothing, so the threshold is far above
  what congestion costs;
- healthy again once `hold_seconds` have passed since the last window at or above `exit_percent`, with
  the damper's back-off (verdict.py: the hysteresis both judges share).

Pure like the health machine that owns it: every call carries `now`.
"""

from __future__ import annotations

from collections import deque

from shiftd.config import DampingConfig, LossConfig
from shiftd.verdict import Judge

REASON = "retransmits"


class LossJudge(Judge):
    def __init__(self, config: LossConfig, damping: DampingConfig) -> None:
        super().__init__(config.hold_seconds, damping)
        self.config = config
        self.loss_percent: float | None = None  # the last full window's figure; None without enough segments
        self._samples: deque[tuple[float, int, int]] = deque()  # (now, segments, retransmitted)

    def add(self, now: float, segments: int, retransmitted: int) -> bool:
        """One poll's counts (what was sent since the last poll); whether the verdict changed."""
        self._samples.append((now, segments, retransmitted))
        while self._samples[0][0] <= now - self.config.window_seconds:
            self._samples.popleft()
        sent = sum(s for _, s, _ in self._samples)
        lost = sum(r for _, _, r in self._samples)
        self.loss_percent = loss = 100.0 * lost / sent if sent >= self.config.min_segments else None
        if loss is None:
            return self.verdict.judge(now, False, False, False)
        return self.verdict.judge(
            now, True, loss >= self.config.enter_percent, loss >= self.config.exit_percent
        )
