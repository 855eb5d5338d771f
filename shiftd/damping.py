"""Flap damping that learns, after BGP's route-flap damping (RFC 2439), for one NIC.

Each flap (the NIC's own link or port going from usable to unusable) adds `penalty` to a figure that
halves every `half_life_seconds`. When a flap takes it above `suppress_threshold`, the NIC is suppressed:
once its link is back it stays DOWN until the figure has decayed to `reuse_threshold`. The figure never
exceeds reuse * 2^(max_suppress / half_life), so a NIC that has gone quiet is suppressed at most
`max_suppress_seconds` after its last flap, however long it bounced before. One bounce (one penalty,
below the threshold) costs nothing beyond the health machine's fixed hold-down.

Pure like the health machine that owns it: every call carries `now`, and the release time is computed,
not polled for, so the machine can set its timer at it.
"""

from __future__ import annotations

import math

from shiftd.config import DampingConfig


class FlapDamper:
    def __init__(self, config: DampingConfig) -> None:
        self.config = config
        self._penalty = 0.0  # as it was at _since
        self._since = 0.0
        self._release: float | None = None  # while suppressed: when the penalty decays to reuse

    def penalty(self, now: float) -> float:
        """The penalty at `now`, decayed since the last flap."""
        return self._penalty * 2 ** (-max(0.0, now - self._since) / self.config.half_life_seconds)

    def flap(self, now: float) -> None:
        was_suppressed = self.suppressed(now)
        self._penalty, self._since = min(self.penalty(now) + self.config.penalty, self.config.ceiling), now
        if was_suppressed or self._penalty > self.config.suppress_threshold:
            decay = self.config.half_life_seconds * math.log2(self._penalty / self.config.reuse_threshold)
            self._release = now + decay
        else:
            self._release = None

    def suppressed(self, now: float) -> bool:
        return self._release is not None and now < self._release

    def release(self, now: float) -> float | None:
        """When a suppressed NIC may come back (the penalty is down to reuse), or None if it is not."""
        return self._release if self.suppressed(now) else None
